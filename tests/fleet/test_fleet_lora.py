"""The gateway's node views carry the LoRA state of the last fresh metrics sample, and an adapter
that failed to load marks its node for that adapter only, for the cool-down (injected clock)."""

from __future__ import annotations

from typing import Any

from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.health.isolation import observe
from inferlb.health.prometheus import parse_vllm
from inferlb.node_types import Sample
from inferlb.types import ManualClock

PAGE = ('vllm:num_requests_waiting{model_name="b"} 1\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="sql-lora",waiting_lora_adapters="x"} 10\n')


def make() -> tuple[Fleet, ManualClock]:
    clock = ManualClock()
    cfg = fleet_from_mapping({
        "models": [{"name": "sql", "lora": {"adapter": "sql-lora"}}, {"name": "b"}],
        "nodes": [{"name": f"n{i}", "url": f"http://127.0.0.1:{i + 1}", "models": ["sql", "b"]} for i in range(2)],
        "health": {"interval_s": 1},
    })
    return Fleet(cfg, clock), clock


def view(f: Fleet, name: str) -> Any:
    return next(v for v in f.views() if v.name == name)


def test_views_carry_the_adapters_of_a_fresh_sample_and_forget_a_stale_one() -> None:
    f, clock = make()
    now = clock.monotonic()
    observe(f, [Sample("n0", "metrics", True, now, 0.0, values=parse_vllm(PAGE)).to_json(),
                Sample("n0", "probe", True, now, 0.0).to_json()])
    v = view(f, "n0")
    assert (v.lora_running, v.lora_waiting, v.max_lora) == (frozenset({"sql-lora"}), frozenset({"x"}), 2)
    assert view(f, "n1").max_lora is None and not view(f, "n1").lora_running
    assert f.describe()[0]["lora"] == {"running": ["sql-lora"], "waiting": ["x"], "max_lora": 2, "failed": []}
    clock.advance(3.5)
    assert view(f, "n0").max_lora is None and not view(f, "n0").lora_running


def test_a_failed_adapter_marks_that_node_for_that_adapter_until_the_cooldown_ends() -> None:
    f, clock = make()
    f.adapter_failed("n0", "sql-lora", 30.0)
    v = view(f, "n0")
    assert v.lora_failed == frozenset({"sql-lora"}) and v.healthy       # the node itself still serves
    assert f.nodes["n0"].state == "healthy" and not view(f, "n1").lora_failed
    ev = f.take_events()[-1]
    assert ev.node == "n0" and ev.evidence == {"adapter": "sql-lora", "cooldown_s": 30.0}
    f.adapter_failed("n0", "sql-lora", 5.0)                             # extends, never shortens
    clock.advance(29.999)
    assert view(f, "n0").lora_failed == frozenset({"sql-lora"})
    clock.advance(0.001)
    assert view(f, "n0").lora_failed == frozenset()                    # rebuilt when its timer ran out
