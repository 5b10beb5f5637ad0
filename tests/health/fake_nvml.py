"""A fake ``pynvml`` module: the subset of NVML's Python API the node agent calls, with the same
names, constants, error class (``NVMLError`` with ``.value``) and return shapes, over GPUs whose
readings a test sets. Xid events are delivered through ``nvmlEventSetWait_v2`` like the real
library (blocking with a timeout, ``NVML_ERROR_TIMEOUT`` when nothing happened)."""

from __future__ import annotations

import queue
import types
from dataclasses import dataclass, field
from typing import Any

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
_NAMES = {3: "Not Supported", 10: "Timeout", 12: "NVML Shared Library Not Found", 15: "GPU is lost"}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _NAMES.get(self.value, f"NVML error {self.value}")


@dataclass
class FakeGpu:
    name: bytes = b"NVIDIA H100 80GB HBM3"      # old bindings return bytes
    uuid: str = "GPU-0"
    used: int = 76 * 1024**3
    total: int = 80 * 1024**3
    util: int = 97
    mem_util: int = 61
    temp: int = 64
    power_mw: int = 612_372
    limit_mw: int = 700_000
    reasons: int = 0x4                            # sw_power_cap
    ecc_uncorrected: int = 0
    ecc_corrected: int = 3
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def make_fake_nvml(gpus: int = 2, *, init_error: int | None = None) -> Any:
    """A module object named ``pynvml`` with ``.gpus`` (list of FakeGpu) and ``.inject_xid()``."""
    m: Any = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_ERROR_NOT_SUPPORTED, m.NVML_ERROR_TIMEOUT = NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_TIMEOUT
    m.NVML_ERROR_GPU_IS_LOST = NVML_ERROR_GPU_IS_LOST
    m.NVML_TEMPERATURE_GPU, m.NVML_VOLATILE_ECC = 0, 0
    m.NVML_MEMORY_ERROR_TYPE_CORRECTED, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    m.nvmlEventTypeXidCriticalError = 0x8
    m.gpus = [FakeGpu(uuid=f"GPU-{i:04d}") for i in range(gpus)]
    handles = [_Handle(i) for i in range(gpus)]
    events: queue.Queue[Any] = queue.Queue()
    m.initialized = False
    m.shutdowns = 0

    def gpu(h: _Handle, what: str) -> FakeGpu:
        g: FakeGpu = m.gpus[h.index]
        if g.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if what in g.unsupported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return g

    def init() -> None:
        if init_error is not None:
            raise NVMLError(init_error)
        m.initialized = True

    def shutdown() -> None:
        m.shutdowns += 1

    def wait(event_set: Any, timeout_ms: int) -> Any:
        try:
            return events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise NVMLError(NVML_ERROR_TIMEOUT) from None

    m.nvmlInit = init
    m.nvmlShutdown = shutdown
    m.nvmlSystemGetDriverVersion = lambda: "550.90.07"
    m.nvmlDeviceGetCount = lambda: len(handles)
    m.nvmlDeviceGetHandleByIndex = lambda i: handles[i]
    m.nvmlDeviceGetName = lambda h: gpu(h, "name").name
    m.nvmlDeviceGetUUID = lambda h: m.gpus[h.index].uuid
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(
        used=gpu(h, "memory").used, total=gpu(h, "memory").total, free=gpu(h, "memory").total - gpu(h, "memory").used)
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=gpu(h, "util").util,
                                                                       memory=gpu(h, "util").mem_util)
    m.nvmlDeviceGetTemperature = lambda h, sensor: gpu(h, "temperature").temp
    m.nvmlDeviceGetPowerUsage = lambda h: gpu(h, "power").power_mw
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: gpu(h, "power").limit_mw
    m.nvmlDeviceGetCurrentClocksEventReasons = lambda h: gpu(h, "reasons").reasons
    m.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: (
        gpu(h, "ecc").ecc_uncorrected if kind == 1 else gpu(h, "ecc").ecc_corrected)
    m.nvmlEventSetCreate = lambda: object()
    m.nvmlDeviceRegisterEvents = lambda h, types_, es: None
    m.nvmlEventSetWait_v2 = wait
    m.nvmlEventSetFree = lambda es: None

    def inject_xid(index: int, xid: int) -> None:
        events.put(types.SimpleNamespace(device=handles[index], eventType=0x8, eventData=xid))

    m.inject_xid = inject_xid
    return m
