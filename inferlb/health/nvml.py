"""GPU readings through NVML (the ``pynvml`` module of the ``nvidia-ml-py`` package).

Contract:

* :class:`NvmlReader` takes a *loader* returning the NVML binding module (default: import
  ``pynvml``); tests inject a fake module with the same API. Nothing here raises for a missing
  library, driver or GPU: :meth:`NvmlReader.open` records ``available=False`` and the ``reason``
  (e.g. ``ModuleNotFoundError: No module named 'pynvml'`` or NVML's own "NVML Shared Library Not
  Found"), and :meth:`read` then returns ``{"nvml": "unavailable", "reason": …}``.
* :meth:`read` (blocking: call it in a worker thread) returns the node-agent report::

      {"agent": "inferlb", "nvml": "ok", "reason": null, "driver_version", "boot_id", "time",
       "gpus": [{"index", "uuid", "name", "memory_used_mib", "memory_total_mib",
                 "utilization_gpu_pct", "utilization_memory_pct", "temperature_c", "power_w",
                 "power_limit_w", "throttle_reasons": [names], "throttle_mask",
                 "ecc_errors": {"corrected", "uncorrected"},          # volatile counts
                 "xid_errors", "xid_last",                             # since this agent started
                 "lost", "unsupported": [fields], "errors": {field: message}}],
       "xid_events": [{"seq", "gpu", "xid", "at"}]}                    # the latest 100

  A field NVML does not support on a GPU is null and listed in ``unsupported``; a GPU that NVML
  reports lost (``NVML_ERROR_GPU_IS_LOST``) has ``lost: true``.
* Xid errors are events in NVML (``nvmlEventTypeXidCriticalError``): :meth:`watch_xids` blocks in
  ``nvmlEventSetWait_v2`` with a short timeout until ``stop`` is set; run it in a thread.
"""

from __future__ import annotations

import collections
import importlib
import threading
import time
import uuid
from collections.abc import Callable
from types import ModuleType
from typing import Any

from inferlb.fleet.gpu import throttle_names

__all__ = ["NvmlReader"]

_MIB = 1024 * 1024


