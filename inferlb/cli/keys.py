"""``inferlb keys create|list|revoke``: tenant keys straight in the audit database.

Contract: works on ``INFERLB_DATABASE_URL`` (or ``--database-url``) without a running gateway;
SQLite databases are upgraded first (as the gateway does), PostgreSQL ones need
``inferlb db upgrade``. ``create`` prints the key once (it is stored only as a SHA-256 digest),
with ``--json`` as one JSON object. Running gateways accept a new key at once (they look an
unknown key up before a 401); a revoked key is dropped at once on PostgreSQL (the store's
``NOTIFY``) and within ``admission.keys_refresh_s`` (5 s by default) on SQLite. A database error
exits 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from inferlb.cli.shared import settings_from
from inferlb.errors import StoreError

__all__ = ["keys_command", "register"]


def register(sub: Any) -> None:
    """Add the ``keys`` subcommand to the ``inferlb`` parser."""
    k = sub.add_parser("keys", help="tenant API keys: create, list, revoke")
    ks = k.add_subparsers(dest="action", required=True)
    c = ks.add_parser("create", help="create a key; prints it once")
    c.add_argument("--tenant", required=True)
    c.add_argument("--name")
    c.add_argument("--models", help="comma-separated models the key may use (default: all)")
    c.add_argument("--priority-ceiling", dest="priority_ceiling", help="highest priority class it may ask for")
    c.add_argument("--rpm", type=int, help="requests per minute")
    c.add_argument("--tpm", type=int, help="tokens per minute (prompt + max output, corrected by usage)")
    c.add_argument("--max-parallel", dest="max_parallel", type=int, help="requests in flight at once")
    c.add_argument("--budget", type=float, help="spend budget (the fleet's price units)")
    c.add_argument("--expires-in-days", dest="expires_in_days", type=float)
    c.add_argument("--pin-versions", dest="pin_versions", action="store_true",
                   help="may pin a model version with the x-inferlb-model-version header")
    c.add_argument("--json", action="store_true")
    lst = ks.add_parser("list", help="list keys (never the keys themselves)")
    lst.add_argument("--tenant")
    lst.add_argument("--active", action="store_true", help="hide revoked keys")
    lst.add_argument("--json", action="store_true")
    r = ks.add_parser("revoke", help="revoke a key by its id")
    r.add_argument("key_id")
    for sp in (c, lst, r):
        sp.add_argument("--database-url", dest="database_url")
    k.set_defaults(handler=_keys)


def _keys(args: argparse.Namespace) -> int:
    return keys_command(args, settings_from(args).database_url)


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise SystemExit(f"inferlb: error: --{name.replace('_', '-')} must be > 0")


def keys_command(args: argparse.Namespace, database_url: str) -> int:
    """Run ``inferlb keys …`` against ``database_url``."""
    from inferlb.admission.store import create_key, list_keys, revoke_key
    from inferlb.store.db import is_sqlite, make_engine, upgrade

    if is_sqlite(database_url):
        upgrade(database_url)
    engine = make_engine(database_url)
    try:
        if args.action == "create":
            for n in ("rpm", "tpm", "max_parallel", "expires_in_days"):
                _positive(n, getattr(args, n))
            if args.budget is not None and args.budget < 0:
                raise SystemExit("inferlb: error: --budget must be ≥ 0")
            now = time.time()
            models = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
            key, secret = create_key(engine, tenant=args.tenant, now=now, name=args.name, models=models,
                                     priority_ceiling=args.priority_ceiling, rpm=args.rpm, tpm=args.tpm,
                                     max_parallel=args.max_parallel, budget=args.budget,
                                     expires_at=now + args.expires_in_days * 86_400 if args.expires_in_days else None,
                                     pin_versions=args.pin_versions)
            if args.json:
                print(json.dumps({**key.public(), "key": secret}))
            else:
                print(f"created {key.id} for tenant {key.tenant}")
                print(f"key (shown once, store it now): {secret}")
        elif args.action == "list":
            keys = list_keys(engine, tenant=args.tenant, include_revoked=not args.active)
            if args.json:
                print(json.dumps([k.public() for k in keys]))
            else:
                _table(keys)
        else:
            gone = revoke_key(engine, args.key_id, now=time.time())
            if gone is None:
                print(f"inferlb: error: no key with id {args.key_id!r}")
                return 1
            print(f"revoked {gone.id} (tenant {gone.tenant})")
    except StoreError as exc:
        print(f"inferlb: error: {exc}")
        return 2
    finally:
        engine.dispose()
    return 0


def _table(keys: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table("id", "tenant", "name", "hint", "models", "ceiling", "rpm", "tpm", "parallel", "budget", "spent",
              "state")
    now = time.time()
    for k in keys:
        state = "revoked" if k.revoked_at else ("expired" if not k.active(now) else "active")
        t.add_row(k.id, k.tenant, k.name or "", k.hint, ",".join(k.models) if k.models else "*",
                  k.priority_ceiling or "*", *(str(v) if v is not None else "-" for v in
                                               (k.rpm, k.tpm, k.max_parallel, k.budget)),
                  f"{k.spent:.4f}", state)
    Console(width=200).print(t)
