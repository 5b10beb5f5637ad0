"""Admission decisions with an injected clock: slots, the priority queue, shedding, saturation."""

from __future__ import annotations

from inferlb.routing.types import NodeView
from tests.admission.rig import make_rig


def test_slots_then_queue_then_handover() -> None:
    r = make_rig()                      # 2 nodes × max_concurrency 2 = 4 slots
    held = [r.admit(f"r{i}") for i in range(4)]
    assert all(a["admitted"] for _, a in held)
    s5, a5 = r.admit("r5")
    assert a5["admitted"] is False and a5["queue"] is True and a5["status"] is None
    assert r.ctl.queue_depth() == {"m": 1}
    r.clock.advance(0.25)
    r.end(held[0][0])                   # a slot frees: it goes to the queued request, not to a newcomer
    _, late = r.admit("late")
    assert late["queue"] is True
    assert r.ctl.wait_result(s5) == {"outcome": "granted", "waited_ms": 250.0}
    again = r.again(s5)
    assert again["admitted"] is True and again["queue_wait_ms"] == 250.0
    assert s5.record.queue_wait_ms == 250.0 and s5.record.admitted_at is not None
    assert r.ctl.snapshot()["pools"]["m"]["admitted"] == 4


def test_queue_serves_class_then_deadline() -> None:
    r = make_rig()
    held = [r.admit(f"r{i}")[0] for i in range(4)]
    waiting = {
        "b1": r.admit("b1", prio="batch")[0],
        "s_late": r.admit("s_late", deadline_s=100)[0],
        "s_soon": r.admit("s_soon", deadline_s=50)[0],
        "c1": r.admit("c1", prio="critical")[0],
    }
    order = []
    for s in held:
        r.end(s)
        granted = [k for k, w in waiting.items() if r.ctl.holds[k].ticket.state == "granted" and k not in order]
        order += granted
    assert order == ["c1", "s_soon", "s_late", "b1"]


def test_full_queue_sheds_the_lowest_class_first() -> None:
    r = make_rig({"queue": {"min_size": 0, "size_factor": 0.5}})     # queue bound 2
    for i in range(4):
        r.admit(f"r{i}")
    b1, _ = r.admit("b1", prio="batch")
    b2, _ = r.admit("b2", prio="batch")
    std, a = r.admit("std")                                          # full: the newest batch request goes
    assert a["queue"] is True
    assert r.ctl.holds["b2"].ticket.state == "shed" and r.ctl.holds["b1"].ticket.state == "queued"
    shed = r.again(b2, "batch")
    assert shed["status"] == 503 and shed["record_status"] == "rejected_overload" and shed["retry_after_s"] >= 1
    _, b3 = r.admit("b3", prio="batch")                              # nothing lower to evict: shed at once
    assert b3["status"] == 503 and b3["code"] == "overloaded" and "queue is full" in b3["reason"]


def test_expected_wait_over_the_class_limit_is_shed_at_once() -> None:
    r = make_rig({"queue": {"size_factor": 4}})                      # bound 16: only the wait limits
    first = [r.admit(f"w{i}")[0] for i in range(4)]
    r.clock.advance(2.0)
    for s in first:
        r.end(s)                                                     # mean service time 2 s
    for i in range(4):
        r.admit(f"r{i}")
    queued = [r.admit(f"q{i}")[1] for i in range(3)]                 # expected waits 0.5, 1, 1.5 s
    # the wait may be 2 s (class limit, and 1 × the service time); queue only within half of it
    assert [q["queue"] for q in queued] == [True, True, False]
    assert queued[2]["status"] == 503 and "expected wait 1.50s is over 2.00s" in queued[2]["reason"]
    _, crit = r.admit("c", prio="critical")                          # ahead of every standard request
    assert crit["queue"] is True


def test_tick_expires_a_wait_and_admit_answers_503() -> None:
    r = make_rig()
    for i in range(4):
        r.admit(f"r{i}")
    s, _ = r.admit("q")
    r.clock.advance(2.5)                                             # standard waits at most 2 s
    r.ctl.tick()
    assert r.ctl.wait_result(s)["outcome"] == "expired"
    a = r.again(s)
    assert a["status"] == 503 and a["code"] == "queue_timeout" and a["record_status"] == "rejected_queue_timeout"
    r.end(s, "rejected_queue_timeout", attempted=False)
    assert r.ctl.queue_depth() == {"m": 0} and "q" not in r.ctl.holds


