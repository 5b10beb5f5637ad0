"""``Fleet.views()`` kept incrementally equals a full rebuild after every change, and what it
hands out is never changed afterwards.

Random state changes through every path that writes what a view reads (the request path, the
health sweeps, metric and probe samples, LoRA adapter failures, slow start, hardware ejection,
drains, in-place changes with ``touch``) and clock steps that end timers (a cooldown, stale
metrics, an adapter's cool-down, the slow-start ramp, an ejection); after each, the incremental
snapshot is compared field by field with one built from scratch on a deep copy of the fleet (so
the reference does not reset the incremental state it checks)."""

from __future__ import annotations

import copy
import random
from typing import Any

from inferlb.config.settings import fleet_from_mapping
from inferlb.cost import Share
from inferlb.fleet.node import VIEW_BLIND
from inferlb.fleet.state import Fleet
from inferlb.health.isolation import observe, outlier_sweep, restore
from inferlb.node_types import Sample
from inferlb.routing.types import NodeList, NodeView
from inferlb.types import ManualClock


def make(n: int, clock: ManualClock) -> Fleet:
    cfg = fleet_from_mapping({
        "models": [{"name": "m0"}, {"name": "m1"}],
        "nodes": [{"name": f"node{i:02d}", "url": f"http://127.0.0.1:{i + 1}",
                   "models": ["m0", "m1"] if i % 3 == 0 else ["m0"], "capacity_tokens": 4096,
                   "max_concurrency": 8} for i in range(n)],
        "health": {"probe": {"stale_after_s": 4.0}, "outlier": {"panic_threshold_percent": 50.0},
                   "slow_start": {"window_s": 3.0}},
    })
    return Fleet(cfg, clock)


def reference(f: Fleet) -> tuple[list[NodeView], dict[str, list[NodeView]], bool]:
    """The snapshot built from scratch, on a copy (the fleet's own cache is left as it is)."""
    g = copy.deepcopy(f)
    g._rebuild_all = True
    v = g.views()
    return list(v), {m: list(x) for m, x in v.by_model.items()}, v.exact


def frozen(v: NodeList) -> tuple[tuple[NodeView, ...], dict[str, tuple[NodeView, ...]], bool]:
    return tuple(v), {m: tuple(x) for m, x in v.by_model.items()}, v.exact


def step(f: Fleet, clock: ManualClock, rng: random.Random, names: list[str]) -> None:
    node = rng.choice(names)
    now = clock.monotonic()
    op = rng.randrange(16)
    if op in (0, 1):
        f.acquire(node, rng.randint(1, 900))
    elif op == 2:
        f.release(node, rng.randint(1, 900))
    elif op == 3:
        f.report_failure(node)
    elif op == 4:
        f.report_success(node, stream=rng.random() < 0.5, completion_tokens=50, ttfb_s=0.1,
                         e2e_s=rng.uniform(0.5, 2))
    elif op == 5:
        f.cool_down(node, rng.uniform(0.1, 3))
    elif op == 6:
        lora = {"running": ["a1"], "waiting": rng.choice([[], ["a2"]]), "max_lora": 2} if rng.random() < 0.5 \
            else None
        values: dict[str, Any] = {"waiting": rng.randint(0, 5), "kv_usage": rng.random()}
        if lora:
            values["lora"] = lora
        observe(f, [Sample(node, "metrics", True, now, 0.0, values=values).to_json()])
    elif op == 7:
        observe(f, [Sample(node, "probe", rng.random() < 0.8, now, rng.uniform(0.001, 0.05)).to_json()])
    elif op == 8:
        clock.advance(rng.choice([0.0, 0.001, 0.3, 1.0, 2.5, 4.0, 4.5, 31.0]))
    elif op == 9:
        outlier_sweep(f, force=True)
        restore(f)
    elif op == 10:
        f.adapter_failed(node, rng.choice(["a1", "a2"]), rng.uniform(0.5, 5))
    elif op == 11:
        f.eject(node, "GPU fault", {}, hardware=True, seconds=rng.uniform(1, 10))
    elif op == 12:
        st = f.nodes[node]
        f.to_healthy(st, "restored by the test")   # slow start begins
    elif op == 13:
        f.transition(f.nodes[node], rng.choice(["draining", "loading", "down"]), "by the test")
    elif op == 14:
        f.nodes[node].ttft_ewma = rng.uniform(0.01, 0.2)
        f.nodes[node].rtt_ms = rng.uniform(1, 9)
    else:
        for _ in range(rng.randint(2, 6)):   # a burst of requests over several nodes
            f.acquire(rng.choice(names), rng.randint(1, 300))


