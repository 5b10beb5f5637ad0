"""Canary rollout settings: the fleet file's ``rollouts:`` section and a rollout's criteria.

``rollouts.criteria`` and ``rollouts.steps`` are the defaults of ``POST /admin/rollouts``; a
request may override any criterion. Every model rejects unknown keys, so a typo is an error
with its key path, not a silently ignored setting.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["DEFAULT_STEPS", "RolloutConfig", "RolloutCriteria", "RolloutSpec", "check_steps"]

DEFAULT_STEPS: tuple[float, ...] = (1.0, 5.0, 25.0, 50.0, 100.0)


class RolloutCriteria(BaseModel):
    """When a canary step is promoted, held or rolled back (rollout/guard.py).

    * ``min_requests``: attempts (error test), successful requests (SLO test) and node times (each
      latency test) each version needs in the step's window before the guard decides anything but
      "hold".
    * ``confidence``: the one-sided level of the bounds on the difference canary − baseline.
    * ``max_error_rate_increase`` / ``max_slo_miss_increase``: the margins (absolute proportions)
      the canary may be worse by. Promote when the upper bound of the difference is within the
      margin for every test; roll back when the lower bound is above it for any test.
    * ``max_latency_ratio``: how much slower the canary's node times may be, as a ratio of
      geometric means canary / baseline (1.5: up to 50 % slower), tested per metric (``ttft`` and
      ``tpot`` of streams, ``e2e`` of the rest; rollout/guard.py) with a one-sided Welch bound on
      the logs at ``confidence``; each metric needs ``min_requests`` times on both sides, like the
      other tests. At 1.5, with times whose logs spread by a standard deviation of 0.5, a 2.9× slower
      canary is shown worse from about 20 times a side and a same-speed one within from about 20
      canary times against many more of the baseline (so ``min_requests`` decides); None turns
      the latency tests off.
    * ``ttft_max_s`` / ``e2e_max_s``: the SLO a request must meet; default: the model's SLO
      (``slos:``); with neither, only the error test runs.
    * ``window_s``: the sliding window the counts come from (never older than the step's start).
      It bounds the sample: a canary with no errors is shown within a margin ``m`` only once it
      has about ``z² / m`` attempts (``m`` = 0.02 at 95 %: 136), so a step of ``p`` % can promote
      only when the model gets at least ``z² / (m × p/100 × window_s)`` requests a second (at
      1 % with the defaults: 7.5). A model with less traffic needs a larger first step, a wider
      margin or a longer window.
    * ``min_step_s``: the least time at a step before a promotion; ``max_step_s``: a step not
      shown safe by then is rolled back (not proven safe is not safe).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_requests: int = Field(100, ge=1, le=10_000_000)
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    max_error_rate_increase: float = Field(0.02, ge=0.0, lt=1.0)
    max_slo_miss_increase: float = Field(0.05, ge=0.0, lt=1.0)
    max_latency_ratio: float | None = Field(1.5, gt=1.0, le=100.0)
    ttft_max_s: float | None = Field(None, gt=0)
    e2e_max_s: float | None = Field(None, gt=0)
    window_s: float = Field(1800.0, gt=0, le=86_400)
    min_step_s: float = Field(30.0, ge=0, le=86_400)
    max_step_s: float = Field(1800.0, gt=0, le=7 * 86_400)

    @field_validator("ttft_max_s", "e2e_max_s", "window_s", "min_step_s", "max_step_s")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @model_validator(mode="after")
    def _order(self) -> RolloutCriteria:
        if self.max_step_s < self.min_step_s:
            raise ValueError(f"max_step_s ({self.max_step_s:g}) must be >= min_step_s ({self.min_step_s:g})")
        return self


def check_steps(steps: list[float]) -> list[float]:
    """Percentages of traffic for the new version: strictly increasing, each in (0, 100], the last
    100, at least one below 100 (at 100 % the old version has no traffic to compare with).
    ValueError saying what is wrong otherwise."""
    if not steps:
        raise ValueError("steps must list at least one percentage (the last must be 100)")
    if len(steps) > 100:
        raise ValueError("at most 100 steps")
    for i, s in enumerate(steps):
        if not math.isfinite(s) or not 0 < s <= 100:
            raise ValueError(f"steps[{i}] = {s}: every step is a percentage in (0, 100]")
        if i and s <= steps[i - 1]:
            raise ValueError(f"steps[{i}] = {s:g}: steps must increase ({steps[i - 1]:g} before it)")
    if steps[-1] != 100:
        raise ValueError(f"the last step must be 100 (got {steps[-1]:g}): a rollout ends with all traffic moved")
    if len(steps) < 2:
        raise ValueError("steps need a canary step below 100 before the last (e.g. [10, 100])")
    return steps


class RolloutConfig(BaseModel):
    """The fleet file's ``rollouts:`` section."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    process: str = "rollout.bpmn"              # in the processes directory, always run on SpiffWorkflow
    interval_s: float = Field(5.0, gt=0, le=3600)   # one decision round per running rollout this often
    steps: list[float] = Field(default_factory=lambda: list(DEFAULT_STEPS))
    criteria: RolloutCriteria = RolloutCriteria()

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[float]) -> list[float]:
        return check_steps(v)


class RolloutSpec(BaseModel):
    """The body of ``POST /admin/rollouts``: which model, from which version to which, and
    optionally the steps and criteria (each key overrides the fleet's ``rollouts:`` default)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=256)
    from_version: str = Field(min_length=1, max_length=64)
    to_version: str = Field(min_length=1, max_length=64)
    steps: list[float] | None = Field(None, min_length=1, max_length=100)
    criteria: dict[str, float | int | None] | None = None

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: list[float] | None) -> list[float] | None:
        return None if v is None else check_steps(v)
