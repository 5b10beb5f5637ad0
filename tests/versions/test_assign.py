"""Sticky weighted assignment (versions/assign.py): stable per user, shares follow the
weights, and a weight change moves only the users it must, in the direction it must."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter

from inferlb.versions.assign import choose, sticky_key
from tests.support import ROOT

USERS = [f"user-{i}" for i in range(20_000)]


def _assign(weights: list[tuple[str, float]], users: list[str] = USERS, tenant: str | None = "acme") -> list[str]:
    out = []
    for u in users:
        v = choose(weights, sticky_key("m", tenant, u))
        assert v is not None
        out.append(v)
    return out


def test_the_same_user_always_gets_the_same_version() -> None:
    w = [("v1", 50.0), ("v2", 50.0)]
    assert _assign(w, USERS[:500]) == _assign(w, USERS[:500])


def test_assignment_is_stable_across_processes() -> None:
    """BLAKE2b, not Python's salted hash(): another process (another hash seed) agrees."""
    code = ("from inferlb.versions.assign import choose, sticky_key;"
            "print(''.join(choose([('a', 1.0), ('b', 1.0)], sticky_key('m', 't', f'u{i}')) for i in range(200)))")
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                           env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)}).stdout.strip()
            for seed in ("1", "2")}
    assert len(runs) == 1 and len(next(iter(runs))) == 200


def test_shares_follow_the_weights() -> None:
    counts = Counter(_assign([("v1", 90.0), ("v2", 10.0)]))
    # 20,000 users: the binomial standard deviation of a 10 % share is 0.2 %; allow 5 of them.
    assert abs(counts["v2"] / len(USERS) - 0.10) < 0.01
    counts3 = Counter(_assign([("a", 1.0), ("b", 2.0), ("c", 1.0)]))
    assert abs(counts3["b"] / len(USERS) - 0.5) < 0.015 and abs(counts3["a"] / len(USERS) - 0.25) < 0.015


def test_weight_zero_is_never_chosen_and_all_zero_is_none() -> None:
    assert set(_assign([("v1", 1.0), ("v2", 0.0)], USERS[:2000])) == {"v1"}
    assert choose([("v1", 0.0)], sticky_key("m", None, "u")) is None


def test_raising_the_canary_moves_only_users_to_it_and_only_as_many_as_needed() -> None:
    before = _assign([("v1", 99.0), ("v2", 1.0)])
    after = _assign([("v1", 95.0), ("v2", 5.0)])
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert all(m == ("v1", "v2") for m in moved)                     # nobody left the canary
    assert all(a == "v2" for b, a in zip(before, after, strict=True) if b == "v2")
    share = len(moved) / len(USERS)
    assert 0.03 < share < 0.05                                        # the 4 % that must move (±1 %)


def test_lowering_a_version_moves_users_only_away_from_it() -> None:
    before = _assign([("v1", 50.0), ("v2", 50.0)])
    after = _assign([("v1", 50.0), ("v2", 10.0)])
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert moved and all(m == ("v2", "v1") for m in moved)


def test_with_three_versions_a_change_never_moves_users_between_the_other_two() -> None:
    before = _assign([("v1", 60.0), ("v2", 30.0), ("v3", 10.0)])
    after = _assign([("v1", 60.0), ("v2", 30.0), ("v3", 40.0)])
    moved = Counter((b, a) for b, a in zip(before, after, strict=True) if b != a)
    assert set(moved) <= {("v1", "v3"), ("v2", "v3")}
    # v3's share goes from 10/100 to 40/130: 20.8 % of the users must move, in proportion from v1 and v2.
    total = sum(moved.values()) / len(USERS)
    assert abs(total - (40 / 130 - 10 / 100)) < 0.01
    assert abs(moved[("v1", "v3")] / max(1, moved[("v2", "v3")]) - 2.0) < 0.25


def test_tenant_and_model_are_part_of_the_key() -> None:
    w = [("v1", 50.0), ("v2", 50.0)]
    a = _assign(w, USERS[:2000], tenant="acme")
    b = _assign(w, USERS[:2000], tenant="globex")
    assert 0.4 < sum(x != y for x, y in zip(a, b, strict=True)) / 2000 < 0.6   # independent splits
