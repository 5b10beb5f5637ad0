"""``inferlb fleet``: see and change the fleet of a running gateway over its admin API.

::

    inferlb fleet [show] [--json]                     GET /admin/fleet as a table (or JSON)
    inferlb fleet add NAME --node-url URL --models m1,m2 [--kind vllm] [--weight W] [--capacity-tokens N]
                      [--max-concurrency N] [--price-per-hour P] [--label k=v ...]
                                                      POST /admin/nodes (probed, then slow start)
    inferlb fleet drain NAME | undrain NAME           POST /admin/nodes/NAME/drain | undrain
    inferlb fleet set NAME [--weight W] [--capacity-tokens N] [--max-concurrency N] [--price-per-hour P]
                      [--label k=v ...]               PATCH /admin/nodes/NAME
    inferlb fleet remove NAME [--force]               DELETE /admin/nodes/NAME
    inferlb fleet reload                              POST /admin/reload (fleet file + processes)

Every form takes ``--url`` (the gateway's admin listener, default http://127.0.0.1:8081) and
``--api-key`` (the admin key, also read from ``INFERLB_ADMIN_KEY``). A change prints one line and
exits 0 (and the answer's ``warnings``, one ``inferlb: warning:`` line each on stderr: ``add`` of
a node no version of its model takes in); a refusal prints the gateway's error message (which
names what is wrong: ``remove`` of a node a model version lists names the key) and exits 1; an
unreachable gateway exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

__all__ = ["fleet_main", "register"]

_ACTIONS = ("show", "add", "drain", "undrain", "set", "remove", "reload")


def register(sub: Any) -> None:
    """Add the ``fleet`` sub-command to ``sub`` (the top-level parser's sub-parsers)."""
    fl = sub.add_parser("fleet", help="see (GET /admin/fleet) and change the fleet of a running gateway")
    fl.add_argument("action", nargs="?", default="show", choices=_ACTIONS, help="default: show")
    fl.add_argument("name", nargs="?", help="the node (add, drain, undrain, set, remove)")
    fl.add_argument("--url", default="http://127.0.0.1:8081", help="the admin listener (or the public URL + admin key)")
    fl.add_argument("--api-key", dest="api_key", help="the admin key (default: $INFERLB_ADMIN_KEY)")
    fl.add_argument("--json", action="store_true", help="print the JSON instead of a table / a line")
    fl.add_argument("--node-url", dest="node_url", help="add: the node's base URL")
    fl.add_argument("--models", help="add: the models it serves, comma-separated")
    fl.add_argument("--kind", help="add: vllm, tgi, sglang, triton, ollama, llamacpp, llamacpp-python, "
                                   "openai (default) or sim")
    fl.add_argument("--weight", type=float)
    fl.add_argument("--capacity-tokens", dest="capacity_tokens", type=int)
    fl.add_argument("--max-concurrency", dest="max_concurrency", type=int)
    fl.add_argument("--price-per-hour", dest="price_per_hour", type=float)
    fl.add_argument("--label", action="append", default=[], help="k=v (repeatable)")
    fl.add_argument("--force", action="store_true", help="remove: even if not drained (in-flight requests finish)")
    fl.set_defaults(handler=fleet_main)


def _fields(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {k: getattr(args, k) for k in ("weight", "capacity_tokens", "max_concurrency",
                                                         "price_per_hour") if getattr(args, k) is not None}
    if args.label:
        labels = {}
        for item in args.label:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ValueError(f"--label {item!r}: use key=value")
            labels[key] = value
        out["labels"] = labels
    return out


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    """(method, path, JSON body) for a change; ValueError for missing arguments."""
    a, name = args.action, args.name
    if a == "reload":
        return "POST", "/admin/reload", None
    if not name:
        raise ValueError(f"fleet {a} needs a node NAME")
    if a == "add":
        if not args.node_url or not args.models:
            raise ValueError("fleet add needs --node-url URL and --models m1[,m2]")
        body: dict[str, Any] = {"name": name, "url": args.node_url,
                                "models": [m.strip() for m in args.models.split(",") if m.strip()], **_fields(args)}
        if args.kind:
            body["kind"] = args.kind
        return "POST", "/admin/nodes", body
    if a in ("drain", "undrain"):
        return "POST", f"/admin/nodes/{name}/{a}", None
    if a == "set":
        fields = _fields(args)
        if not fields:
            raise ValueError("fleet set needs one of --weight, --capacity-tokens, --max-concurrency, "
                             "--price-per-hour, --label")
        return "PATCH", f"/admin/nodes/{name}", fields
    return "DELETE", f"/admin/nodes/{name}" + ("?force=true" if args.force else ""), None


def _summary(action: str, doc: dict[str, Any]) -> str:
    if action == "reload":
        p = doc.get("process") or {}
        nodes = ", ".join(doc.get("nodes") or []) or "no node changes"
        return (f"reloaded in {doc.get('took_ms')} ms: process {p.get('file')} {p.get('previous')} → "
                f"{p.get('version')}, config {doc.get('previous_config_version')} → {doc.get('config_version')}; "
                f"{nodes}")
    st = doc.get("node_state") or {}
    state = st.get("state", "gone") if st else "gone"
    return (f"{action} {doc.get('node')}: {', '.join(doc.get('changes') or []) or 'no change'}; "
            f"state {state}; overrides revision {doc.get('revision')}")


def fleet_main(args: argparse.Namespace) -> int:
    """Run ``inferlb fleet ...`` (module docstring)."""
    import httpx

    api_key = args.api_key or os.environ.get("INFERLB_ADMIN_KEY") or None
    if args.action == "show":
        from inferlb.cli.fleet_report import fleet_command

        return fleet_command(args.url, api_key=api_key, as_json=args.json)
    try:
        method, path, body = _request(args)
    except ValueError as exc:
        print(f"inferlb: error: {exc}", file=sys.stderr)
        return 2
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        r = httpx.request(method, args.url.rstrip("/") + path, json=body, headers=headers, timeout=60.0,
                          trust_env=False)
    except httpx.HTTPError as exc:
        print(f"inferlb: error: cannot reach the gateway at {args.url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    try:
        doc = r.json()
    except ValueError:
        doc = {"error": {"message": r.text[:300]}}
    if r.status_code != 200:
        err = doc.get("error") if isinstance(doc, dict) else None
        msg = err.get("message") if isinstance(err, dict) else r.text[:300]
        print(f"inferlb: error: HTTP {r.status_code}: {' '.join(str(msg).split())}", file=sys.stderr)
        return 1
    if not args.json:
        for line in doc.get("warnings") or []:    # POST /admin/nodes: a node no model version takes in
            print(f"inferlb: warning: {' '.join(str(line).split())}", file=sys.stderr)
    print(json.dumps(doc, indent=2) if args.json else _summary(args.action, doc))
    return 0
