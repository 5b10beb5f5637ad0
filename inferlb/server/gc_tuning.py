"""The garbage collector of a serving process, tuned once its start-up is done.

Why (docs/benchmarks.md, "The request path profiled again"): after start-up the process holds
~154,000 long-lived container objects (the app, SQLAlchemy, pydantic, FastAPI, the parsed
processes). CPython's full (generation 2) collection walks them all: under load it came every
~1,000–2,000 requests and paused the event loop for 100–314 ms, every request in flight with it,
which was the gateway's p99. Generation 0 collections at the interpreter's threshold of 700 net
allocations ran every ~9 requests at c=16, mostly finding nothing (request objects die by reference
count).

:func:`tune_gc`:

* ``freeze``: one full collection, then :func:`gc.freeze` moves every surviving object to the
  permanent generation, which later collections skip. Objects created afterwards are collected as
  before; a start-up object that later becomes part of an unreachable cycle is not reclaimed (a
  fleet reload's old snapshot, at most once per object), a bounded cost.
* ``gen0_threshold``: generation 0's threshold (``gc.set_threshold``; generations 1 and 2 keep
  theirs). ``0`` leaves the interpreter's.

Only ``inferlb serve``/``demo`` call it (``cli.py``), once the server has started: tests that build
apps in one process keep the interpreter's collector.
"""

from __future__ import annotations

import gc
import logging

__all__ = ["tune_gc"]

log = logging.getLogger("inferlb")


def tune_gc(*, freeze: bool, gen0_threshold: int) -> dict[str, int]:
    """Apply the settings (module docstring); returns what was done: ``frozen`` objects and the
    ``gen0_threshold`` now in force."""
    frozen = 0
    if freeze:
        gc.collect()
        gc.freeze()
        frozen = gc.get_freeze_count()
    if gen0_threshold > 0:
        _, gen1, gen2 = gc.get_threshold()
        gc.set_threshold(gen0_threshold, gen1, gen2)
    threshold = gc.get_threshold()[0]
    log.info("garbage collector: %d start-up objects frozen, generation 0 threshold %d", frozen, threshold)
    return {"frozen": frozen, "gen0_threshold": threshold}
