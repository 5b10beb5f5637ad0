"""``inferlb routing evaluate``: off-policy evaluation of a routing profile from the audit trail.

    inferlb routing evaluate --policy token-aware [--since 24h] [--until …] [--metric e2e|ttft]
                             [--failure-cost-s 30] [--limit 20000] [--json] [--database-url …]

Reads the attempts of decisions the ``learned`` profile logged with a propensity
(engine/store/learned.py), replays each under ``--policy`` (routing/ope_replay.py) and prints
the estimated mean cost per decision (seconds; lower is better) by IPS, self-normalised IPS and
doubly robust estimation with 95 % bootstrap intervals, next to what the logging policy measured.
A failed attempt costs ``--failure-cost-s``. Exit status 1 when there is nothing to evaluate on.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from .engine.errors import InferlbError
from .engine.routing.ope_replay import MIN_ESS, REWARD_MODELS, LoggedDecision, evaluate, softmax_policy
from .engine.store.db import make_engine
from .engine.store.learned import LearnedAttempt, learned_attempts
from .engine.store.queries import parse_time

__all__ = ["add_routing_parser", "reward_of", "routing_command"]


def add_routing_parser(sub: Any) -> None:
    r = sub.add_parser("routing", help="routing policies: off-policy evaluation from the audit trail")
    rs = r.add_subparsers(dest="routing_cmd", required=True)
    e = rs.add_parser("evaluate", help="estimate how a routing profile would have done on logged decisions")
    e.add_argument("--policy", required=True, help="a profile name (token-aware, learned, …)")
    e.add_argument("--since", help="ISO time, epoch seconds, or a span back from now (30m, 24h, 7d)")
    e.add_argument("--until")
    e.add_argument("--metric", choices=["e2e", "ttft"], default="e2e")
    e.add_argument("--failure-cost-s", dest="failure_cost_s", type=float, default=30.0)
    e.add_argument("--limit", type=int, default=20_000, help="the most recent decisions read")
    e.add_argument("--bootstrap", type=int, default=500)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--softmax", type=float, default=None, metavar="T",
                   help="estimate a stochastic version of the policy (softmax over its scores at temperature T), "
                        "which the log can overlap where the deterministic policy cannot")
    e.add_argument("--min-ess", dest="min_ess", type=float, default=MIN_ESS,
                   help=f"refuse (insufficient overlap) below this effective sample size ({MIN_ESS:g})")
    e.add_argument("--reward-model", dest="reward_model", choices=list(REWARD_MODELS), default="fitted",
                   help="DR's reward model: fitted on the logged costs (default) or the logged predictions")
    e.add_argument("--json", action="store_true")
    e.add_argument("--database-url", dest="database_url")
    e.add_argument("--config", type=Path)


def reward_of(a: LearnedAttempt, metric: str, failure_cost_s: float) -> float | None:
    """The cost of one attempt: its e2e (or streamed TTFT) seconds; a failure costs ``failure_cost_s``."""
    if a.outcome != "ok":
        return failure_cost_s
    if metric == "ttft":
        return a.ttfb_s if a.stream else None
    return a.e2e_s


def routing_command(args: argparse.Namespace, database_url: str) -> int:
    try:
        now = time.time()
        since = parse_time(args.since, param="since", now=now)
        until = parse_time(args.until, param="until", now=now)
        engine = make_engine(database_url)
        try:
            rows = learned_attempts(engine, since=since, until=until, limit=args.limit)
        finally:
            engine.dispose()
    except InferlbError as exc:
        print(f"error: {exc}")
        return 2
    logged = []
    for a in rows:
        r = reward_of(a, args.metric, args.failure_cost_s)
        if r is not None:
            logged.append(LoggedDecision(a.model, a.learned, r))
    # (getattr: a Namespace built by hand, as the integration test does, may lack the newer options)
    softmax = getattr(args, "softmax", None)
    try:
        policy: Any = args.policy if softmax is None else softmax_policy(args.policy, softmax, seed=args.seed)
    except (ValueError, InferlbError) as exc:
        print(f"error: {exc}")
        return 2
    out = evaluate(logged, policy, metric=args.metric, n_boot=args.bootstrap, seed=args.seed,
                   min_ess=getattr(args, "min_ess", MIN_ESS), reward_model=getattr(args, "reward_model", "fitted"))
    out["decisions_read"] = len(rows)
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        _print(out)
    return 1 if "error" in out else 0


def _print(out: dict[str, Any]) -> None:
    print(f"policy {out['policy']}: mean {out['metric']} cost per decision (seconds, lower is better)")
    print(f"  decisions read: {out['decisions_read']}, skipped: {out['skipped'] or 'none'}")
    if "error" in out:
        print(f"  {out['error']}")
        return
    print(f"  evaluated on {out['n']} decisions (effective sample size {out['ess']:.0f})")
    print(f"  logging policy measured: {out['logged']:.4f}")
    if "refused" in out:
        print(f"  REFUSED: {out['refused']}")
        print("  (try --softmax T: a stochastic version of the policy that the log overlaps)")
        return
    for k, label in (("ips", "IPS"), ("snips", "self-normalised IPS"), ("dr", "doubly robust")):
        e = out[k]
        print(f"  {label:22} {e['value']:.4f}   95% CI [{e['ci_low']:.4f}, {e['ci_high']:.4f}]")
    print(f"  DR reward model: {out['reward_model']}. Accuracy (±5 % in the simulator) holds only where the log "
          "overlaps the policy and a decision's cost hardly depends on where the others went (light load); "
          "at high load an estimate of a policy unlike the logging one can be off by 20 % (docs/benchmarks.md)")
