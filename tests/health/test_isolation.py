"""The sweeps with an injected clock: probe thresholds, loading, hardware eject / drain, the outlier
interval (success rate, latency vs own baseline and peers), and every way back."""

from __future__ import annotations

from typing import Any

import pytest

from inferlb.config.settings import fleet_from_mapping
from inferlb.fleet.state import Fleet
from inferlb.health.assess import assess
from inferlb.health.isolation import isolate, observe, outlier_sweep, restore
from inferlb.node_types import Sample
from inferlb.types import ManualClock


def make(n: int = 3, health: dict[str, Any] | None = None) -> tuple[Fleet, ManualClock]:
    clock = ManualClock()
    cfg = fleet_from_mapping({
        "models": [{"name": "m"}],
        "nodes": [{"name": f"n{i}", "url": f"http://127.0.0.1:{i + 1}", "models": ["m"]} for i in range(n)],
        "health": health or {},
    })
    return Fleet(cfg, clock), clock


def probe(f: Fleet, clock: ManualClock, node: str, ok: bool = True, loading: bool = False,
          gpu: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One round: the given probe result for ``node`` (others ok), isolate then restore; the events."""
    now = clock.monotonic()
    samples = []
    for name in f.nodes:
        good = ok if name == node else True
        load = loading if name == node else False
        samples.append(Sample(name, "probe", good, now, 0.0, status=200 if good else (503 if load else None),
                              error=None if good else ("HTTP 503: loading" if load else "ConnectError"),
                              values={"loading": True} if load else {}).to_json())
    if gpu is not None:
        samples.append(Sample(node, "agent", True, now, 0.0, values=gpu).to_json())
    observe(f, samples)
    events = isolate(f, assess(samples, now, f.health.stale_after_s))
    return events + restore(f)


def test_down_after_unhealthy_threshold_back_after_healthy_threshold_in_slow_start() -> None:
    f, clock = make(health={"probe": {"unhealthy_threshold": 2, "healthy_threshold": 2}})
    assert probe(f, clock, "n0", ok=False) == []
    ev = probe(f, clock, "n0", ok=False)
    assert [(e["from"], e["to"]) for e in ev] == [("healthy", "down")]
    assert "2 consecutive failed probes" in ev[0]["reason"]
    assert probe(f, clock, "n0") == []
    ev = probe(f, clock, "n0")
    assert [(e["from"], e["to"]) for e in ev] == [("down", "healthy")]
    assert f.nodes["n0"].slow_start_at == clock.monotonic()


def test_loading_is_immediate_and_gets_no_traffic() -> None:
    f, clock = make()
    ev = probe(f, clock, "n0", ok=False, loading=True)
    assert [(e["from"], e["to"]) for e in ev] == [("healthy", "loading")]
    v = next(v for v in f.views() if v.name == "n0")
    assert not v.healthy and (v.unhealthy_reason or "").startswith("loading")
    assert [(e["from"], e["to"]) for e in probe(f, clock, "n0")] == [("loading", "healthy")]


def test_an_ejected_node_that_restarts_shows_loading_then_slow_start() -> None:
    f, clock = make()
    for _ in range(5):
        f.report_failure("n0")
    probe(f, clock, "n0", ok=False, loading=True)
    assert f.nodes["n0"].state == "loading"
    probe(f, clock, "n0")
    assert f.nodes["n0"].state == "healthy" and f.nodes["n0"].slow_start_at is not None


def test_ejection_over_but_probes_failing_goes_down_not_half_open() -> None:
    f, clock = make()
    for _ in range(5):
        f.report_failure("n0")
    probe(f, clock, "n0", ok=False)
    probe(f, clock, "n0", ok=False)
    clock.advance(30)
    probe(f, clock, "n0", ok=False)
    assert f.nodes["n0"].state == "down"


def test_a_passing_probe_does_not_uneject_unless_configured() -> None:
    f, clock = make()
    for _ in range(5):
        f.report_failure("n0")
    probe(f, clock, "n0")
    assert f.nodes["n0"].state == "ejected"
    f2, clock2 = make(health={"outlier": {"successful_probe_uneject": True}})
    for _ in range(5):
        f2.report_failure("n0")
    probe(f2, clock2, "n0")
    assert f2.nodes["n0"].state == "half_open"


def _gpu(xids: int = 0, last: int | None = None, throttle: list[str] | None = None, unc: int = 0) -> dict[str, Any]:
    return {"nvml": "ok", "boot_id": "b", "gpus": [{"index": 0, "uuid": "GPU-0", "xid_errors": xids, "xid_last": last,
                                                    "ecc_errors": {"uncorrected": unc}, "throttle_reasons": throttle}]}


def test_new_xid_ejects_before_any_request_fails() -> None:
    f, clock = make(health={"hardware": {"ejection_s": 120}})
    assert probe(f, clock, "n0", gpu=_gpu()) == []
    ev = probe(f, clock, "n0", gpu=_gpu(xids=1, last=79))
    assert [(e["from"], e["to"]) for e in ev] == [("healthy", "ejected")]
    assert "Xid 79 (GPU has fallen off the bus)" in ev[0]["reason"] and ev[0]["evidence"]["rule"] == "hardware"
    assert f.nodes["n0"].failures_total == 0 and f.nodes["n0"].hardware_fault
    clock.advance(60)
    probe(f, clock, "n0", gpu=_gpu(xids=1, last=79))
    assert f.nodes["n0"].state == "ejected"
    clock.advance(60)
    assert [(e["from"], e["to"]) for e in probe(f, clock, "n0", gpu=_gpu(xids=1, last=79))] == [
        ("ejected", "half_open")]


def test_hardware_ejection_is_not_offered_in_panic_and_not_capped() -> None:
    f, clock = make(2)
    probe(f, clock, "n0", gpu=_gpu())
    probe(f, clock, "n0", gpu=_gpu(unc=1))
    for _ in range(5):
        f.report_failure("n1")              # a second ejection passes 50 %: capped, n1 stays in
    assert f.nodes["n0"].state == "ejected" and f.nodes["n1"].state == "healthy"
    f.transition(f.nodes["n1"], "down", "test")
    assert f.panic_models(clock.monotonic()) == {"m"}
    assert [v.healthy for v in f.views()] == [False, True]   # n1 (down) offered, n0 (GPU fault) never


def test_thermal_throttling_drains_and_clearing_restores() -> None:
    f, clock = make()
    probe(f, clock, "n0", gpu=_gpu())
    ev = probe(f, clock, "n0", gpu=_gpu(throttle=["hw_thermal_slowdown"]))
    assert [(e["from"], e["to"]) for e in ev] == [("healthy", "draining")]
    assert not next(v for v in f.views() if v.name == "n0").healthy
    assert probe(f, clock, "n0", gpu=_gpu(throttle=["hw_thermal_slowdown"])) == []
    assert [(e["from"], e["to"]) for e in probe(f, clock, "n0", gpu=_gpu(throttle=["sw_power_cap"]))] == [
        ("draining", "healthy")]


def test_a_stale_gpu_report_lifts_a_drain() -> None:
    f, clock = make(health={"interval_s": 1})
    probe(f, clock, "n0", gpu=_gpu())
    probe(f, clock, "n0", gpu=_gpu(throttle=["hw_slowdown"]))
    clock.advance(3.5)
    ev = probe(f, clock, "n0")
    assert [(e["to"], e["reason"]) for e in ev] == [("healthy", "GPU report stale: drain lifted")]


def test_stale_samples_are_unknown_to_assess() -> None:
    s = Sample("n0", "probe", False, 100.0, 0.0, error="ConnectError").to_json()
    got = assess([s], 200.0, 15.0)["nodes"]["n0"]
    assert got["probe"] == "stale"


def _traffic(f: Fleet, node: str, ok: int, failed: int, ttfb: float = 0.05) -> None:
    for _ in range(ok):
        f.report_success(node, ttfb_s=ttfb)
    for _ in range(failed):
        f.report_failure(node)
        f.nodes[node].consecutive_failures = 0   # spread failures out: no consecutive-failure ejection


def test_success_rate_outlier_with_five_hosts_at_the_interval() -> None:
    f, clock = make(6)
    for i in range(5):
        _traffic(f, f"n{i}", 100, 0)
    _traffic(f, "n5", 70, 30)
    clock.advance(9.9)
    assert outlier_sweep(f) == []                     # not an interval yet
    clock.advance(0.1)
    assert outlier_sweep(f) == ["n5"]
    ev = f.take_events()[-1]
    assert ev.to_state == "ejected" and ev.evidence["rule"] == "success_rate" and ev.evidence["success_rate"] == 70.0
    assert all(f.nodes[n].iv_requests == 0 for n in f.nodes)    # counters reset per interval


def test_success_rate_is_off_below_five_hosts() -> None:
    f, clock = make(4)
    for i in range(3):
        _traffic(f, f"n{i}", 100, 0)
    _traffic(f, "n3", 50, 50)
    clock.advance(10)
    assert outlier_sweep(f) == []


def test_latency_outlier_against_its_own_baseline() -> None:
    f, clock = make(3)
    for _ in range(3):                                # learn: three intervals of 50 ms
        for n in f.nodes:
            _traffic(f, n, 20, 0, ttfb=0.05)
        clock.advance(10)
        assert outlier_sweep(f) == []
    assert f.nodes["n0"].ttft_baseline == pytest.approx(0.05)
    for n in f.nodes:
        _traffic(f, n, 20, 0, ttfb=0.05 if n != "n2" else 0.4)
    clock.advance(10)
    assert outlier_sweep(f) == ["n2"]
    assert f.take_events()[-1].evidence["rule"] == "latency"
    assert f.nodes["n2"].ttft_baseline == pytest.approx(0.05)   # an outlier interval does not teach


def test_a_slow_fleet_is_judged_per_node_not_against_peers() -> None:
    f, clock = make(3)
    for _ in range(4):
        for n in f.nodes:
            _traffic(f, n, 20, 0, ttfb=0.05 if n != "n1" else 0.6)   # n1 is simply a slower GPU
        clock.advance(10)
        assert outlier_sweep(f) == []


# ---- the latency rule compares like with like, and a node with its peers


def _streamed(f: Fleet, node: str, n: int, ttft: float, tokens: int = 64, tpot: float = 0.02) -> None:
    for _ in range(n):
        f.report_success(node, stream=True, completion_tokens=tokens, ttfb_s=ttft, e2e_s=ttft + tokens * tpot)


def _unary(f: Fleet, node: str, n: int, ttft: float, tokens: int = 64, tpot: float = 0.02) -> None:
    for _ in range(n):
        e2e = ttft + tokens * tpot   # the first byte comes with the whole answer
        f.report_success(node, stream=False, completion_tokens=tokens, ttfb_s=e2e, e2e_s=e2e)


def _intervals(f: Fleet, clock: ManualClock, count: int, traffic: Any) -> list[str]:
    ejected: list[str] = []
    for _ in range(count):
        for n in f.nodes:
            traffic(n)
        clock.advance(10)
        ejected += outlier_sweep(f)
    return ejected


def test_clients_switching_to_stream_false_eject_nobody() -> None:
    # The demo: streamed chats for 45 s, then identical chats with stream: false for 90 s.
    # A non-streamed answer's first byte comes after the whole generation (here 1.33 s, 27 × the
    # streamed TTFT of 50 ms): it must not be judged against the streamed baseline.
    f, clock = make(3)
    speed = {"n0": 0.015, "n1": 0.02, "n2": 0.02}     # n0 is the fastest node
    assert _intervals(f, clock, 5, lambda n: _streamed(f, n, 20, 0.05, tpot=speed[n])) == []
    assert f.nodes["n0"].ttft_baseline == pytest.approx(0.05)
    assert _intervals(f, clock, 9, lambda n: _unary(f, n, 20, 0.05, tpot=speed[n])) == []
    assert all(st.state == "healthy" for st in f.nodes.values())
    assert f.nodes["n0"].ttft_baseline == pytest.approx(0.05)     # streamed baseline untouched
    assert f.nodes["n0"].tpot_baseline == pytest.approx((0.05 + 64 * 0.015) / 64)


def test_a_saturated_gateway_slowing_every_node_alike_ejects_nobody() -> None:
    # The issue: at c=64 every TTFT measured in the gateway grew from 0.047 s to 0.171 s, over
    # 3 × each node's baseline; the peers were just as slow, so the node is not the outlier.
    f, clock = make(3)
    assert _intervals(f, clock, 3, lambda n: _streamed(f, n, 20, 0.047)) == []
    assert _intervals(f, clock, 3, lambda n: _streamed(f, n, 20, 0.171)) == []
    assert all(st.state == "healthy" for st in f.nodes.values())


def test_one_node_slow_against_its_peers_is_ejected_streamed_or_not() -> None:
    f, clock = make(3)
    assert _intervals(f, clock, 3, lambda n: _streamed(f, n, 20, 0.05)) == []
    assert _intervals(f, clock, 1, lambda n: _streamed(f, n, 20, 0.05 if n != "n1" else 0.4)) == ["n1"]
    ev = [e for e in f.take_events() if e.to_state == "ejected"][-1]
    assert ev.evidence["measure"] == "ttft" and ev.evidence["peer_median_s"] == pytest.approx(0.05)
    assert "its peers' median 0.05s" in ev.reason

    g, gclock = make(3)                             # not streamed: judged per output token
    assert _intervals(g, gclock, 3, lambda n: _unary(g, n, 20, 0.05)) == []
    assert _intervals(g, gclock, 1, lambda n: _unary(g, n, 20, 0.05, tpot=0.02 if n != "n2" else 0.1)) == ["n2"]
    ev = [e for e in g.take_events() if e.to_state == "ejected"][-1]
    assert ev.evidence["measure"] == "tpot" and ev.evidence["rule"] == "latency"
