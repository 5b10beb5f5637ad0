"""``inferlb rollout start|status|abort``: canary rollouts of a running gateway (``/admin/rollouts``).

::

    inferlb rollout start --model demo-llm --from v1 --to v2 [--steps 1,5,25,50,100]
                          [--min-requests N] [--confidence C] [--max-error-rate-increase X]
                          [--max-slo-miss-increase X] [--min-step-s S] [--max-step-s S] [--window-s S]
    inferlb rollout status [ID] [--model M] [--json]
    inferlb rollout abort ID

Every subcommand takes ``--url`` (default http://127.0.0.1:8081, the admin listener) and
``--api-key`` (the admin key when one is set; default ``INFERLB_ADMIN_KEY``). A refusal prints the gateway's error
message on one line and exits 1; an unreachable gateway exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

__all__ = ["register", "rollout_command"]

_CRITERIA = ("min_requests", "confidence", "max_error_rate_increase", "max_slo_miss_increase", "max_latency_ratio",
             "min_step_s", "max_step_s", "window_s", "ttft_max_s", "e2e_max_s")


def register(sub: Any) -> None:
    """Add ``rollout`` to the ``inferlb`` parser's subcommands."""
    ro = sub.add_parser("rollout", help="canary rollouts of model versions on a running gateway")
    actions = ro.add_subparsers(dest="action", required=True)

    # --url and --api-key are taken before the action (`inferlb rollout --url U status`, as
    # `inferlb fleet --url U show`) or after it: the parent holds the defaults, and the action's
    # copies default to SUPPRESS so an action given without them keeps what the parent parsed.
    ro.add_argument("--url", default="http://127.0.0.1:8081", help="the admin listener (or the public URL + admin key)")
    ro.add_argument("--api-key", dest="api_key", help="the admin key (default: INFERLB_ADMIN_KEY)")

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--url", default=argparse.SUPPRESS,
                        help="the admin listener (or the public URL + admin key)")
        sp.add_argument("--api-key", dest="api_key", default=argparse.SUPPRESS,
                        help="the admin key (default: INFERLB_ADMIN_KEY)")

    st = actions.add_parser("start", help="start moving a model's traffic from one version to another")
    common(st)
    st.add_argument("--model", required=True)
    st.add_argument("--from", dest="from_version", required=True, help="the version serving now")
    st.add_argument("--to", dest="to_version", required=True, help="the new version")
    st.add_argument("--steps", help="percentages, comma-separated, ending with 100 (default: the fleet's)")
    for name in _CRITERIA:
        kind = int if name == "min_requests" else float
        st.add_argument("--" + name.replace("_", "-"), dest=name, type=kind)
    st.add_argument("--json", action="store_true")
    ss = actions.add_parser("status", help="rollouts and the versions' weights")
    common(ss)
    ss.add_argument("id", nargs="?", help="one rollout, with its events")
    ss.add_argument("--model")
    ss.add_argument("--json", action="store_true")
    ab = actions.add_parser("abort", help="stop a running rollout (the weights from before it come back)")
    common(ab)
    ab.add_argument("id")
    ab.add_argument("--json", action="store_true")
    ro.set_defaults(handler=rollout_command)


def _fail(r: httpx.Response) -> int:
    try:
        msg = r.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        msg = r.text[:300]
    print(f"inferlb: error: HTTP {r.status_code}: {msg}", file=sys.stderr)
    return 1


def _line(r: dict[str, Any]) -> str:
    nxt = r.get("next_percent")
    state = r["state"] + (f" at {r['percent']:g}%" + (f" (next {nxt:g}%)" if nxt is not None else "")
                          if r["state"] == "running" else "")
    return f"{r['id']}  {r['model']}: {r['from_version']} → {r['to_version']}  {state}" + (
        f"  — {r['reason']}" if r.get("reason") else "")


def _show(doc: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    if "data" in doc:
        for r in doc["data"]:
            print(_line(r))
        for m in doc.get("versions") or []:
            split = ", ".join(f"{v['name']} {v['share'] * 100:g}%" for v in m["versions"])
            print(f"{m['model']}: {split}")
        return
    print(_line(doc))
    last = (doc.get("last_decision") or {}).get("reason")
    if last:
        print(f"  last decision: {last}")
    for e in doc.get("events") or []:
        at = time.strftime("%H:%M:%S", time.localtime(e["at"]))
        print(f"  {at}  {e['action']:8} {e['from_percent']:g}% → {e['to_percent']:g}%  {e['reason']}")


def rollout_command(args: argparse.Namespace) -> int:
    """Run ``inferlb rollout ACTION`` against the gateway at ``--url`` (the module docstring says how it exits)."""
    import httpx

    key = args.api_key or os.environ.get("INFERLB_ADMIN_KEY")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    base = args.url.rstrip("/")
    try:
        with httpx.Client(base_url=base, headers=headers, timeout=10.0, trust_env=False) as http:
            if args.action == "start":
                body: dict[str, Any] = {"model": args.model, "from_version": args.from_version,
                                        "to_version": args.to_version}
                if args.steps:
                    try:
                        body["steps"] = [float(s) for s in args.steps.split(",") if s.strip()]
                    except ValueError:
                        print("inferlb: error: --steps must be numbers separated by commas", file=sys.stderr)
                        return 1
                crit = {n: getattr(args, n) for n in _CRITERIA if getattr(args, n) is not None}
                if crit:
                    body["criteria"] = crit
                r = http.post("/admin/rollouts", json=body)
                if r.status_code != 201:
                    return _fail(r)
            elif args.action == "abort":
                r = http.post(f"/admin/rollouts/{args.id}/abort")
                if r.status_code != 200:
                    return _fail(r)
            elif args.id:
                r = http.get(f"/admin/rollouts/{args.id}")
                if r.status_code != 200:
                    return _fail(r)
            else:
                r = http.get("/admin/rollouts", params={"model": args.model} if args.model else None)
                if r.status_code != 200:
                    return _fail(r)
    except httpx.HTTPError as exc:
        print(f"inferlb: error: cannot reach the gateway at {base}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    _show(r.json(), args.json)
    return 0
