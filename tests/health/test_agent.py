"""``inferlb agent``: the real NVML code path against a fake ``pynvml``, over real HTTP; the real
``pynvml`` on this GPU-less machine; the CLI subprocess."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from inferlb.health.agent import NodeAgent
from inferlb.health.nvml import NvmlReader
from tests.health.fake_nvml import NVML_ERROR_LIBRARY_NOT_FOUND, make_fake_nvml
from tests.support import free_port


async def _report(agent: NodeAgent) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False) as c:
        r = await c.get(agent.url + "/gpu")
    assert r.status_code == 200
    body: dict[str, Any] = r.json()
    return body


async def test_agent_serves_nvml_readings() -> None:
    fake = make_fake_nvml(2)
    fake.gpus[1].reasons = 0x40 | 0x4
    agent = NodeAgent(loader=lambda: fake)
    await agent.start()
    try:
        rep = await _report(agent)
    finally:
        await agent.stop()
    assert rep["nvml"] == "ok" and rep["driver_version"] == "550.90.07" and rep["reason"] is None
    g0, g1 = rep["gpus"]
    assert g0 == {**g0, "index": 0, "uuid": "GPU-0000", "name": "NVIDIA H100 80GB HBM3", "memory_used_mib": 77824.0,
                  "memory_total_mib": 81920.0, "utilization_gpu_pct": 97, "utilization_memory_pct": 61,
                  "temperature_c": 64, "power_w": 612.4, "power_limit_w": 700.0,
                  "throttle_reasons": ["sw_power_cap"], "ecc_errors": {"corrected": 3, "uncorrected": 0},
                  "xid_errors": 0, "xid_last": None, "lost": False, "unsupported": [], "errors": {}}
    assert g1["throttle_reasons"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert fake.shutdowns == 1


async def test_xid_events_are_collected_by_the_watcher_thread() -> None:
    fake = make_fake_nvml(2)
    agent = NodeAgent(loader=lambda: fake)
    await agent.start()
    try:
        fake.inject_xid(1, 79)
        rep: dict[str, Any] = {}
        for _ in range(200):    # the watcher thread wakes on the event; bounded wait for it
            rep = await _report(agent)
            if rep["gpus"][1]["xid_errors"]:
                break
            await asyncio.sleep(0.01)
    finally:
        await agent.stop()
    assert rep["gpus"][1]["xid_errors"] == 1 and rep["gpus"][1]["xid_last"] == 79
    assert rep["gpus"][0]["xid_errors"] == 0
    assert [(e["seq"], e["gpu"], e["xid"]) for e in rep["xid_events"]] == [(1, 1, 79)]


def test_unsupported_fields_and_a_lost_gpu_are_data() -> None:
    fake = make_fake_nvml(2)
    fake.gpus[0].unsupported = {"ecc"}
    fake.gpus[1].lost = True
    reader = NvmlReader(lambda: fake)
    reader.open()
    rep = reader.read()
    g0, g1 = rep["gpus"]
    assert g0["ecc_errors"] == {"corrected": None, "uncorrected": None} and g0["unsupported"] == [
        "ecc_uncorrected", "ecc_corrected"]
    assert g1["lost"] is True and "GPU is lost" in g1["errors"]["memory"]


def _missing() -> ModuleType:
    raise ModuleNotFoundError("No module named 'pynvml'")


async def test_without_nvml_the_agent_says_why_and_keeps_serving() -> None:
    for loader, why in ((_missing, "No module named 'pynvml'"),
                        (lambda: make_fake_nvml(init_error=NVML_ERROR_LIBRARY_NOT_FOUND),
                         "NVML Shared Library Not Found")):
        agent = NodeAgent(loader=loader)
        await agent.start()
        try:
            rep = await _report(agent)
            async with httpx.AsyncClient(trust_env=False) as c:
                hz = (await c.get(agent.url + "/healthz")).json()
        finally:
            await agent.stop()
        assert rep["nvml"] == "unavailable" and why in rep["reason"] and rep["gpus"] == []
        assert hz["status"] == "ok" and hz["nvml"] == "unavailable"


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="nvidia-ml-py is not installed")
def test_real_pynvml_without_a_driver_is_unavailable_not_an_error() -> None:
    reader = NvmlReader()        # the default loader: the real pynvml module
    reader.open()
    if reader.available:         # a GPU host: then it must read
        assert reader.read()["nvml"] == "ok"
        reader.close()
        return
    assert reader.read()["nvml"] == "unavailable"
    assert reader.reason and "NVML" in reader.reason


def test_cli_agent_starts_and_serves(tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "inferlb.cli.main", "agent", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env)
    try:
        assert proc.stdout is not None
        lines = []
        for _ in range(50):
            line = proc.stdout.readline()
            lines.append(line)
            if "inferlb agent serving" in line or not line:
                break
        assert any(f"http://127.0.0.1:{port}/gpu" in ln for ln in lines), "".join(lines)
        rep = httpx.get(f"http://127.0.0.1:{port}/gpu", timeout=5, trust_env=False).json()
        assert rep["nvml"] in ("ok", "unavailable") and "boot_id" in rep
    finally:
        proc.terminate()
        proc.wait(timeout=10)
