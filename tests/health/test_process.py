"""node_health.bpmn on real SpiffWorkflow over simulated nodes: one round's path and data, and
edits to the process (a copy without ``restore``, a threshold parameter) changing behaviour."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from inferlb.config.settings import fleet_from_mapping
from inferlb.errors import ProcessValidationError
from inferlb.fleet.state import Fleet
from inferlb.health.monitor import HealthMonitor
from inferlb.health.probe import Prober
from inferlb.node_types import NodeEvent
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec
from inferlb.tasks import HEALTH_REQUIRED_TASKS, SERVICES
from inferlb.types import ManualClock
from inferlb.workflow.definition import load_process
from tests.support import ROOT, fast_specs

FIX = Path(__file__).parent / "fixtures"
MAIN = ROOT / "processes" / "node_health.bpmn"


@pytest.fixture
async def sim() -> AsyncIterator[SimFleet]:
    async with SimFleet(fast_specs(3)) as s:
        yield s


def monitor_for(sim: SimFleet, path: Path = MAIN, **health: Any) -> tuple[HealthMonitor, ManualClock,
                                                                        list[NodeEvent]]:
    clock = ManualClock()
    cfg = fleet_from_mapping({
        "models": [{"name": "m"}],
        "nodes": [{"name": n, "url": node.url, "models": ["m"], "kind": "sim"} for n, node in sim.nodes.items()],
        "health": {"probe": {"timeout_s": 1.0}, "nodes": {n: {"metrics": "none"} for n in sim.nodes}, **health},
    })
    fleet = Fleet(cfg, clock)
    recorded: list[NodeEvent] = []
    process = load_process(path, SERVICES, engine="spiff", required=HEALTH_REQUIRED_TASKS)
    mon = HealthMonitor(fleet=fleet, process=process, clock=clock, prober=Prober(cfg.nodes, cfg.health, clock),
                        record=recorded.extend)
    return mon, clock, recorded


async def test_one_round_runs_every_task_on_spiff(sim: SimFleet) -> None:
    mon, _, recorded = monitor_for(sim)
    try:
        data = await mon.run_once()
    finally:
        await mon.close()
    assert mon.process.mode == "spiff"
    assert mon.last_round["path"] == ["start", "probe", "assess", "isolate", "restore", "record", "end"]
    assert data["probe"]["count"] == 3 and all(s["ok"] for s in data["probe"]["samples"])
    assert data["assessment"]["nodes"]["n0"]["probe"] == "ok"
    assert data["isolated"] == {"events": [], "count": 0} and data["recorded"]["count"] == 0
    assert recorded == []


async def test_loading_node_is_taken_out_and_the_event_recorded(sim: SimFleet) -> None:
    mon, _, recorded = monitor_for(sim)
    await sim.nodes["n1"].set_faults(FaultSpec(loading=True))
    try:
        data = await mon.run_once()
    finally:
        await mon.close()
    assert [(e["node"], e["to"]) for e in data["isolated"]["events"]] == [("n1", "loading")]
    assert [(e.node, e.from_state, e.to_state) for e in recorded] == [("n1", "healthy", "loading")]
    assert mon.fleet.nodes["n1"].state == "loading"


async def test_a_copy_without_restore_never_brings_a_node_back(sim: SimFleet) -> None:
    for path, expected in ((MAIN, "half_open"), (FIX / "node_health_no_restore.bpmn", "ejected")):
        mon, clock, _ = monitor_for(sim, path)
        try:
            for _ in range(5):
                mon.fleet.report_failure("n0")
            clock.advance(31)
            await mon.run_once()
            assert mon.fleet.nodes["n0"].state == expected, path.name
        finally:
            await mon.close()


async def test_a_threshold_parameter_in_the_process_overrides_the_config(sim: SimFleet) -> None:
    await sim.stop_node("n2")
    for path, rounds_to_down in ((MAIN, 2), (FIX / "node_health_threshold1.bpmn", 1)):
        mon, _, _ = monitor_for(sim, path)
        try:
            states = []
            for _ in range(2):
                await mon.run_once()
                states.append(mon.fleet.nodes["n2"].state)
        finally:
            await mon.close()
        assert states.index("down") + 1 == rounds_to_down, (path.name, states)


async def test_a_failing_round_is_counted_and_the_monitor_goes_on(sim: SimFleet, tmp_path: Path) -> None:
    bad = tmp_path / "bad.bpmn"
    param = '<camunda:inputParameter name="unhealthy_threshold">'
    bad.write_text((FIX / "node_health_threshold1.bpmn").read_text().replace(param + "1<", param + "0<"))
    mon, _, _ = monitor_for(sim, bad)
    try:
        await mon.timer.run_logged()
        await mon.timer.run_logged()
    finally:
        await mon.close()
    assert mon.failed_rounds == 2 and "unhealthy_threshold must be a number >= 1" in (mon.last_error or "")


def test_the_health_process_must_keep_its_required_tasks(tmp_path: Path) -> None:
    broken = tmp_path / "no_record.bpmn"
    broken.write_text(MAIN.read_text().replace('camunda:topic="health/record"', 'camunda:topic="health/restore"'))
    with pytest.raises(ProcessValidationError, match="missing required task"):
        load_process(broken, SERVICES, engine="spiff", required=HEALTH_REQUIRED_TASKS)


def test_validate_cli_knows_a_health_process() -> None:
    from inferlb.cli.main import main

    assert main(["validate", str(MAIN)]) == 0


@pytest.mark.skipif(shutil.which("node") is None or not (ROOT / "tests/processes/modeler/node_modules").is_dir(),
                    reason="the modeler tooling (node + tests/processes/modeler/install.sh) is not installed")
def test_fixture_copies_pass_the_modeler_check() -> None:
    files = [str(MAIN), *(str(p) for p in sorted(FIX.glob("*.bpmn")))]
    proc = subprocess.run(["node", str(ROOT / "tests/processes/modeler/check.mjs"), *files],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