def test_deadline_shorter_than_the_wait_limits_it() -> None:
    r = make_rig()
    for i in range(4):
        r.admit(f"r{i}")
    s, a = r.admit("q", deadline_s=0.5)
    assert a["queue"] and r.ctl.holds["q"].ticket.wait_until == r.clock.monotonic() + 0.5
    _, gone = r.admit("late", deadline_s=0.0)
    assert gone["status"] == 503


def test_class_without_queueing_is_shed_when_saturated() -> None:
    r = make_rig({"classes": [{"name": "gold"}, {"name": "scavenger", "max_queue_wait_s": 0}],
                  "default_class": "gold"})
    for i in range(4):
        r.admit(f"r{i}", prio="gold")
    _, a = r.admit("s", prio="scavenger")
    assert a["status"] == 503 and "does not queue" in a["reason"]


def test_no_healthy_node_passes_through_to_routing() -> None:
    r = make_rig()
    for name in r.rt.fleet.nodes:
        r.rt.fleet.cool_down(name, 30)               # every node answered 429 Retry-After: 30
    answers = [r.admit(f"r{i}")[1] for i in range(10)]
    assert all(a["admitted"] and "no healthy node" in a["reason"] for a in answers)


def test_nodes_busy_with_other_traffic_saturate_the_pool() -> None:
    r = make_rig()
    for name in r.rt.fleet.nodes:
        for _ in range(2):
            r.rt.fleet.acquire(name, 10)             # every node at max_concurrency (another pool's work)
    _, a = r.admit("r")
    assert a["queue"] is True and r.ctl.saturated("m")


def test_node_metrics_make_a_node_hot() -> None:
    r = make_rig({"saturation": {"max_waiting": 4, "max_kv_usage": 0.9}})
    base = dict(name="n", models=frozenset({"m"}), capacity_tokens=1000, max_concurrency=8)
    assert not r.ctl._hot([NodeView(**base, waiting=4, kv_usage=0.5)])
    assert r.ctl._hot([NodeView(**base, waiting=5)])
    assert r.ctl._hot([NodeView(**base, kv_usage=0.95)])
    assert r.ctl._hot([NodeView(**base, inflight_tokens=1000)])
    assert not r.ctl._hot([NodeView(**base, kv_usage=0.95), NodeView(**{**base, "name": "n2"})])  # one cool node


def test_gateway_wide_cap_still_applies() -> None:
    r = make_rig(max_inflight=3)
    answers = [r.admit(f"r{i}")[1] for i in range(4)]
    assert [a["admitted"] for a in answers] == [True, True, True, False]
    assert answers[3]["status"] == 503 and "cap 3" in answers[3]["reason"]


def test_admission_off_admits_everything() -> None:
    r = make_rig({"enabled": False})
    answers = [r.admit(f"r{i}")[1] for i in range(50)]
    assert all(a["admitted"] for a in answers)
    allowed, _ = r.ctl.retry_allowed(r.scope("x"), "batch")
    assert allowed


def test_batch_gets_no_retry_while_saturated_but_standard_does() -> None:
    r = make_rig()
    scopes = [r.admit(f"r{i}")[0] for i in range(4)]
    assert r.ctl.saturated("m")
    assert r.ctl.retry_allowed(scopes[0], "batch") == (False, "pool m is saturated: class batch is not retried")
    assert r.ctl.retry_allowed(scopes[0], "standard")[0] is True


def test_stale_holds_are_swept() -> None:
    r = make_rig()
    r.admit("lost", deadline_s=1.0)
    r.clock.advance(30)
    assert r.ctl.sweep(grace_s=60) == 0
    r.clock.advance(60)
    assert r.ctl.sweep(grace_s=60) == 1
    assert r.ctl.snapshot()["pools"]["m"]["admitted"] == 0


def test_every_audit_submit_releases_exactly_once() -> None:
    r = make_rig()
    s, _ = r.admit("r")
    r.end(s)
    r.rt.on_request_end(s.record)                    # a second end of the same request
    assert r.ctl.snapshot()["pools"]["m"]["admitted"] == 0 and len(r.records) == 2


def test_lower_classes_are_shed_at_once_while_higher_ones_fill_the_pool() -> None:
    r = make_rig()
    first = [r.admit(f"w{i}")[0] for i in range(4)]
    r.clock.advance(1.0)
    for s in first:
        r.end(s)                                                     # mean service time 1 s, 4 slots
    for i in range(80):                                              # critical at 8/s: twice what 4 slots serve
        r.admit(f"c{i}", prio="critical")
        r.clock.advance(0.125)
    _, batch = r.admit("b", prio="batch")
    assert batch["status"] == 503 and "expected wait inf" in batch["reason"]   # no point queueing it
    assert batch["retry_after_s"] == 60
