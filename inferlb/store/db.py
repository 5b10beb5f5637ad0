"""Engines and migrations for the audit store.

Contract:

* :func:`make_engine` returns a synchronous SQLAlchemy :class:`~sqlalchemy.engine.Engine`. It never
  connects eagerly. SQLite files get ``journal_mode=WAL``, ``synchronous=NORMAL`` by default
  (durable across application crashes; the writer's fsynced journal covers the rest, but not an
  OS crash or power loss after a record's journal entry was released: ``sqlite_synchronous="full"``
  fsyncs every commit and closes that, docs/observability.md "Audit durability"), ``busy_timeout`` and
  ``foreign_keys=ON`` on every new connection. PostgreSQL uses psycopg 3: ``postgresql://`` and
  ``postgres://`` are rewritten to ``postgresql+psycopg://``; connections are pre-pinged so a
  restarted server does not fail the first batch after it returns.
* JSON columns are written by :func:`inferlb.jsoncodec.dumps` (orjson: the audit row's
  ``decision``, ``tags`` and ``workflow_path`` on every record; the same document as ``json.dumps``).
* Every database call is bounded: PostgreSQL gets ``connect_timeout`` (unless the URL sets one),
  a server-side ``statement_timeout`` (added to any ``options`` the URL carries) and TCP
  keepalives; SQLite gets ``busy_timeout``. A server that accepts and then never answers is not
  bounded by the server-side timeout: the audit writer bounds each call on its side as well.
* :func:`upgrade` runs ``alembic upgrade head`` programmatically against ``url``; the URL is handed to
  ``migrations/env.py`` through ``config.attributes["url"]``, never through alembic.ini.
* :func:`migrations_dir` finds the repository's ``migrations/`` (editable install) or the copy a
  wheel ships as ``inferlb/_migrations``.
* Foreign errors (SQLAlchemy, Alembic) are mapped to :class:`~inferlb.errors.StoreError` here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from sqlalchemy import create_engine, event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from inferlb.errors import StoreError
from inferlb.jsoncodec import dumps

__all__ = [
    "SQLITE_BUSY_TIMEOUT_MS",
    "describe_db_error",
    "downgrade",
    "is_sqlite",
    "make_engine",
    "migrations_dir",
    "normalize_url",
    "pg_connect_params",
    "sqlite_file",
    "upgrade",
]

SQLITE_BUSY_TIMEOUT_MS = 5_000
SQLITE_CACHED_STATEMENTS = 16   # per connection; see make_engine
# Bound how long a flush waits for an unreachable PostgreSQL before it spools (libpq default: forever).
_PG_CONNECT_TIMEOUT_S = 5
# Server-side bound on one statement (PostgreSQL default: none); a batch upsert takes milliseconds.
_PG_STATEMENT_TIMEOUT_MS = 5_000


def describe_db_error(exc: BaseException) -> str:
    """A short, single-line description (no SQL text or bound values) for logs and reports."""
    inner = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    text = " ".join(str(inner).split())
    return f"{type(inner).__name__}: {text}"[:300]


def normalize_url(url: str | URL) -> URL:
    """Parse ``url``; PostgreSQL URLs without a driver (or with ``postgres://``) get psycopg 3."""
    try:
        u = make_url(url)
    except ArgumentError as exc:
        raise StoreError(f"invalid database URL: {exc}") from exc
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    return u


def is_sqlite(url: str | URL) -> bool:
    """True when ``url`` names a SQLite database."""
    return normalize_url(url).get_backend_name() == "sqlite"


def _safe(u: URL) -> str:
    return u.render_as_string(hide_password=True)


def _sqlite_in_memory(u: URL) -> bool:
    return u.database in (None, "", ":memory:") or (u.query.get("mode") == "memory")


def sqlite_file(url: str | URL) -> Path | None:
    """The file a SQLite URL names (absolute), or None: an in-memory database, a ``file:`` URI
    (``uri=true``), or not SQLite at all."""
    u = normalize_url(url)
    if u.get_backend_name() != "sqlite" or _sqlite_in_memory(u) or u.query.get("uri") in ("true", "1"):
        return None
    return Path(str(u.database)).resolve()


def _pg_options(u: URL, statement_timeout_ms: int) -> str:
    """The URL's own ``options`` (e.g. a ``search_path``) plus the statement timeout."""
    given = u.query.get("options")
    parts = [given] if isinstance(given, str) else list(given or ())
    if statement_timeout_ms > 0 and not any("statement_timeout" in p for p in parts):
        parts.append(f"-c statement_timeout={int(statement_timeout_ms)}")
    return " ".join(parts)


def _pg_connect_args(u: URL, connect_timeout_s: int, statement_timeout_ms: int) -> dict[str, Any]:
    """psycopg's bounds on one connection: TCP keepalives, ``connect_timeout``, statement timeout."""
    pg_args: dict[str, Any] = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
                               "keepalives_count": 3}
    if "connect_timeout" not in u.query:
        pg_args["connect_timeout"] = max(1, int(connect_timeout_s))
    options = _pg_options(u, statement_timeout_ms)
    if options:
        pg_args["options"] = options
    return pg_args