def _default_loader() -> ModuleType:
    return importlib.import_module("pynvml")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlReader:
    def __init__(self, loader: Callable[[], ModuleType] | None = None) -> None:
        self._loader = loader or _default_loader
        self.nv: Any = None
        self.available = False
        self.reason: str | None = "not opened"
        self.driver_version: str | None = None
        self.boot_id = uuid.uuid4().hex           # a new agent process: Xid counters start again
        self._handles: list[Any] = []
        self._uuids: list[str | None] = []
        self._event_set: Any = None
        self.xid_note: str | None = None
        self._lock = threading.Lock()
        self._seq = 0
        self._xid_count: dict[int, int] = {}
        self._xid_last: dict[int, int] = {}
        self._events: collections.deque[dict[str, Any]] = collections.deque(maxlen=100)

    # ------------------------------------------------------------------ lifecycle

    def open(self) -> None:
        try:
            nv = self._loader()
        except Exception as exc:   # ImportError, or anything a broken binding raises on import
            self.reason = f"{type(exc).__name__}: {exc}"
            return
        try:
            nv.nvmlInit()
            self.driver_version = _text(nv.nvmlSystemGetDriverVersion())
            count = int(nv.nvmlDeviceGetCount())
            handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:   # NVMLError_LibraryNotFound / DriverNotLoaded / NoPermission …
            self.reason = f"{type(exc).__name__}: {exc}"
            return
        self.nv, self._handles = nv, handles
        self._uuids = [self._uuid(h) for h in handles]
        self.available, self.reason = True, None
        try:
            es = nv.nvmlEventSetCreate()
            for h in handles:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
            self._event_set = es
        except Exception as exc:
            self.xid_note = f"Xid events unavailable: {type(exc).__name__}: {exc}"

    def _uuid(self, handle: Any) -> str | None:
        try:
            return _text(self.nv.nvmlDeviceGetUUID(handle))
        except Exception:   # an old GPU without UUID support: identified by index
            return None

    def close(self) -> None:
        nv = self.nv
        if nv is None:
            return
        try:
            if self._event_set is not None:
                nv.nvmlEventSetFree(self._event_set)
            nv.nvmlShutdown()
        except Exception:   # shutting down: nothing left to report it to
            pass
        self.nv, self.available, self._event_set = None, False, None

    # ------------------------------------------------------------------ readings

    def _call(self, fn: Callable[[], Any], field: str, errors: dict[str, str], unsupported: list[str]
              ) -> tuple[Any, bool]:
        """(value or None, lost?). NVML errors become data."""
        nv = self.nv
        try:
            return fn(), False
        except Exception as exc:
            value = getattr(exc, "value", None)
            if nv is not None and value == getattr(nv, "NVML_ERROR_NOT_SUPPORTED", 3):
                unsupported.append(field)
                return None, False
            errors[field] = f"{type(exc).__name__}: {exc}"
            return None, nv is not None and value == getattr(nv, "NVML_ERROR_GPU_IS_LOST", 15)

    def _gpu(self, i: int, h: Any) -> dict[str, Any]:
        nv = self.nv
        errors: dict[str, str] = {}
        unsupported: list[str] = []
        lost = False

        def get(field: str, fn: Callable[[], Any]) -> Any:
            nonlocal lost
            v, gone = self._call(fn, field, errors, unsupported)
            lost = lost or gone
            return v

        mem = get("memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        util = get("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        power = get("power_w", lambda: nv.nvmlDeviceGetPowerUsage(h))
        limit = get("power_limit_w", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        mask = get("throttle_reasons", lambda: reasons_fn(h))
        unc = get("ecc_uncorrected", lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))
        cor = get("ecc_corrected", lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC))
        with self._lock:
            count, last = self._xid_count.get(i, 0), self._xid_last.get(i)
        return {
            "index": i, "uuid": self._uuids[i] if i < len(self._uuids) else None,
            "name": get("name", lambda: _text(nv.nvmlDeviceGetName(h))),
            "memory_used_mib": None if mem is None else round(mem.used / _MIB, 1),
            "memory_total_mib": None if mem is None else round(mem.total / _MIB, 1),
            "utilization_gpu_pct": None if util is None else util.gpu,
            "utilization_memory_pct": None if util is None else util.memory,
            "temperature_c": get("temperature_c", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "power_w": None if power is None else round(power / 1000.0, 1),
            "power_limit_w": None if limit is None else round(limit / 1000.0, 1),
            "throttle_reasons": None if mask is None else throttle_names(int(mask)),
            "throttle_mask": None if mask is None else int(mask),
            "ecc_errors": {"corrected": cor, "uncorrected": unc},
            "xid_errors": count, "xid_last": last, "lost": lost, "unsupported": unsupported, "errors": errors,
        }

    def read(self) -> dict[str, Any]:
        base: dict[str, Any] = {"agent": "inferlb", "boot_id": self.boot_id, "time": round(time.time(), 6)}
        if not self.available:
            return {**base, "nvml": "unavailable", "reason": self.reason, "gpus": [], "xid_events": []}
        gpus = [self._gpu(i, h) for i, h in enumerate(self._handles)]
        with self._lock:
            events = list(self._events)
        return {**base, "nvml": "ok", "reason": None, "driver_version": self.driver_version,
                "xid_note": self.xid_note, "gpus": gpus, "xid_events": events}

    # ------------------------------------------------------------------ Xid events

    def record_xid(self, gpu: int, xid: int) -> None:
        with self._lock:
            self._seq += 1
            self._xid_count[gpu] = self._xid_count.get(gpu, 0) + 1
            self._xid_last[gpu] = xid
            self._events.append({"seq": self._seq, "gpu": gpu, "xid": xid, "at": round(time.time(), 6)})

    def _index_of(self, device: Any) -> int:
        for i, h in enumerate(self._handles):
            if h == device:
                return i
        try:
            dev_uuid = _text(self.nv.nvmlDeviceGetUUID(device))
            return self._uuids.index(dev_uuid)
        except Exception:
            return -1

    def watch_xids(self, stop: threading.Event, timeout_ms: int = 500) -> None:
        """Block collecting Xid events until ``stop`` is set (run in a thread)."""
        nv, es = self.nv, self._event_set
        if nv is None or es is None:
            return
        timeout_code = getattr(nv, "NVML_ERROR_TIMEOUT", 10)
        while not stop.is_set():
            try:
                data = nv.nvmlEventSetWait_v2(es, timeout_ms)
            except Exception as exc:
                if getattr(exc, "value", None) != timeout_code:
                    self.xid_note = f"Xid wait failed: {type(exc).__name__}: {exc}"
                    stop.wait(1.0)
                continue
            if int(getattr(data, "eventType", 0)) & int(nv.nvmlEventTypeXidCriticalError):
                self.record_xid(self._index_of(data.device), int(data.eventData))
