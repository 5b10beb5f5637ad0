"""Fixtures: the store's database fixtures (SQLite and PostgreSQL) and a real Redis with a random
key prefix (skipped when Redis is unreachable, failed instead with ``INFERLB_REQUIRE_REDIS=1``)."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.store.conftest import db_url, fresh_url, pg_admin, pg_migrated_url, pg_schema_factory

__all__ = ["db_url", "fresh_url", "pg_admin", "pg_migrated_url", "pg_schema_factory", "redis_client"]

REDIS_URL = os.environ.get("INFERLB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
async def redis_client() -> AsyncIterator[tuple[Any, str]]:
    """(client, a fresh key prefix); every key under the prefix is deleted afterwards."""
    import redis.asyncio as aioredis
    from redis.exceptions import RedisError

    client = aioredis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        if os.environ.get("INFERLB_REQUIRE_REDIS") == "1":
            pytest.fail(f"Redis unreachable at {REDIS_URL}: {exc}")
        pytest.skip(f"Redis unreachable at {REDIS_URL}: {type(exc).__name__}")
    prefix = f"inferlb-test:{secrets.token_hex(6)}:"
    try:
        yield client, prefix
    finally:
        keys = [k async for k in client.scan_iter(match=prefix + "*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