def pg_connect_params(engine: Engine) -> dict[str, Any]:
    """Keyword arguments for ``psycopg.connect`` / ``psycopg.AsyncConnection.connect`` that open a
    connection like ``engine``'s own (same server, database, user, URL options, and the bounds
    :func:`make_engine` adds with its default timeouts), for a connection outside the pool (the
    revision listener, store/revision_watch.py). PostgreSQL engines only."""
    _args, params = engine.dialect.create_connect_args(engine.url)
    params = {k: v for k, v in params.items() if k != "context"}   # SQLAlchemy's own type adapters
    params.update(_pg_connect_args(engine.url, _PG_CONNECT_TIMEOUT_S, _PG_STATEMENT_TIMEOUT_MS))
    return params


def _json_text(value: Any) -> str:
    """A JSON column's text (SQLAlchemy's ``json_serializer`` hook)."""
    return dumps(value).decode()


def make_engine(url: str | URL, *, echo: bool = False, connect_timeout_s: int = _PG_CONNECT_TIMEOUT_S,
                statement_timeout_ms: int = _PG_STATEMENT_TIMEOUT_MS,
                busy_timeout_ms: int = SQLITE_BUSY_TIMEOUT_MS,
                sqlite_synchronous: Literal["normal", "full"] = "normal") -> Engine:
    """A sync engine for ``url`` (SQLite or PostgreSQL), configured as the module docstring says.

    ``connect_timeout_s`` and ``statement_timeout_ms`` apply to PostgreSQL (0: no statement
    timeout), ``busy_timeout_ms`` and ``sqlite_synchronous`` to SQLite.
    """
    u = normalize_url(url)
    kwargs: dict[str, Any] = {"echo": echo, "future": True, "json_serializer": _json_text}
    backend = u.get_backend_name()
    if backend == "sqlite":
        memory = _sqlite_in_memory(u)
        # sqlite3 keeps up to 128 prepared statements per connection (LRU by SQL text). A batched
        # upsert of n records, and DELETE … IN of n ids, is a different SQL text for every n, and
        # one for a few hundred rows is hundreds of KB: the cache alone grew the gateway's memory
        # by tens of MB over 100 k requests. A handful of slots keeps the statements that repeat.
        connect_args: dict[str, Any] = {"cached_statements": SQLITE_CACHED_STATEMENTS}
        if memory:
            # One shared connection, or every pooled connection would see its own empty database.
            connect_args["check_same_thread"] = False
            kwargs["poolclass"] = StaticPool
        kwargs["connect_args"] = connect_args
        try:
            engine = create_engine(u, **kwargs)
        except (SQLAlchemyError, ImportError) as exc:
            raise StoreError(f"cannot create engine for {_safe(u)}: {exc}") from exc

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            try:
                if not memory:
                    cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=FULL" if sqlite_synchronous == "full" else "PRAGMA synchronous=NORMAL")
                cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
                cur.execute("PRAGMA foreign_keys=ON")
            finally:
                cur.close()

        return engine
    if backend == "postgresql":
        kwargs["pool_pre_ping"] = True
        kwargs["connect_args"] = _pg_connect_args(u, connect_timeout_s, statement_timeout_ms)
    try:
        return create_engine(u, **kwargs)
    except (SQLAlchemyError, ImportError) as exc:
        raise StoreError(f"cannot create engine for {_safe(u)}: {exc}") from exc


def migrations_dir() -> Path:
    """The Alembic script directory: the repo's ``migrations/`` first, then the packaged copy."""
    here = Path(__file__).resolve()
    candidates = (here.parents[2] / "migrations", here.parents[1] / "_migrations")
    for c in candidates:
        if (c / "env.py").is_file():
            return c
    raise StoreError("Alembic migrations not found (looked in " + ", ".join(str(c) for c in candidates) + ")")


def _alembic_config(url: str | URL) -> Any:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    # Passed as an attribute (not an ini option) so passwords never go through ConfigParser
    # interpolation and env.py can tell "given by the caller" from "read from settings".
    cfg.attributes["url"] = normalize_url(url).render_as_string(hide_password=False)
    return cfg


def upgrade(url: str | URL, revision: str = "head") -> None:
    """Run ``alembic upgrade <revision>`` on ``url``; StoreError if the database or a migration fails."""
    from alembic import command
    from alembic.util import CommandError

    try:
        command.upgrade(_alembic_config(url), revision)
    except (SQLAlchemyError, CommandError) as exc:
        raise StoreError(f"database migration failed: {exc}") from exc


def downgrade(url: str | URL, revision: str) -> None:
    """Run ``alembic downgrade <revision>`` on ``url`` (tests and operators rolling back)."""
    from alembic import command
    from alembic.util import CommandError

    try:
        command.downgrade(_alembic_config(url), revision)
    except (SQLAlchemyError, CommandError) as exc:
        raise StoreError(f"database downgrade failed: {exc}") from exc
