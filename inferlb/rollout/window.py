"""Per-version outcome counts over a sliding window, fed as requests end.

Contract:

* :meth:`VersionWindow.observe` is a step of the end-of-request hook (``app.request_end``): it runs
  on the event loop once per finished request, does dictionary and deque work only, and ignores
  requests of models that have no versions.
* Counts are kept in one-second buckets per (model, version) for ``max_age_s``; older buckets are
  dropped as new ones are made, so memory is bounded by versions × ``max_age_s``.
* An attempt counts for the version it was routed to (each routing decision of the record carries
  ``version``); a request's SLO outcome counts for the version that served it
  (``record.model_version``). What counts as a failed attempt and as an SLO miss:
  :mod:`.guard`'s docstring. SLO thresholds per model come from :meth:`set_slo` (a rollout's
  criteria) or the fleet's ``slos:``.
* A successful request also adds the node's times of its served attempt (its last) to the served
  version's latency sums, per metric (:mod:`.guard`'s docstring: ``ttft`` and ``tpot`` of
  streams, ``e2e`` of the rest), from the attempt's own timestamps: the node's time after the
  gateway's queue, not the client's. A time that is not positive (a clock step, a record without
  them) is left out: a log needs it positive.
* Times are the injected clock's monotonic seconds.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable
from typing import Any

from inferlb.rollout.guard import LATENCY_METRICS, Counts
from inferlb.rollout.stats import LogMoments
from inferlb.store.records import RequestRecord
from inferlb.types import Clock

__all__ = ["Slo", "VersionWindow", "attempt_failed", "node_times"]

Slo = tuple[float | None, float | None]     # (ttft_max_s, e2e_max_s)

_FAILED = frozenset({"retryable", "midstream_error"})


def attempt_failed(outcome: str, http_status: int | None) -> bool | None:
    """True: a failure of the node's version; False: a success; None: counts as neither (client
    gone, 429 busy, another 4xx: the request's own fault, an attempt still unknown)."""
    if outcome == "ok":
        return False
    if http_status == 429 or outcome in ("client_closed", "unknown"):
        return None
    if outcome in _FAILED:
        return True
    if outcome == "fatal":
        return None if http_status is not None and 400 <= http_status < 500 else True
    return None


def node_times(rec: RequestRecord) -> dict[str, float]:
    """The served attempt's node times of a successful request, by latency metric (seconds; only
    the positive ones): ``ttft`` and ``tpot`` for a stream, ``e2e`` otherwise."""
    if rec.status != "ok" or not rec.attempts:
        return {}
    a = rec.attempts[-1]
    out: dict[str, float] = {}
    if a.outcome != "ok" or a.ended_at is None:
        return out
    if rec.stream:
        if a.first_byte_at is not None:
            out["ttft"] = a.first_byte_at - a.started_at
            tokens = rec.completion_tokens or 0
            if tokens >= 2:
                out["tpot"] = (a.ended_at - a.first_byte_at) / (tokens - 1)
    else:
        out["e2e"] = a.ended_at - a.started_at
    return {k: v for k, v in out.items() if v > 0 and math.isfinite(v)}


class _Bucket:
    __slots__ = ("attempts", "failed", "latency", "ok", "sec", "slo_missed")

    def __init__(self, sec: int) -> None:
        self.sec = sec
        self.attempts = self.failed = self.ok = self.slo_missed = 0
        self.latency: dict[str, list[float]] = {}    # metric → [n, Σ log t, Σ (log t)²]


