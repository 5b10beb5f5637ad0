"""The end-of-request hook: named steps run in order, once per request, whichever way it ended.

``app.py`` lists the steps (:func:`inferlb.app.request_end`); every driver of the request
process calls the hook exactly once per request through ``Runtime.on_request_end`` (the
``audit/record`` task, and the gateway for requests that end outside the process: invalid input,
a client gone, an engine failure).

Contract: :class:`RequestEnd` is synchronous and never raises. A step that fails is logged once
(per step) and counted in :attr:`RequestEnd.errors`; the steps after it still run, so a failing
metrics hook never costs the audit record, and a failing audit never keeps an admission slot.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence

from inferlb.store.records import RequestRecord

__all__ = ["EndStep", "RequestEnd"]

log = logging.getLogger("inferlb")

EndStep = tuple[str, Callable[[RequestRecord], None]]


class RequestEnd:
    """Callable: runs ``steps`` (name, function) in order on the ended request's record."""

    __slots__ = ("errors", "steps")

    def __init__(self, steps: Sequence[EndStep]) -> None:
        self.steps: tuple[EndStep, ...] = tuple(steps)
        self.errors: Counter[str] = Counter()

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.steps]

    def __call__(self, rec: RequestRecord) -> None:
        for name, step in self.steps:
            try:
                step(rec)
            except Exception:
                self.errors[name] += 1
                if self.errors[name] == 1:
                    log.exception("end of request %s: step %r failed (further failures are counted only)",
                                  rec.request_id, name)
