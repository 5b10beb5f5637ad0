"""``inferlb routing evaluate``: off-policy evaluation of a routing profile from the audit trail.

    inferlb routing evaluate --policy token-aware [--since 24h] [--until …] [--metric e2e|ttft]
                             [--failure-cost-s 30] [--limit 20000] [--json] [--database-url …]
                             [--against learned|logged --max-regression 0.05 --estimator snips]

Reads the attempts of decisions the ``learned`` profile logged with a propensity
(learned/audit.py), replays each under ``--policy`` (routing/ope_replay.py) and prints
the estimated mean cost per decision (seconds; lower is better) by IPS, self-normalised IPS and
doubly robust estimation with 95 % bootstrap intervals, next to what the logging policy measured.
A failed attempt costs ``--failure-cost-s``. Exit status 1 when there is nothing to evaluate on.

With ``--against`` it is the check a gated reload runs (``routing.require_evaluation``,
routing/gate.py): ``--policy`` against a current profile (``logged``: the policy that logged the
decisions, by what it measured) with ``--max-regression`` and ``--min-ess``; it prints the
verdict and exits 1 when the change would be refused (a CI step before a reload; never for a
fixed heuristic ``--policy``, the safe direction: its JSON's ``evaluation_passed`` says what the
evaluation alone decided).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from inferlb.cli.shared import DeferredParser, settings_from
from inferlb.errors import InferlbError

__all__ = ["register", "routing_command"]


def register(sub: Any) -> None:
    """Add ``routing`` to the ``inferlb`` parser's subcommands."""
    r = sub.add_parser("routing", help="routing policies: off-policy evaluation from the audit trail")
    # evaluate's options show the evaluator's defaults and choices, which import the routing core
    # (numpy): they are added when `routing evaluate` is chosen, not on every run of `inferlb`.
    rs = r.add_subparsers(dest="routing_cmd", required=True, parser_class=DeferredParser)
    rs.add_parser("evaluate", help="estimate how a routing profile would have done on logged decisions",
                  add_arguments=_evaluate_options)
    r.set_defaults(handler=_routing)


def _evaluate_options(e: argparse.ArgumentParser) -> None:
    from inferlb.routing.ope_replay import MIN_ESS, REWARD_MODELS

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
    e.add_argument("--against", metavar="PROFILE",
                   help="judge --policy against this current profile ('logged': the policy that logged the "
                        "decisions) as a gated reload would; exit status 1 when it would be refused")
    e.add_argument("--max-regression", dest="max_regression", type=float, default=0.05,
                   help="with --against: how much worse (a fraction) the upper end of the policy's 95 %% "
                        "interval may be (0.05)")
    e.add_argument("--estimator", choices=["snips", "dr", "ips", "switch_dr"], default="snips",
                   help="with --against: the estimator compared (snips)")
    e.add_argument("--json", action="store_true")
    e.add_argument("--database-url", dest="database_url")
    e.add_argument("--config", type=Path)


def _routing(args: argparse.Namespace) -> int:
    return routing_command(args, settings_from(args).database_url)


def routing_command(args: argparse.Namespace, database_url: str) -> int:
    """Run ``inferlb routing evaluate`` on the audit database at ``database_url`` (the module
    docstring says what it prints and how it exits)."""
    from inferlb.learned.audit import learned_attempts
    from inferlb.learned.policy_gate import logged_decisions
    from inferlb.routing.ope_replay import MIN_ESS, evaluate, softmax_policy
    from inferlb.store.db import make_engine
    from inferlb.store.report_params import parse_time

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
    logged = logged_decisions(rows, args.metric, args.failure_cost_s)
    # (getattr: a Namespace built by hand, as the integration test does, may lack the newer options)
    if getattr(args, "against", None) is not None:
        return _gate(args, logged, len(rows))
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


def _gate(args: argparse.Namespace, logged: list[Any], read: int) -> int:
    """``--against``: the verdict a gated reload would reach (routing/gate.py)."""
    from inferlb.routing.gate import EvaluationRequirement, judge
    from inferlb.routing.ope_replay import MIN_ESS

    try:
        req = EvaluationRequirement(min_ess=getattr(args, "min_ess", MIN_ESS),
                                    max_regression=getattr(args, "max_regression", 0.05),
                                    estimator=getattr(args, "estimator", "snips"), metric=args.metric,
                                    failure_cost_s=args.failure_cost_s, bootstrap=args.bootstrap, seed=args.seed)
        against = "the logging policy" if args.against == "logged" else args.against
        verdict = judge(logged, args.policy, against, req, current_logged=args.against == "logged")
    except (ValueError, InferlbError) as exc:
        print(f"error: {exc}")
        return 2
    verdict["decisions_read"] = read
    if args.json:
        print(json.dumps(verdict, indent=1))
    else:
        print(("PASSED: " if verdict["passed"] else "REFUSED: ") + verdict["reason"])
    return 0 if verdict["passed"] else 1


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
    for k, label in (("ips", "IPS"), ("snips", "self-normalised IPS"), ("dr", "doubly robust"),
                     ("switch_dr", "SWITCH-DR (τ 10)")):
        e = out[k]
        print(f"  {label:22} {e['value']:.4f}   95% CI [{e['ci_low']:.4f}, {e['ci_high']:.4f}]")
    print(f"  DR reward model: {out['reward_model']}. Accuracy (±5 % in the simulator) holds only where the log "
          "overlaps the policy and a decision's cost hardly depends on where the others went (light load); "
          "at high load an estimate of a policy unlike the logging one can be off by 20 % (docs/benchmarks.md)")