def test_the_incremental_views_equal_a_full_rebuild_after_every_change() -> None:
    clock = ManualClock()
    f = make(12, clock)
    rng = random.Random(11)
    names = list(f.nodes)
    held: list[tuple[NodeList, Any]] = []
    for i in range(1000):
        step(f, clock, rng, names)
        got = f.views()
        views, by_model, exact = reference(f)
        assert list(got) == views, i
        assert {m: list(x) for m, x in got.by_model.items()} == by_model, i
        assert got.exact == exact, i
        for m, lst in got.by_model.items():   # a model's list holds the top list's objects
            assert all(any(v is w for w in got) for v in lst), (i, m)
        held.append((got, frozen(got)))
        if i % 50 == 0:   # every snapshot handed out is still what it was
            assert all(frozen(v) == was for v, was in held), i
            held = held[-5:]
    assert all(frozen(v) == was for v, was in held)


def test_nothing_changed_gives_the_same_snapshot_and_a_count_change_keeps_the_other_views() -> None:
    clock = ManualClock()
    f = make(30, clock)
    a = f.views()
    assert f.views() is a
    f.nodes["node05"].requests_total += 1        # a field the view does not read
    assert f.views() is a
    f.acquire("node05", 100)
    b = f.views()
    assert b is not a and b[5] is not a[5] and b[5].inflight_tokens == 100 and a[5].inflight_tokens == 0
    assert all(x is y for j, (x, y) in enumerate(zip(a, b, strict=True)) if j != 5)
    assert b.by_model["m1"] is a.by_model["m1"]   # node05 does not serve m1: its list is shared
    assert b.by_model["m0"] is not a.by_model["m0"]
    f.acquire("node05", 0)
    f.release("node05", 0)                        # back to the same counts: the view is kept
    assert f.views() is b
    f.touch("node07")                             # rebuilt equal: the old object stays
    assert f.views() is b


def _perturbed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 7
    if value is None:
        return 3.0
    if isinstance(value, list):
        return [*value, 0.5]
    if isinstance(value, dict):
        return {**value, "perturbed": 1}
    if isinstance(value, Share):
        return Share(123.0)
    raise AssertionError(f"no perturbation for {value!r}")


def test_the_fields_the_view_is_said_not_to_read_do_not_change_it() -> None:
    clock = ManualClock()
    f = make(12, clock)
    rng = random.Random(3)
    names = list(f.nodes)
    for _ in range(300):                          # nodes in every kind of state, with samples
        step(f, clock, rng, names)
    want, by_model, _ = reference(f)
    for field in sorted(VIEW_BLIND):
        g = copy.deepcopy(f)
        for st in g.nodes.values():
            object.__setattr__(st, field, _perturbed(getattr(st, field)))
        g._rebuild_all = True
        v = g.views()
        assert list(v) == want, field
        assert {m: list(x) for m, x in v.by_model.items()} == by_model, field


def test_each_snapshot_names_the_positions_changed_since_the_one_before() -> None:
    """``NodeList.delta`` (read by the routers' filter memo): for each model list copied since
    the previous hand-out, that hand-out's list and every position where the two differ; a
    model without an entry shares the previous hand-out's list; no delta after a full rebuild."""
    clock = ManualClock()
    f = make(12, clock)
    rng = random.Random(12)
    names = list(f.nodes)
    prev = f.views()
    told = 0
    for i in range(1000):
        step(f, clock, rng, names)
        got = f.views()
        if got is prev:
            continue
        if got.delta is not None:
            for m, lst in got.by_model.items():
                if m in got.delta:
                    earlier, pos = got.delta[m]
                    assert earlier is prev.by_model[m] and len(earlier) == len(lst), (i, m)
                    assert {j for j in range(len(lst)) if lst[j] is not earlier[j]} <= set(pos), (i, m)
                    told += 1
                else:
                    assert lst is prev.by_model[m], (i, m)
        prev = got
    assert told > 100
