"""Learned routing decisions read back from the audit trail (no new table: the decision JSON).

:func:`learned_attempts` returns, newest first then put back in time order, every attempt whose
routing decision carries a ``learned`` part (routing/explain.py), with what that attempt measured:
its outcome, seconds from its start to its first byte and to its end, whether it streamed and
its completion tokens (the request's, for the attempt that answered). The off-policy evaluation
(``inferlb routing evaluate``) and the scheduled retrain of the latency predictor read it.
Synchronous (call through ``asyncio.to_thread`` from async code); errors become StoreError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine

from inferlb.store.read import run_query
from inferlb.store.schema import ATTEMPTS, REQUESTS, to_us

__all__ = ["LearnedAttempt", "learned_attempts"]


@dataclass(frozen=True, slots=True)
class LearnedAttempt:
    request_id: str
    model: str
    learned: dict[str, Any]
    node: str
    outcome: str
    stream: bool
    completion_tokens: int | None
    ttfb_s: float | None
    e2e_s: float | None
    received_at: float


def learned_attempts(engine: Engine, *, since: float | None = None, until: float | None = None,
                     limit: int = 20_000) -> list[LearnedAttempt]:
    """The attempts of learned decisions in ``[since, until)`` (epoch s), at most ``limit`` (the newest)."""

    def fetch(conn: Connection) -> list[LearnedAttempt]:
        q = select(REQUESTS.c.request_id, REQUESTS.c.received_at_us, REQUESTS.c.stream, REQUESTS.c.decisions,
                   REQUESTS.c.completion_tokens, REQUESTS.c.attempt_count).where(REQUESTS.c.decisions.is_not(None))
        if since is not None:
            q = q.where(REQUESTS.c.received_at_us >= to_us(since))
        if until is not None:
            q = q.where(REQUESTS.c.received_at_us < to_us(until))
        q = q.order_by(REQUESTS.c.received_at_us.desc()).limit(limit)
        rows = list(conn.execute(q).mappings())
        wanted = {r["request_id"]: r for r in rows
                  if any(isinstance(d, dict) and d.get("learned") for d in (r["decisions"] or []))}
        if not wanted:
            return []
        attempts: dict[tuple[str, int], Any] = {}
        ids = list(wanted)
        for k in range(0, len(ids), 500):
            aq = select(ATTEMPTS).where(ATTEMPTS.c.request_id.in_(ids[k:k + 500]))
            for row in conn.execute(aq).mappings():
                attempts[(row["request_id"], row["number"])] = row
        out: list[LearnedAttempt] = []
        for rid, r in wanted.items():
            last = int(r["attempt_count"] or 0)
            for d in r["decisions"] or []:
                lj = d.get("learned") if isinstance(d, dict) else None
                num = d.get("attempt") if isinstance(d, dict) else None
                if not lj or not isinstance(num, int):
                    continue
                a = attempts.get((rid, num))
                if a is None:
                    continue
                start, first, end = a["started_at_us"], a["first_byte_at_us"], a["ended_at_us"]
                out.append(LearnedAttempt(
                    request_id=rid, model=str(d.get("model") or a["model"]), learned=lj, node=a["node"],
                    outcome=a["outcome"], stream=bool(r["stream"]),
                    completion_tokens=r["completion_tokens"] if num == last else None,
                    ttfb_s=None if first is None else (first - start) / 1e6,
                    e2e_s=None if end is None else (end - start) / 1e6,
                    received_at=r["received_at_us"] / 1e6))
        out.sort(key=lambda x: x.received_at)
        return out

    return run_query(engine, fetch)
