"""The rollout manager's part of a reload (live/manager.py calls these inside its validate-then-swap):
``check_config`` refuses a config that drops a running rollout's model or version and changes
nothing; ``follow_config`` swaps the version table, keeps a running rollout's weights, lets a
finished rollout's weights last until the file changes the model's weights, and takes the new
``rollouts:`` section and SLOs."""

from __future__ import annotations

from typing import Any

import pytest

from inferlb.config.settings import FleetConfig, fleet_from_mapping
from inferlb.errors import Conflict
from tests.rollout.rig import Rig, rig

CRITERIA: dict[str, Any] = {"min_requests": 1, "min_step_s": 0, "max_step_s": 600, "window_s": 300}


def fleet(v1: float = 100, v2: float | None = 0, *, model: str = "m", **extra: Any) -> FleetConfig:
    versions = [{"name": "v1", "weight": v1, "nodes": ["a", "b"]}]
    if v2 is not None:
        versions.append({"name": "v2", "weight": v2, "nodes": ["c"], "upstream_name": "m-v2"})
    return fleet_from_mapping({
        "models": [{"name": model, "versions": versions}],
        "nodes": [{"name": n, "url": f"http://127.0.0.1:{9000 + i}", "models": [model]} for i, n in enumerate("abc")],
        "slos": [{"model": model, "e2e_max_s": 2.0, "ttft_max_s": 0.5}], **extra})


def shares(r: Rig) -> dict[str, float]:
    mv = r.versions.get("m")
    assert mv is not None
    return mv.shares()


async def test_check_config_refuses_dropping_a_running_rollouts_version_or_model() -> None:
    r = rig()
    ro = await r.manager.start_rollout(r.spec(steps=[10, 100], criteria=CRITERIA))
    r.manager.check_config(fleet(v1=50), source="fleet.yaml")          # keeps both versions: fine
    with pytest.raises(Conflict) as err:
        r.manager.check_config(fleet(v2=None), source="fleet.yaml")
    assert err.value.code == "rollout_running" and err.value.param == "models[0].versions"
    assert err.value.message.startswith("fleet.yaml: models[0].versions: version 'v2' of model 'm'")
    assert ro.id in err.value.message
    with pytest.raises(Conflict) as err:
        r.manager.check_config(fleet(model="other"))
    assert err.value.param == "models" and "model 'm'" in err.value.message
    assert shares(r) == {"v1": 0.9, "v2": 0.1} and ro.running         # nothing changed
    await r.manager.abort(ro.id)
    r.manager.check_config(fleet(v2=None))                              # no running rollout: fine


async def test_follow_config_keeps_a_running_rollout_and_a_finished_one_until_the_file_changes() -> None:
    r = rig()
    ro = await r.manager.start_rollout(r.spec(steps=[10, 100], criteria=CRITERIA))
    r.manager.follow_config(fleet(v1=30, v2=0, rollouts={"interval_s": 2.5}))
    assert shares(r) == {"v1": 0.9, "v2": 0.1} and ro.running
    assert r.versions.file_weights("m") == {"v1": 30.0, "v2": 0.0}
    assert r.manager.interval_s == 2.5 and r.window.slo_of("m") == (0.5, 2.0)
    for _ in range(40):                     # rounds of 5 virtual seconds at 200 requests a second
        for _ in range(5):
            r.clock.advance(1.0)
            r.feed(200)
        await r.manager.run_once()
        if not ro.running:
            break
    assert ro.state == "completed" and shares(r) == {"v1": 0.0, "v2": 1.0}
    r.manager.follow_config(fleet(v1=30, v2=0))                         # same file weights: v2 stays
    assert shares(r) == {"v1": 0.0, "v2": 1.0}
    r.manager.follow_config(fleet(v1=25, v2=75))                        # the file says otherwise now
    assert shares(r) == {"v1": 0.25, "v2": 0.75} and not r.versions.get("m").overridden   # type: ignore[union-attr]
