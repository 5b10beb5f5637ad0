"""The read side's one database boundary: the report and audit queries run through :func:`run_query`,
which turns a database failure into :class:`~inferlb.errors.StoreError`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from inferlb.errors import StoreError
from inferlb.store.db import describe_db_error

__all__ = ["run_query"]

_T = TypeVar("_T")


def run_query(engine: Engine, fn: Callable[[Connection], _T]) -> _T:
    """Run ``fn`` on a connection: the one place the report queries' database errors become StoreError."""
    try:
        with engine.connect() as conn:
            return fn(conn)
    except SQLAlchemyError as exc:
        raise StoreError(f"audit query failed: {describe_db_error(exc)}") from exc
