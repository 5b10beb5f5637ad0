"""``inferlb fleet``: the fleet of a running gateway as a table (from ``GET /admin/fleet``).

Contract: :func:`fleet_command` fetches the admin API of the gateway at ``url`` (httpx, a short
timeout, the admin key as a bearer token when given), prints a rich table (or the JSON with
``as_json``) and returns the exit status: 0, or 2 when the gateway cannot be reached or answers
an error (the message, on stderr, says which).
"""

from __future__ import annotations

import json
import time
from typing import Any, TextIO

import httpx
from rich.console import Console
from rich.table import Table

__all__ = ["fleet_command", "fleet_table"]

_STYLE = {"healthy": "green", "cooldown": "yellow", "half_open": "cyan", "draining": "yellow",
          "ejected": "red", "down": "red", "loading": "magenta", "drained": "blue"}


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def _load(n: dict[str, Any]) -> str:
    parts = [f"{n.get('inflight_requests', 0)} req"]
    if n.get("waiting") is not None:
        parts.append(f"{n['waiting']} waiting")
    if n.get("kv_usage") is not None:
        parts.append(f"KV {100 * float(n['kv_usage']):.0f}%")
    return ", ".join(parts)


def _samples(n: dict[str, Any]) -> str:
    out = []
    for src, s in sorted((n.get("samples") or {}).items()):
        mark = "ok" if s.get("ok") else (s.get("error") or "fail")
        out.append(f"{src} {mark} ({_age(s.get('age_s'))} ago)")
    return "\n".join(out) or "-"


def fleet_table(doc: dict[str, Any]) -> Table:
    panic = doc.get("panic_models") or []
    title = "inferlb fleet" + (f"  [red]PANIC: {', '.join(panic)}[/red]" if panic else "")
    t = Table(title=title, show_lines=True)
    for col in ("node", "state", "for", "why", "load", "slow start", "ejections", "last samples"):
        t.add_column(col)
    for n in doc.get("nodes") or []:
        state = str(n.get("state"))
        slow = n.get("slow_start_factor")
        name = str(n.get("name")) + (" (admin)" if n.get("source") == "admin" else "")
        t.add_row(name, f"[{_STYLE.get(state, 'white')}]{state}[/]", _age(n.get("for_s")),
                  str(n.get("why") or ""), _load(n), "-" if slow is None else f"{100 * float(slow):.0f}%",
                  str(n.get("ejections", 0)), _samples(n))
    return t


def fleet_command(url: str, *, api_key: str | None = None, as_json: bool = False, timeout_s: float = 5.0,
                  out: TextIO | None = None) -> int:
    console = Console(file=out, soft_wrap=False, width=160)
    errors = Console(stderr=True, soft_wrap=True)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.get(url.rstrip("/") + "/admin/fleet", headers=headers, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as exc:
        errors.print(f"inferlb: error: cannot reach the gateway at {url}: {type(exc).__name__}: {exc}")
        return 2
    if r.status_code != 200:
        errors.print(f"inferlb: error: {url}/admin/fleet answered HTTP {r.status_code}: {r.text[:300]}",
                     markup=False)
        return 2
    doc = r.json()
    if as_json:
        console.file.write(json.dumps(doc, indent=2) + "\n")
        return 0
    console.print(fleet_table(doc))
    events = doc.get("events") or []
    if events:
        now = time.time()
        console.print("recent node events:")
        for e in events[:10]:
            console.print(f"  {_age(now - float(e['at']))} ago  {e['node']}: {e['from']} → {e['to']}  ({e['reason']})")
    return 0
