"""Tenant keys: format, hashing, constant-time lookup; the store on SQLite and PostgreSQL; 0002."""

from __future__ import annotations

import re
from typing import Any

import pytest
from sqlalchemy import inspect, text

from inferlb.admission import keys as keys_mod
from inferlb.admission.keys import KEY_PREFIX, ApiKey, KeyCache, generate_key, hash_key
from inferlb.admission.store import add_spend, create_key, get_key, list_keys, load_keys, revoke_key
from inferlb.store.db import downgrade, make_engine, upgrade

T0 = 1_767_225_600.0


def test_keys_are_prefixed_and_carry_256_random_bits() -> None:
    keys = {generate_key() for _ in range(200)}
    assert len(keys) == 200
    for k in keys:
        assert re.fullmatch(r"sk-gw-[A-Za-z0-9_-]{43}", k)      # 43 × 6 bits ≥ 256 bits
    assert hash_key("sk-gw-x") == hash_key("sk-gw-x") and len(hash_key("sk-gw-x")) == 64


def _cache(now: float = T0) -> tuple[KeyCache, str, str, str]:
    live, revoked, expired = generate_key(), generate_key(), generate_key()
    c = KeyCache()
    c.replace([
        ApiKey(id="a", tenant="t", key_hash=hash_key(live), hint="h"),
        ApiKey(id="b", tenant="t", key_hash=hash_key(revoked), hint="h", revoked_at=now - 1),
        ApiKey(id="c", tenant="t", key_hash=hash_key(expired), hint="h", expires_at=now - 1),
    ])
    return c, live, revoked, expired


def test_lookup_finds_only_active_keys() -> None:
    c, live, revoked, expired = _cache()
    found = c.lookup(live, T0)
    assert found is not None and found.id == "a"
    for bad in (revoked, expired, live[:-1] + "x", "", "' OR 1=1 --", "\udcff"):   # S-06: injection shape
        assert c.lookup(bad, T0) is None


def test_wrong_and_unknown_keys_cost_the_same(monkeypatch: pytest.MonkeyPatch) -> None:  # S-02 (unit part)
    """A miss does the same work as a hit: one hash of the whole presented key and one constant-time
    comparison of two 64-character digests, whatever the key. Counted, not timed: the work a lookup
    does is what makes its time independent of the key, and a count cannot flake on a busy machine."""
    c, live, revoked, _ = _cache()
    wrong = live[:-4] + "AAAA"                              # right prefix, wrong secret
    unknown = KEY_PREFIX + "B" * 43
    calls: list[tuple[str, int, int]] = []
    real_compare, real_sha256 = keys_mod.hmac.compare_digest, keys_mod.hashlib.sha256

    def compare(a: str, b: str) -> bool:
        calls.append(("compare", len(a), len(b)))
        return real_compare(a, b)

    def sha256(data: bytes = b"") -> Any:
        calls.append(("sha256", len(data), 0))
        return real_sha256(data)

    monkeypatch.setattr(keys_mod.hmac, "compare_digest", compare)
    monkeypatch.setattr(keys_mod.hashlib, "sha256", sha256)
    traces = {}
    for name, key in (("live", live), ("revoked", revoked), ("wrong", wrong), ("unknown", unknown)):
        calls.clear()
        c.lookup(key, T0)
        traces[name] = list(calls)
    assert traces["live"] == [("sha256", len(live), 0), ("compare", 64, 64)]
    assert traces["wrong"] == traces["unknown"] == traces["revoked"] == traces["live"]


def test_store_round_trip_without_plaintext(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM api_keys"))            # the PostgreSQL schema lives for the session
    try:
        key, secret = create_key(engine, tenant="acme", now=T0, name="ci", models=["m"], priority_ceiling="standard",
                                 rpm=60, tpm=10_000, max_parallel=4, budget=5.0, expires_at=T0 + 86_400)
        assert secret.startswith(KEY_PREFIX) and key.key_hash == hash_key(secret)
        assert key.hint == secret[:10] + "…" + secret[-4:]
        with engine.connect() as conn:
            dump = " ".join(str(v) for row in conn.execute(text("SELECT * FROM api_keys")) for v in row)
        assert secret not in dump and secret[10:-4] not in dump               # S-02: only the hash is stored
        got = get_key(engine, key.id)
        assert got == key and got.models == ("m",) and got.rpm == 60 and got.expires_at == T0 + 86_400
        other, _ = create_key(engine, tenant="acme", now=T0 + 1)
        beta, _ = create_key(engine, tenant="beta", now=T0 + 2)
        assert [k.id for k in list_keys(engine, tenant="acme")] == [key.id, other.id]
        assert beta.id in [k.id for k in list_keys(engine)]
        add_spend(engine, {key.id: 0.25, "key_unknown": 1.0})
        add_spend(engine, {key.id: 0.5})
        assert get_key(engine, key.id).spent == pytest.approx(0.75)
        revoked = revoke_key(engine, key.id, now=T0 + 5)
        assert revoked is not None and revoked.revoked_at == T0 + 5
        assert revoke_key(engine, key.id, now=T0 + 9).revoked_at == T0 + 5   # idempotent
        assert revoke_key(engine, "key_nope", now=T0) is None
        active = [k.id for k in list_keys(engine, include_revoked=False)]
        assert other.id in active and key.id not in active
        cache = KeyCache()
        cache.replace(load_keys(engine))
        assert cache.lookup(secret, T0 + 10) is None
    finally:
        engine.dispose()


def test_migration_0002_adds_keys_and_queue_wait(fresh_url: str) -> None:
    upgrade(fresh_url)
    engine = make_engine(fresh_url)
    try:
        with engine.connect() as conn:
            insp = inspect(conn)
            assert "api_keys" in insp.get_table_names()
            assert "queue_wait_ms" in {c["name"] for c in insp.get_columns("requests")}
            uniques = {u["name"] for u in insp.get_unique_constraints("api_keys")}
            assert "uq_api_keys_key_hash" in uniques
        downgrade(fresh_url, "0001")
        with engine.connect() as conn:
            insp = inspect(conn)
            assert "api_keys" not in insp.get_table_names()
            assert "queue_wait_ms" not in {c["name"] for c in insp.get_columns("requests")}
        upgrade(fresh_url)
    finally:
        engine.dispose()
