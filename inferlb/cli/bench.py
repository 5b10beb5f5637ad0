"""``inferlb bench WHAT [ARGS…]``: the benchmarks that ship with the wheel (inferlb/bench).

::

    inferlb bench overhead            gateway overhead vs direct / floor proxy / nginx
    inferlb bench overload            admission control at 2× / 5× capacity, noisy neighbour (on vs off)
    inferlb bench replicas            1, 2, 3 replicas on one Redis: req/s, CPU per request, admission cost
    inferlb bench run|compare|capacity  open-loop load against simulated fleets (routing strategies)

``ARGS`` go to the benchmark's own parser (``inferlb bench WHAT --help``); the exit status is the
benchmark's. The studies that do not ship live in the repository's benchmarks/ folder
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
from typing import Any

from inferlb.plugins import Table

__all__ = ["BENCHES", "bench_command", "register"]

#: WHAT → the "module:attr" of its entry point (a :class:`~inferlb.plugins.Table`, loaded when it runs).
BENCHES = Table("benchmark", {
    "overhead": "inferlb.bench.overhead:main",
    "run": "inferlb.bench.loadgen.cli:main",
    "compare": "inferlb.bench.loadgen.cli:main",
    "capacity": "inferlb.bench.loadgen.cli:main",
    "overload": "inferlb.bench.overload:main",
    "replicas": "inferlb.bench.replicas:main",
}, custom=False)

# The arguments an entry point takes before ``ARGS``: the load generator's one entry point serves
# three commands and is told which.
_LEAD: dict[str, tuple[str, ...]] = {"run": ("run",), "compare": ("compare",), "capacity": ("capacity",)}


def register(sub: Any) -> None:
    """Add ``bench`` to the ``inferlb`` parser's subcommands."""
    b = sub.add_parser("bench", help="benchmarks")
    b.add_argument("what", choices=list(BENCHES))
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(handler=bench_command)


def bench_command(args: argparse.Namespace) -> int:
    """Run ``inferlb bench WHAT ARGS``: WHAT's entry point with ``ARGS``."""
    return int(BENCHES.load(args.what)(*_LEAD.get(args.what, ()), args.rest))
