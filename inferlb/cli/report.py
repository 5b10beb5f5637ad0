"""``inferlb report sla|cost|capacity``: reports from the audit trail.

::

    inferlb report sla|cost [--since T] [--until T] [--group-by K[,K]] [--bucket 1h] [--csv FILE]
                            [--format table|json|csv] [--database-url URL] [--config FLEET]
    inferlb report capacity --config FLEET [--since T] [--until T] [--bucket B] [--format table|json]

``sla`` and ``cost`` print the tables of inferlb/cli/audit.py (``cost`` prices nodes from the fleet
file; without ``--config`` every cost is 0, said on stderr); ``capacity`` prints the scaling advice
per model and GPU type (inferlb/cli/autoscale.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from inferlb.cli.shared import settings_from

__all__ = ["register", "report_command"]


def register(sub: Any) -> None:
    """Add ``report`` to the ``inferlb`` parser's subcommands."""
    r = sub.add_parser("report", help="reports from the audit trail")
    r.add_argument("kind", choices=["sla", "cost", "capacity"])
    r.add_argument("--since")
    r.add_argument("--until")
    r.add_argument("--group-by", dest="group_by", help="model, version, node, tenant, priority, stream, served "
                   "(the model that served: a model alias's tier) (comma-separated) or none; "
                   "default model (sla), tenant (cost)")
    r.add_argument("--bucket", help="time buckets, e.g. 5m, 1h, 1d")
    r.add_argument("--csv", type=Path, help="also write the report as CSV to this file")
    r.add_argument("--format", default="table", choices=["table", "json", "csv"])
    r.add_argument("--database-url", dest="database_url")
    r.add_argument("--config", type=Path)
    r.set_defaults(handler=report_command)


def report_command(args: argparse.Namespace) -> int:
    """Run ``inferlb report KIND`` (the module docstring says what it prints)."""
    from inferlb.cli.audit import report_cost, report_sla
    from inferlb.cost import node_prices

    settings = settings_from(args)
    fleet = settings.resolved_fleet() if settings.config is not None else None
    common: dict[str, Any] = {"since": args.since, "until": args.until, "bucket": args.bucket, "fmt": args.format,
                              "csv_path": args.csv}
    if args.kind == "capacity":
        from inferlb.cli.autoscale import capacity_command

        return capacity_command(args, settings.database_url, fleet)
    if args.kind == "cost":
        if fleet is None:
            print("inferlb: note: no --config: node prices are unknown, every cost is 0", file=sys.stderr)
        prices = node_prices(fleet.nodes, fleet.observability.finops) if fleet is not None else {}
        currency = fleet.observability.finops.currency if fleet is not None else "USD"
        print(report_cost(settings.database_url, prices=prices, currency=currency,
                          group_by=args.group_by or "tenant", **common))
    else:
        print(report_sla(settings.database_url, group_by=args.group_by or "model",
                         slos=list(fleet.slos) if fleet is not None else [], **common))
    return 0
