"""The ``tiers:`` of a model alias in the fleet file (cost-tiered model choice), and its cross-checks.

A model alias routes each request to one of several models by the request's difficulty::

    models:
      - name: auto                      # what clients ask for; no node serves it
        tiers:
          models:
            - {model: llama-8b, max_score: 0.4}    # score <= 0.4: the cheap model
            - {model: llama-70b}                   # everything else: the strong one
          weights: {prompt_tokens: 0.3, tools: 0.2}  # optional: the classifier's feature weights
          guard: {max_error_rate: 0.05, max_slo_miss_rate: 0.2, window_s: 300, cooldown_s: 120}
          learned: {enabled: false}
      - name: llama-8b
      - name: llama-70b

* ``models``: the tiers, cheapest first. Every tier but the last has ``max_score`` (strictly
  increasing): a request of difficulty score ``s`` in [0, 1] goes to the first tier with
  ``s <= max_score``, else to the last (tiers/classify.py computes ``s`` from named features).
* ``weights``: each feature's weight (tiers/classify.py ``FEATURES``; the default weights there);
  ``scales``: where a count feature saturates (prompt tokens, turns, declared max_tokens).
* ``guard``: the feedback guard (tiers/guard.py): when a cheaper tier's error rate or SLO-miss
  rate over ``window_s`` rises above its threshold, its traffic moves to the next stronger tier;
  it comes back after ``cooldown_s`` once the rates measured on the ``probe_share`` it still gets
  are at most ``recover_ratio`` × the thresholds (hysteresis).
* ``learned``: a small learned model (online logistic regression, tiers/learned.py) trained from
  the request outcomes of each cheaper tier; off by default, and even when on it decides only once
  its held-out log loss beats the base rate's.

:func:`tier_problems` returns the first problem as ``(key path, message)``, so the fleet loader
(``config/settings.py``) raises one ConfigError naming file, key path and problem: a tier naming
an unknown model, the alias itself, another alias (tiers do not chain: a chain could close a
cycle), a model of the wrong kind, a model listed twice; ``max_score`` on every tier but the last,
strictly increasing; an alias with versions, a fallback to an alias, a node that serves an alias.
It reads models and nodes by attribute (it does not import the settings module, which imports it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["FEATURE_NAMES", "TierConfig", "TierGuardConfig", "TierLearnedConfig", "TierPolicy", "TierScales",
           "tier_problems"]

#: The classifier's features (tiers/classify.py says how each is measured), in report order.
FEATURE_NAMES: tuple[str, ...] = ("prompt_tokens", "turns", "tools", "response_format", "code", "math",
                                  "max_tokens")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TierConfig(_Strict):
    """One tier: the model it sends to and the highest difficulty score it takes."""

    model: str
    max_score: float | None = Field(None, ge=0.0, le=1.0)   # None: the last tier (takes the rest)


class TierScales(_Strict):
    """Where a count feature reaches 1 (its value is ``min(1, count / scale)``)."""

    prompt_tokens: float = Field(2000.0, gt=0)
    turns: float = Field(8.0, gt=0)
    max_tokens: float = Field(1024.0, gt=0)


class TierGuardConfig(_Strict):
    """The feedback guard of each cheaper tier (tiers/guard.py)."""

    enabled: bool = True
    window_s: float = Field(300.0, gt=0, le=86_400)
    min_requests: int = Field(20, ge=1, le=1_000_000)
    max_error_rate: float = Field(0.05, gt=0.0, le=1.0)
    max_slo_miss_rate: float | None = Field(0.2, gt=0.0, le=1.0)   # None: errors only
    recover_ratio: float = Field(0.5, ge=0.0, le=1.0)
    cooldown_s: float = Field(120.0, ge=0, le=86_400)
    probe_share: float = Field(0.05, ge=0.0, le=1.0)


class TierLearnedConfig(_Strict):
    """The learned tier model (tiers/learned.py): off unless ``enabled``."""

    enabled: bool = False
    min_success: float = Field(0.9, gt=0.0, lt=1.0)   # the cheaper tier when P(success there) >= this
    min_samples: int = Field(200, ge=10, le=10_000_000)
    learning_rate: float = Field(0.05, gt=0.0, le=10.0)
    l2: float = Field(1e-4, ge=0.0, le=1.0)
    test_share: float = Field(0.2, gt=0.0, lt=1.0)     # outcomes held out (by request id hash) to test it
    seed: int = 0                                       # the split's salt
    # Of the requests the learned model keeps off the tier, this share (by request id hash) still goes
    # there: without it a model that says "no" would never see the outcomes that could change its mind.
    explore_share: float = Field(0.02, ge=0.0, le=0.5)


class TierPolicy(_Strict):
    """A model alias's tiers, classifier weights, guard and learned model (see the module docstring)."""

    models: list[TierConfig] = Field(min_length=2)
    weights: dict[str, float] = Field(default_factory=dict)
    scales: TierScales = TierScales()
    guard: TierGuardConfig = TierGuardConfig()
    learned: TierLearnedConfig = TierLearnedConfig()

    @field_validator("weights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        for name, w in v.items():
            if name not in FEATURE_NAMES:
                raise ValueError(f"unknown feature {name!r} (features: {', '.join(FEATURE_NAMES)})")
            if not math.isfinite(w) or w < 0:
                raise ValueError(f"the weight of {name!r} must be a finite number >= 0, got {w}")
        return v


def tier_problems(models: Sequence[Any], nodes: Sequence[Any]) -> tuple[str, str] | None:
    """The first problem with the aliases' tiers as ``(key path, message)``, or None (see the module
    docstring for what is checked)."""
    by_name = {m.name: m for m in models}
    aliases = {m.name for m in models if getattr(m, "tiers", None) is not None}
    for i, m in enumerate(models):
        policy: TierPolicy | None = getattr(m, "tiers", None)
        if policy is None:
            continue
        seen: dict[str, int] = {}
        last = -1.0
        for j, t in enumerate(policy.models):
            path = f"models[{i}].tiers.models[{j}].model"
            if t.model == m.name:
                return path, f"alias {m.name!r} names itself as a tier (a cycle)"
            target = by_name.get(t.model)
            if target is None:
                return path, f"alias {m.name!r} names unknown model {t.model!r}"
            if t.model in aliases:
                return path, f"{t.model!r} is itself an alias with tiers: tiers name served models, " \
                             "not aliases (a chain of aliases could close a cycle)"
            if t.model in seen:
                return path, f"model {t.model!r} is already tier {seen[t.model]}"
            seen[t.model] = j
            final = j == len(policy.models) - 1
            if final and t.max_score is not None:
                return f"models[{i}].tiers.models[{j}].max_score", \
                    "the last tier takes every request the others do not: leave out its max_score"
            if not final:
                if t.max_score is None:
                    return f"models[{i}].tiers.models[{j}]", "every tier but the last needs max_score"
                if t.max_score <= last:
                    return f"models[{i}].tiers.models[{j}].max_score", \
                        f"{t.max_score:g} is not above the tier before's {last:g}: tiers go cheapest first"
                last = t.max_score
            if target.kind != m.kind:
                return path, f"tier model {t.model!r} is of kind {target.kind!r}, the alias of kind {m.kind!r}"
        if getattr(m, "versions", None):
            return f"models[{i}].versions", f"alias {m.name!r} has tiers: its tier models carry the versions"
        for k, other in enumerate(models):
            for key in ("fallbacks", "context_window_fallbacks"):
                for f, name in enumerate(getattr(other, key, None) or ()):
                    if name == m.name:
                        return f"models[{k}].{key}[{f}]", f"{other.name!r} falls back to {m.name!r}, an alias " \
                                                          "with tiers: name one of its tier models"
        for k, n in enumerate(nodes):
            if m.name in n.models:
                return f"nodes[{k}].models", f"node {n.name!r} serves {m.name!r}, an alias with tiers: " \
                                             "requests for it go to its tier models"
    return None