class VersionWindow:
    """See the module docstring. ``versioned(model)`` says whether a model has versions."""

    def __init__(self, clock: Clock, versioned: Callable[[str], bool], *, slos: Iterable[Any] = (),
                 max_age_s: float = 3600.0) -> None:
        self.clock = clock
        self.versioned = versioned
        self.max_age_s = max_age_s
        self._default_slo: dict[str, Slo] = {}
        self.set_default_slos(slos)
        self._slo: dict[str, Slo] = {}
        self._buckets: dict[tuple[str, str], collections.deque[_Bucket]] = {}
        self.totals: dict[tuple[str, str], list[int]] = {}   # since start: attempts, failed, ok, slo_missed

    # -- SLO thresholds -------------------------------------------------------------------------------

    def slo_of(self, model: str) -> Slo:
        """The thresholds in force for ``model``: a rollout's, else the model's SLO, else ``*``'s."""
        got = self._slo.get(model) or self._default_slo.get(model) or self._default_slo.get("*")
        return got if got is not None else (None, None)

    def set_default_slos(self, slos: Iterable[Any]) -> None:
        """The fleet's ``slos:`` (at start-up, and again on a reload)."""
        self._default_slo = {s.model: (s.ttft_max_s, s.e2e_max_s) for s in slos}

    def set_slo(self, model: str, slo: Slo | None) -> None:
        """Thresholds for ``model`` (a rollout's criteria); None: back to the fleet's."""
        if slo is None or slo == (None, None):
            self._slo.pop(model, None)
        else:
            self._slo[model] = slo

    # -- feeding ----------------------------------------------------------------------------------

    def _bucket(self, model: str, version: str, sec: int) -> _Bucket:
        key = (model, version)
        dq = self._buckets.get(key)
        if dq is None:
            dq = self._buckets[key] = collections.deque()
            self.totals[key] = [0, 0, 0, 0]
        if dq and dq[-1].sec == sec:
            return dq[-1]
        b = _Bucket(sec)
        dq.append(b)
        oldest = sec - int(self.max_age_s)
        while dq and dq[0].sec < oldest:
            dq.popleft()
        return b

    def observe(self, rec: RequestRecord) -> None:
        """Count one finished request (see the module docstring)."""
        model = rec.model_requested
        if not rec.attempts and rec.status != "ok":
            return
        if not self.versioned(model) and not (rec.model_served and self.versioned(rec.model_served)):
            return
        sec = math.floor(self.clock.monotonic())
        by_attempt: dict[int, tuple[str, str]] = {}
        for d in rec.decisions:
            n, v = d.get("attempt"), d.get("version")
            if isinstance(n, int) and isinstance(v, str):
                by_attempt[n] = (str(d.get("model") or model), v)
        for a in rec.attempts:
            failed = attempt_failed(a.outcome, a.http_status)
            mv = by_attempt.get(a.number)
            if failed is None or mv is None or not self.versioned(mv[0]):
                continue
            b = self._bucket(mv[0], mv[1], sec)
            b.attempts += 1
            t = self.totals[mv]
            t[0] += 1
            if failed:
                b.failed += 1
                t[1] += 1
        served = rec.model_served or model
        if rec.status == "ok" and rec.model_version and self.versioned(served) and rec.last_byte_at is not None:
            ttft_max, e2e_max = self.slo_of(served)
            e2e = rec.last_byte_at - rec.received_at
            missed = (e2e_max is not None and e2e > e2e_max) or (
                ttft_max is not None and rec.stream and rec.first_byte_at is not None
                and rec.first_byte_at - rec.received_at > ttft_max)
            key = (served, rec.model_version)
            b = self._bucket(served, rec.model_version, sec)
            b.ok += 1
            t = self.totals[key]
            t[2] += 1
            if missed:
                b.slo_missed += 1
                t[3] += 1
            for metric, secs in node_times(rec).items():
                x = math.log(secs)
                acc = b.latency.setdefault(metric, [0.0, 0.0, 0.0])
                acc[0] += 1
                acc[1] += x
                acc[2] += x * x

    # -- reading ----------------------------------------------------------------------------------

    def counts(self, model: str, version: str, *, since: float, window_s: float) -> Counts:
        """``version``'s counts over the last ``window_s`` seconds, not before ``since`` (both on
        the monotonic clock; whole seconds: the bucket of ``since`` is left out, so a step never
        counts what happened before it)."""
        now = self.clock.monotonic()
        lo = max(math.floor(since) + 1, math.floor(now - window_s) + 1)
        a = f = o = m = 0
        lat = {k: [0.0, 0.0, 0.0] for k in LATENCY_METRICS}
        for b in reversed(self._buckets.get((model, version), ())):
            if b.sec < lo:
                break
            a += b.attempts
            f += b.failed
            o += b.ok
            m += b.slo_missed
            for k, acc in b.latency.items():
                tot = lat.setdefault(k, [0.0, 0.0, 0.0])
                tot[0] += acc[0]
                tot[1] += acc[1]
                tot[2] += acc[2]
        return Counts(a, f, o, m, {k: LogMoments(int(v[0]), v[1], v[2]) for k, v in lat.items() if v[0]})

    def describe(self) -> dict[str, dict[str, Any]]:
        """Totals since start per ``model/version`` (metrics and the admin API)."""
        return {f"{m}/{v}": {"attempts": t[0], "failed": t[1], "ok": t[2], "slo_missed": t[3]}
                for (m, v), t in self.totals.items()}
