"""has-capacity keeps a request off a node whose whole KV budget cannot hold it."""

from __future__ import annotations

from inferlb.routing.plugins import HasCapacity
from inferlb.routing.profiles import build_router
from inferlb.routing.types import NodeView, RouteRequest


def node(name: str, capacity: int, **kw: object) -> NodeView:
    return NodeView(name=name, models=frozenset({"m"}), capacity_tokens=capacity, max_concurrency=8,
                    **kw)  # type: ignore[arg-type]


def test_a_node_too_small_for_the_request_is_dropped_when_another_fits() -> None:
    big = RouteRequest("m", prompt_tokens=5000, output_tokens=1000)
    kept, out = HasCapacity().apply(big, [node("t4", 4096), node("h100", 65536)])
    assert [n.name for n in kept] == ["h100"]
    assert out[0].node == "t4" and "never fit capacity 4096" in out[0].reason
    # Even an idle small node loses to a busy big one: it would refuse the request or thrash.
    d = build_router("token-aware", seed=1).decide(big, [node("t4", 4096), node("h100", 65536, inflight_tokens=30000,
                                                                                     inflight_requests=3)])
    assert d.pick == "h100"


def test_when_no_node_could_hold_it_an_idle_node_still_takes_it() -> None:
    huge = RouteRequest("m", prompt_tokens=90000, output_tokens=1000)
    kept, out = HasCapacity().apply(huge, [node("a", 4096), node("b", 65536, inflight_tokens=10,
                                                                   inflight_requests=1)])
    assert [n.name for n in kept] == ["a"] and out[0].node == "b"


def test_decode_speed_sends_long_requests_to_fast_nodes_and_short_ones_anywhere() -> None:
    from inferlb.routing.plugins import DecodeSpeed

    fast = node("fast", 65536, tokens_per_s=80.0)
    slow = node("slow", 65536, tokens_per_s=16.0)
    new = node("new", 65536)
    s = DecodeSpeed()
    long_req, short_req = RouteRequest("m", 100, 1000), RouteRequest("m", 100, 10)
    assert s.score(long_req, fast) == 10 / (10 + 1000 / 80)
    assert s.score(long_req, fast) - s.score(long_req, slow) > 0.2          # a long request cares
    assert s.score(short_req, fast) - s.score(short_req, slow) < 0.05       # a short one hardly does
    # Unknown speed: assumed slow-ish, so a new node learns on short requests, not a long one.
    assert s.score(long_req, slow) < s.score(long_req, new) < s.score(long_req, fast)
    assert s.score(short_req, new) > 0.9
    r = build_router("token-aware", seed=1)
    # The fast node is busier (fewer free tokens, nothing queued per its metrics), yet the long
    # request still goes there; the short one goes to the idle slow node.
    busy_fast = node("fast", 65536, tokens_per_s=80.0, inflight_tokens=8000, inflight_requests=6, waiting=0,
                     kv_usage=0.15)
    idle_slow = node("slow", 65536, tokens_per_s=16.0, waiting=0, kv_usage=0.0)
    assert r.decide(long_req, [busy_fast, idle_slow]).pick == "fast"
    assert r.decide(short_req, [busy_fast, idle_slow]).pick == "slow"
