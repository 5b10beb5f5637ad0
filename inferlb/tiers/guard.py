"""The feedback guard of one cheaper tier: trip when its error or SLO-miss rate rises, restore with
hysteresis after a cool-down. Pure state machine; time is passed in (tests use a manual clock).

Contract:

* :meth:`TierGuard.observe` counts one finished request served by the tier at time ``now``:
  whether it failed (an error the client saw) and whether it missed the alias's SLO (successful
  but over ``e2e_max_s`` / ``ttft_max_s``). Only the last ``window_s`` seconds count (at most
  :data:`MAX_EVENTS` requests).
* **Trip** (:meth:`TierGuard.update`): with at least ``min_requests`` requests in the window, an
  error rate above ``max_error_rate`` or an SLO-miss rate above ``max_slo_miss_rate``. The
  tier's traffic then goes to the next stronger tier, but for ``probe_share`` of it (chosen by
  the request id's hash, so a request's choice does not depend on timing), which still goes to
  the tier so its health can be measured. The window restarts at the trip: recovery is judged
  on what happened since.
* **Restore**: no sooner than ``cooldown_s`` after the trip, and when the probes measured at
  least ``min_requests`` requests with both rates at most ``recover_ratio`` × their thresholds
  (hysteresis: a tier at the threshold does not flap). With ``probe_share`` 0 there is nothing to
  measure: the tier is restored after the cool-down (half-open) with an empty window, and trips
  again if the rates rise again.
* Each transition is returned as a :class:`Transition` (the router logs it and counts it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from inferlb.config.tiers import TierGuardConfig

__all__ = ["MAX_EVENTS", "TierGuard", "Transition"]

MAX_EVENTS = 100_000


@dataclass(frozen=True, slots=True)
class Transition:
    """A trip (``tripped=True``) or a restore, at ``at``, with the rates that decided it."""

    tripped: bool
    at: float
    requests: int
    error_rate: float
    slo_miss_rate: float
    reason: str


class TierGuard:
    """One cheaper tier's guard (see the module docstring)."""

    def __init__(self, cfg: TierGuardConfig) -> None:
        self.cfg = cfg
        self._events: deque[tuple[float, bool, bool]] = deque(maxlen=MAX_EVENTS)
        self._errors = 0
        self._missed = 0
        self.tripped = False
        self.tripped_at: float | None = None
        self.reason = ""
        self.trips = 0
        self.restores = 0

    # -- counting ----------------------------------------------------------------------------------

    def _expire(self, now: float) -> None:
        horizon = now - self.cfg.window_s
        ev = self._events
        while ev and ev[0][0] < horizon:
            _, e, m = ev.popleft()
            self._errors -= e
            self._missed -= m

    def observe(self, now: float, *, error: bool, slo_missed: bool) -> Transition | None:
        """Count one finished request; the transition it caused, if any."""
        ev = self._events
        if len(ev) == ev.maxlen:
            _, e, m = ev.popleft()
            self._errors -= e
            self._missed -= m
        ev.append((now, error, slo_missed and not error))
        self._errors += error
        self._missed += slo_missed and not error
        return self.update(now)

    def rates(self, now: float) -> tuple[int, float, float]:
        """Requests in the window, their error rate and SLO-miss rate."""
        self._expire(now)
        n = len(self._events)
        return n, (self._errors / n if n else 0.0), (self._missed / n if n else 0.0)

    # -- deciding ----------------------------------------------------------------------------------

    def update(self, now: float) -> Transition | None:
        """Trip or restore when the rules of the module docstring say so; the transition, else None."""
        cfg = self.cfg
        n, err, miss = self.rates(now)
        slo_max = cfg.max_slo_miss_rate
        if not self.tripped:
            if n < cfg.min_requests:
                return None
            why = None
            if err > cfg.max_error_rate:
                why = f"error rate {err:.3f} > {cfg.max_error_rate:g} over {n} requests"
            elif slo_max is not None and miss > slo_max:
                why = f"SLO-miss rate {miss:.3f} > {slo_max:g} over {n} requests"
            if why is None:
                return None
            self.tripped, self.tripped_at, self.reason = True, now, why
            self.trips += 1
            self._clear()
            return Transition(True, now, n, err, miss, why)
        assert self.tripped_at is not None
        if now - self.tripped_at < cfg.cooldown_s:
            return None
        if cfg.probe_share > 0:
            if n < cfg.min_requests:
                return None
            if err > cfg.recover_ratio * cfg.max_error_rate or (
                    slo_max is not None and miss > cfg.recover_ratio * slo_max):
                return None
            why = f"probes: error rate {err:.3f}, SLO-miss rate {miss:.3f} over {n} requests, " \
                  f"within {cfg.recover_ratio:g} x the thresholds"
        else:
            why = f"cool-down of {cfg.cooldown_s:g} s over (half-open: no probes)"
        self.tripped, self.tripped_at, self.reason = False, None, why
        self.restores += 1
        self._clear()
        return Transition(False, now, n, err, miss, why)

    def _clear(self) -> None:
        self._events.clear()
        self._errors = self._missed = 0

    def takes(self, probe: float) -> bool:
        """Whether a request whose probe draw is ``probe`` (uniform in (0, 1)) may go to the tier now."""
        return not self.tripped or probe < self.cfg.probe_share

    def describe(self, now: float) -> dict[str, object]:
        n, err, miss = self.rates(now)
        return {"tripped": self.tripped, "tripped_at": self.tripped_at, "reason": self.reason, "trips": self.trips,
                "restores": self.restores, "window_requests": n, "error_rate": round(err, 6),
                "slo_miss_rate": round(miss, 6)}
