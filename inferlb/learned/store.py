"""The ``routing_predictors`` table (migration 0010): the learned routing predictor's saved state.

One row per predictor ``name`` (the learned profile's is ``routing:learned``): its type, version,
when it was saved (epoch µs) and its state as JSON (routing/predictor_state.py). Written by the
feedback loop (learned/loop.py) after a retrain, every ``save_interval_s`` and at shutdown;
read once at start-up. Replicas that share the database share the row: in a cluster only the
trainer saves (learned/share.py); replicas that each learn alone overwrite each other's (the last
one saved wins); a replica that starts takes the newest. Synchronous (call through ``asyncio.to_thread`` from
async code); database errors become StoreError.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from inferlb.errors import StoreError
from inferlb.store.db import describe_db_error
from inferlb.store.schema import ROUTING_PREDICTORS, from_us, to_us

__all__ = ["SavedPredictor", "load_saved_predictor", "save_predictor"]


@dataclass(frozen=True, slots=True)
class SavedPredictor:
    """A saved row. ``state`` is None when it could not be decoded; ``problem`` then says why."""

    name: str
    type: str
    version: int
    saved_at: float
    state: Any
    problem: str | None = None


def save_predictor(engine: Engine, name: str, state: Mapping[str, Any], *, at: float) -> None:
    """Replace ``name``'s row with ``state`` (which carries its ``type`` and ``version``)."""
    row = {"name": name, "type": str(state.get("type")), "version": int(state.get("version") or 0),
           "saved_at_us": to_us(at), "state": dict(state)}
    try:
        with engine.begin() as conn:
            conn.execute(delete(ROUTING_PREDICTORS).where(ROUTING_PREDICTORS.c.name == name))
            conn.execute(insert(ROUTING_PREDICTORS).values(**row))
    except SQLAlchemyError as exc:
        raise StoreError(f"saving the routing predictor failed: {describe_db_error(exc)}") from exc


def load_saved_predictor(engine: Engine, name: str) -> SavedPredictor | None:
    """``name``'s saved row, or None when there is none."""
    t = ROUTING_PREDICTORS
    try:
        with engine.connect() as conn:
            head = conn.execute(select(t.c.type, t.c.version, t.c.saved_at_us).where(t.c.name == name)).first()
            if head is None:
                return None
            try:
                state = conn.execute(select(t.c.state).where(t.c.name == name)).scalar_one()
            except (ValueError, TypeError) as exc:   # the JSON itself is damaged: the row is unusable
                return SavedPredictor(name, str(head.type), int(head.version), from_us(head.saved_at_us) or 0.0,
                                      None, f"its state is not valid JSON ({type(exc).__name__})")
    except SQLAlchemyError as exc:
        raise StoreError(f"reading the saved routing predictor failed: {describe_db_error(exc)}") from exc
    return SavedPredictor(name, str(head.type), int(head.version), from_us(head.saved_at_us) or 0.0, state)
