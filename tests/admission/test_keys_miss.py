"""The controller's look-up of keys its cache does not know (AdmissionController.find_key,
admission/keys.py MissGuard): a key created elsewhere is found in the database and cached; random
keys are looked up at most ``keys_miss_checks_per_s`` times a second in all, and a digest the
database just called unknown is not asked again for ``keys_miss_ttl_s``. A revoked key in the
cache is never looked up again. On a ManualClock: nothing sleeps."""

from __future__ import annotations

from dataclasses import replace

from inferlb.admission.keys import ApiKey, MissGuard, hash_key
from inferlb.errors import StoreError
from tests.admission.rig import make_rig


class FakeStore:
    """The database's keys by digest; counts look-ups."""

    def __init__(self) -> None:
        self.keys: dict[str, ApiKey] = {}
        self.asked: list[str] = []
        self.down = False

    async def find(self, digest: str) -> ApiKey | None:
        self.asked.append(digest)
        if self.down:
            raise StoreError("api keys: connection refused")
        return self.keys.get(digest)


def _key(secret: str, **kw: object) -> ApiKey:
    return ApiKey(id="key_" + secret[-4:], tenant="acme", key_hash=hash_key(secret), hint="sk-gw-…", **kw)  # type: ignore[arg-type]


async def test_an_unknown_key_is_looked_up_once_and_then_cached() -> None:
    rig = make_rig({"keys_miss_checks_per_s": 5, "keys_miss_ttl_s": 30})
    store = FakeStore()
    rig.ctl.key_source = store.find
    secret = "sk-gw-" + "a" * 43
    store.keys[hash_key(secret)] = _key(secret)
    found = await rig.ctl.find_key(secret)
    assert found is not None and found.tenant == "acme"
    assert await rig.ctl.find_key(secret) is not None
    assert len(store.asked) == 1          # the second answer came from the cache


async def test_random_keys_cannot_hammer_the_database() -> None:
    rig = make_rig({"keys_miss_checks_per_s": 5, "keys_miss_ttl_s": 30})
    store = FakeStore()
    rig.ctl.key_source = store.find
    for i in range(100):
        assert await rig.ctl.find_key(f"sk-gw-random-{i:040d}") is None
    assert len(store.asked) == 5          # the burst, then no token this second
    rig.clock.advance(1.0)
    for i in range(100, 200):
        assert await rig.ctl.find_key(f"sk-gw-random-{i:040d}") is None
    assert len(store.asked) == 10         # five more a second


async def test_a_digest_called_unknown_is_not_asked_again_until_its_ttl() -> None:
    rig = make_rig({"keys_miss_checks_per_s": 100, "keys_miss_ttl_s": 30})
    store = FakeStore()
    rig.ctl.key_source = store.find
    wrong = "sk-gw-" + "w" * 43
    for _ in range(10):
        rig.clock.advance(1.0)
        assert await rig.ctl.find_key(wrong) is None
    assert len(store.asked) == 1
    rig.clock.advance(30.0)
    assert await rig.ctl.find_key(wrong) is None
    assert len(store.asked) == 2


async def test_a_revoked_key_in_the_cache_and_a_database_away_answer_none_without_more() -> None:
    rig = make_rig({"keys_miss_checks_per_s": 100})
    store = FakeStore()
    rig.ctl.key_source = store.find
    secret = "sk-gw-" + "r" * 43
    rig.ctl.keys.put(replace(_key(secret), revoked_at=1.0))
    assert await rig.ctl.find_key(secret) is None
    assert store.asked == []              # a revocation is final: the reload brings any change
    store.down = True
    other = "sk-gw-" + "d" * 43
    assert await rig.ctl.find_key(other) is None      # the caller's 401, not a 500
    store.down = False                    # the failure was not remembered as "unknown"
    store.keys[hash_key(other)] = _key(other)
    assert await rig.ctl.find_key(other) is not None


def test_the_unknown_list_is_bounded() -> None:
    guard = MissGuard(per_s=1e9, ttl_s=60.0, max_entries=100)
    for i in range(1000):
        assert guard.allow(f"d{i}", 0.0)
        guard.unknown(f"d{i}", 0.0)
    assert len(guard._unknown) <= 100
    assert not guard.allow("d999", 1.0)   # the newest are kept


def test_zero_look_ups_a_second_means_the_cache_alone_answers() -> None:
    guard = MissGuard(per_s=0.0, ttl_s=60.0)
    assert not guard.allow("d", 0.0) and not guard.allow("d", 3600.0) and guard.checks == 0
