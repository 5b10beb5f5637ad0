"""Passive health with an injected clock: ejection count rule, growth, cap, share cap, cooldowns."""

from __future__ import annotations

from inferlb.engine.fleet import Fleet
from inferlb.engine.settings import fleet_from_mapping
from inferlb.engine.types import ManualClock


def make(n: int = 4) -> tuple[Fleet, ManualClock]:
    clock = ManualClock()
    cfg = fleet_from_mapping({"models": [{"name": "m"}],
                              "nodes": [{"name": f"n{i}", "url": f"http://127.0.0.1:{i + 1}", "models": ["m"]}
                                        for i in range(n)]})
    return Fleet(cfg, clock), clock


def healthy(f: Fleet, name: str) -> bool:
    return next(v for v in f.views() if v.name == name).healthy


def test_ejected_exactly_at_the_fifth_consecutive_failure() -> None:
    f, _ = make()
    assert [f.report_failure("n0") for _ in range(5)] == [False, False, False, False, True]
    assert not healthy(f, "n0")


def test_a_success_resets_the_count() -> None:
    f, _ = make()
    for _ in range(4):
        f.report_failure("n0")
    f.report_success("n0")
    assert not any(f.report_failure("n0") for _ in range(4))


def test_ejection_time_grows_and_is_capped() -> None:
    f, clock = make()
    lengths = []
    for _ in range(12):
        for _ in range(5):
            f.report_failure("n0")
        lengths.append(f.nodes["n0"].ejected_until - clock.monotonic())
        clock.advance(lengths[-1])
        assert healthy(f, "n0")
    assert lengths[:3] == [30.0, 60.0, 90.0]
    assert max(lengths) == 300.0


def test_at_most_half_the_pool_is_ejected() -> None:
    f, _ = make(4)
    for name in ("n0", "n1", "n2"):
        for _ in range(5):
            f.report_failure(name)
    assert [healthy(f, n) for n in ("n0", "n1", "n2", "n3")] == [False, False, True, True]


def test_cooldown_extends_never_shortens() -> None:
    f, clock = make()
    f.cool_down("n0", 7)
    f.cool_down("n0", 2)
    clock.advance(6.9)
    assert not healthy(f, "n0")
    clock.advance(0.2)
    assert healthy(f, "n0")


def test_inflight_accounting() -> None:
    f, _ = make()
    f.acquire("n0", 300)
    f.acquire("n0", 200)
    v = next(v for v in f.views() if v.name == "n0")
    assert (v.inflight_requests, v.inflight_tokens) == (2, 500)
    f.release("n0", 300)
    f.release("n0", 200)
    assert f.inflight_total() == 0
