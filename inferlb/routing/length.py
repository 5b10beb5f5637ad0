"""Output-length prediction: what a gateway can know of an answer's length before it is written.

A gateway sees a request's declared ``max_tokens`` (or none), its prompt tokens, model, tenant
and endpoint, and its own history of finished requests; never the answer's true length. Most
clients send no ``max_tokens`` or a loose cap, so the declared budget alone is a poor estimate
of the load a request adds. :class:`LengthPredictor` learns, online from the completion tokens of
finished requests, the distribution of answer lengths per (model, endpoint, tenant, prompt-length
band), with coarser levels to fall back on, and answers an :class:`LengthEstimate` (p50, p90,
mean and the budget routing uses) for a new request.

Contract:

* Pure and deterministic: no clock, no I/O, no randomness; the same observations in the same
  order give the same estimates.
* Without data (fewer than ``min_samples`` answers at every level) the estimate is the declared
  ``max_tokens``, else the model's default budget: the gateway's behaviour before prediction.
* An estimate never exceeds the declared ``max_tokens`` (a server stops there).
* Levels, most specific first: (model, endpoint, tenant, band), (model, endpoint, tenant),
  (model, endpoint). ``band`` is the index of the first of ``bands`` the prompt is below.
  At most ``max_keys`` histograms are kept; past that, new keys are not tracked (their requests
  use the coarser levels that exist), so memory is bounded whatever clients send.
* Each histogram has log-spaced bins (four per doubling, 1 to 2**20 tokens) whose counts halve
  when they reach ``window``: an exponentially fading memory of about the last ``window``
  answers, so a shift in the traffic is followed. Its statistics are recomputed every eight
  answers it takes (cached in between): an estimate lags the newest seven answers of its key.
* Calibration (:class:`Calibration`): every :meth:`LengthPredictor.observe` given the estimate
  made for that request counts the absolute error of its p50 and whether the true length was at
  most its p50 and its p90 (a calibrated predictor covers about 50 % and 90 %).
* Sharing (a cluster's one trainer, learned/share_length.py): with an :attr:`LengthPredictor.outbox`
  (a bounded deque the share sets), :meth:`LengthPredictor.observe` only appends the observation
  there (the oldest dropped when full) and learns nothing: the share hands it to the trainer,
  which learns it (:meth:`LengthPredictor.learn`). :meth:`LengthPredictor.state` is the histograms kept
  (their non-empty bins) with the calibration and the count learned, :meth:`LengthPredictor.load`
  takes another predictor's (:class:`~.predictor_state.IncompatibleState` when its ``window`` or
  ``bands`` differ: its histograms would mean something else here). The loaded histograms'
  statistics are computed at their first use, so they may be up to seven answers fresher than the
  other predictor's cached ones.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from itertools import compress
from typing import Any, Literal

from inferlb.routing.predictor_state import IncompatibleState

__all__ = ["BudgetStat", "Calibration", "LengthEstimate", "LengthObservation", "LengthPredictor"]

BudgetStat = Literal["p50", "mean", "p90"]

_PER_DOUBLING = 4
_BINS = 20 * _PER_DOUBLING + 1            # 1 .. 2**20 tokens


def _bin(x: int) -> int:
    if x <= 1:
        return 0
    return min(_BINS - 1, int(math.log2(x) * _PER_DOUBLING))


def _edge(k: float) -> float:
    return float(2.0 ** (k / _PER_DOUBLING))


_REFRESH = 8     # answers added before a histogram's cached statistics are recomputed


class _Hist:
    """A fading log-binned histogram of answer lengths. Its (p50, p90, mean) are cached and
    recomputed after every :data:`_REFRESH` answers (two scans of the bins cost ~15 µs, more than
    the rest of an estimate; eight answers more move them little)."""

    __slots__ = ("cached", "counts", "n", "stale", "total")

    def __init__(self) -> None:
        self.counts = [0.0] * _BINS
        self.n = 0.0          # the faded count
        self.total = 0.0      # the faded sum of lengths (for the mean)
        self.cached: tuple[int, int, int] | None = None
        self.stale = 0        # answers added since ``cached`` was computed

    def stats(self) -> tuple[int, int, int]:
        """(p50, p90, mean), rounded, p90 ≥ p50 ≥ 1 (see the class docstring)."""
        c = self.cached
        if c is None or self.stale >= _REFRESH:
            p50 = max(1, round(self.quantile(0.5)))
            c = self.cached = (p50, max(p50, round(self.quantile(0.9))), max(1, round(self.total / self.n)))
            self.stale = 0
        return c

    def add(self, x: int, window: int) -> None:
        if self.n >= window:
            self.counts = [c * 0.5 for c in self.counts]
            self.n *= 0.5
            self.total *= 0.5
        self.counts[_bin(x)] += 1.0
        self.n += 1.0
        self.total += x
        self.stale += 1

    def quantile(self, q: float) -> float:
        """The ``q``-quantile, interpolated geometrically inside its bin."""
        target = q * self.n
        acc = 0.0
        for k, c in enumerate(self.counts):
            if c > 0 and acc + c >= target:
                frac = (target - acc) / c
                return _edge(k + frac) if k > 0 else 1.0 + frac * (_edge(1) - 1.0)
            acc += c
        return _edge(_BINS)


@dataclass(frozen=True, slots=True)
class LengthEstimate:
    """A request's predicted answer length. ``budget`` is what routing, load and admission count
    (the statistic :class:`LengthPredictor` was built with, capped by the declared ``max_tokens``);
    ``level`` says where it came from: ``band``, ``tenant``, ``model``, or ``declared`` /
    ``default`` without data (then p50 = p90 = mean = budget)."""

    p50: int
    p90: int
    mean: int
    budget: int
    level: str
    samples: int


#: One observation waiting in an outbox: (model, endpoint, tenant, prompt_tokens, tokens, estimate).
LengthObservation = tuple[str, str, str | None, int, int, LengthEstimate | None]


@dataclass
class Calibration:
    """How well the estimates matched the answers (see the module docstring)."""

    n: int = 0
    learned: int = 0              # of the n, estimates from data (not the declared / default fallback)
    abs_err_sum: float = 0.0      # |p50 − true| summed
    within_p50: int = 0
    within_p90: int = 0
    budget_err_sum: float = 0.0   # |budget − true| summed

    _FIELDS = ("n", "learned", "abs_err_sum", "within_p50", "within_p90", "budget_err_sum")

    def add(self, est: LengthEstimate, tokens: int) -> None:
        self.n += 1
        if est.level not in ("declared", "default"):
            self.learned += 1
        self.abs_err_sum += abs(est.p50 - tokens)
        self.budget_err_sum += abs(est.budget - tokens)
        self.within_p50 += tokens <= est.p50
        self.within_p90 += tokens <= est.p90

    def state(self) -> dict[str, float]:
        """The counts, as JSON (:meth:`LengthPredictor.state`)."""
        return {k: getattr(self, k) for k in self._FIELDS}

    @classmethod
    def of(cls, state: dict[str, Any]) -> Calibration:
        """The calibration :meth:`state` gave (``TypeError`` / ``KeyError`` when it is not one)."""
        out = cls()
        for k in cls._FIELDS:
            v = state[k]
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise TypeError(f"calibration {k}: {v!r}")
            setattr(out, k, type(getattr(out, k))(v))
        return out

    def summary(self) -> dict[str, float | int | None]:
        """``n``, ``learned``, ``mae_p50`` and ``mae_budget`` (tokens), ``cover_p50`` and
        ``cover_p90`` (shares); None where nothing was counted."""
        n = self.n
        return {"n": n, "learned": self.learned,
                "mae_p50": round(self.abs_err_sum / n, 1) if n else None,
                "mae_budget": round(self.budget_err_sum / n, 1) if n else None,
                "cover_p50": round(self.within_p50 / n, 4) if n else None,
                "cover_p90": round(self.within_p90 / n, 4) if n else None}


@dataclass
class LengthPredictor:
    """Online quantiles of answer length per model, endpoint, tenant and prompt band (see the
    module docstring). ``budget`` picks the statistic routing counts: ``mean`` (the default: the
    sum of the means is the expected token load of a node's requests), ``p50`` or ``p90``."""

    budget: BudgetStat = "mean"
    min_samples: int = 20
    window: int = 2000
    bands: tuple[int, ...] = (256, 1024, 4096)
    max_keys: int = 4096
    calibration: Calibration = field(default_factory=Calibration)
    _hists: dict[tuple[str, str, str | None, int | None], _Hist] = field(default_factory=dict)
    #: Set by a cluster's share (learned/share_length.py): observations wait here instead of being learned.
    outbox: deque[LengthObservation] | None = None
    learned: int = 0      # observations learned (in a cluster: the trainer's, installed with its snapshot)

    def __post_init__(self) -> None:
        if self.min_samples < 1 or self.window < 2 or self.max_keys < 1:
            raise ValueError("min_samples must be >= 1, window >= 2 and max_keys >= 1")
        if self.budget not in ("p50", "mean", "p90"):
            raise ValueError(f"budget must be p50, mean or p90, not {self.budget!r}")
        if list(self.bands) != sorted(self.bands):
            raise ValueError("bands must be ascending")

    def _band(self, prompt_tokens: int) -> int:
        for i, b in enumerate(self.bands):
            if prompt_tokens < b:
                return i
        return len(self.bands)

    def _keys(self, model: str, endpoint: str, tenant: str | None,
              prompt_tokens: int) -> tuple[tuple[str, str, str | None, int | None], ...]:
        band = self._band(prompt_tokens)
        return ((model, endpoint, tenant or "", band), (model, endpoint, tenant or "", None),
                (model, endpoint, None, None))

    def estimate(self, model: str, *, prompt_tokens: int, declared: int | None, default: int,
                 tenant: str | None = None, endpoint: str = "chat") -> LengthEstimate:
        """The estimate for a new request; ``declared`` is its ``max_tokens`` (None: not sent),
        ``default`` the model's default budget (what the gateway assumes without one)."""
        cap = declared if declared is not None else None
        for key, level in zip(self._keys(model, endpoint, tenant, prompt_tokens), ("band", "tenant", "model"),
                              strict=True):
            h = self._hists.get(key)
            if h is not None and h.n >= self.min_samples:
                p50, p90, mean = h.stats()
                if cap is not None:
                    p50, p90, mean = min(p50, cap), min(p90, cap), min(mean, cap)
                pick = p50 if self.budget == "p50" else p90 if self.budget == "p90" else mean
                return LengthEstimate(p50, p90, mean, pick, level, int(h.n))
        b = declared if declared is not None else default
        return LengthEstimate(b, b, b, b, "declared" if declared is not None else "default", 0)

    def observe(self, model: str, *, prompt_tokens: int, tokens: int, tenant: str | None = None,
                endpoint: str = "chat", estimate: LengthEstimate | None = None) -> None:
        """A finished request's completion ``tokens`` (the gateway's own count); with the
        ``estimate`` made for it, counted in :attr:`calibration`. With an :attr:`outbox`, only
        queued there (module docstring)."""
        if tokens < 0:
            return
        if self.outbox is not None:
            self.outbox.append((model, endpoint, tenant, prompt_tokens, tokens, estimate))
            return
        self.learn(model, prompt_tokens=prompt_tokens, tokens=tokens, tenant=tenant, endpoint=endpoint,
                   estimate=estimate)

    def learn(self, model: str, *, prompt_tokens: int, tokens: int, tenant: str | None = None,
              endpoint: str = "chat", estimate: LengthEstimate | None = None) -> None:
        """What :meth:`observe` does without an outbox: learn one answer here."""
        if tokens < 0:
            return
        self.learned += 1
        if estimate is not None:
            self.calibration.add(estimate, tokens)
        for key in self._keys(model, endpoint, tenant, prompt_tokens):
            h = self._hists.get(key)
            if h is None:
                if len(self._hists) >= self.max_keys:
                    continue
                h = self._hists[key] = _Hist()
            h.add(tokens, self.window)

    def kept(self) -> int:
        """Histograms kept (at most ``max_keys``)."""
        return len(self._hists)

    def summary(self) -> dict[str, object]:
        """What ``/admin/fleet`` shows: the statistic, the histograms kept, the answers learned, the
        calibration."""
        return {"budget": self.budget, "keys": self.kept(), "learned_total": self.learned,
                **self.calibration.summary()}

    def state(self) -> dict[str, Any]:
        """What another predictor loads (:meth:`load`; JSON): the settings the histograms depend on,
        the count learned, the calibration, and each histogram as ``[model, endpoint, tenant, band,
        n, total, bins, counts]`` with its non-empty bins only (``bins`` their indices)."""
        idx = range(_BINS)
        hists = [[m, e, t, b, h.n, h.total, list(compress(idx, h.counts)), list(compress(h.counts, h.counts))]
                 for (m, e, t, b), h in self._hists.items()]   # compress: the scan in C, not 81 steps of Python
        return {"window": self.window, "bands": list(self.bands), "learned": self.learned,
                "calibration": self.calibration.state(), "hists": hists}

    def load(self, state: dict[str, Any]) -> None:
        """Replace what this predictor learned by ``state`` (another's :meth:`state`): at most
        ``max_keys`` histograms are taken. Raises :class:`IncompatibleState` when its ``window`` or
        ``bands`` differ from these, ``TypeError`` / ``KeyError`` / ``ValueError`` when it is not a
        state; either way nothing here changes."""
        if state["window"] != self.window or list(state["bands"]) != list(self.bands):
            raise IncompatibleState(f"window {state['window']} and bands {state['bands']}, not {self.window} "
                                    f"and {list(self.bands)}")
        learned = state["learned"]
        if not isinstance(learned, int) or isinstance(learned, bool) or learned < 0:
            raise TypeError(f"learned: {learned!r}")
        calibration = Calibration.of(state["calibration"])
        hists: dict[tuple[str, str, str | None, int | None], _Hist] = {}
        nbands = len(self.bands)
        for row in state["hists"]:
            m, e, t, b, n, total, ks, cs = row
            if not (isinstance(m, str) and isinstance(e, str) and (t is None or isinstance(t, str))
                    and (b is None or (isinstance(b, int) and 0 <= b <= nbands))):
                raise TypeError(f"histogram key {row[:4]!r}")
            if len(hists) >= self.max_keys:
                break
            h = _Hist()
            h.n, h.total = float(n), float(total)
            # checked in bulk (C loops): int bins in range, counts finite and ≥ 0 (a sum of those is finite)
            if ks and (set(map(type, ks)) != {int} or min(ks) < 0 or max(ks) >= _BINS or len(ks) != len(cs)):
                raise ValueError(f"histogram {row[:4]!r}: bins {ks!r}")
            counts = h.counts
            for k, c in zip(ks, cs, strict=True):
                counts[k] = c
            if cs and (set(map(type, cs)) - {int, float} or min(cs) < 0):
                raise ValueError(f"histogram {row[:4]!r}: counts not numbers ≥ 0")
            if not (math.isfinite(h.n + h.total + math.fsum(cs)) and h.n >= 0 and h.total >= 0):
                raise ValueError(f"histogram {row[:4]!r}: counts not finite and ≥ 0")
            hists[(m, e, t, b)] = h
        self._hists, self.calibration, self.learned = hists, calibration, learned
