"""One canary rollout's state (pure data): which versions, the steps, where it is, the weights it sets.

A rollout moves traffic from ``from_version`` to ``to_version`` by steps of percentages. The
percentage is of the two versions' combined weight before the rollout (``base_weights``): at
``p`` %, ``to`` gets ``p`` % of it and ``from`` the rest; other versions of the model keep their
weights. With the usual two versions that is ``p`` % of the model's traffic.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from inferlb.config.rollout import RolloutCriteria

__all__ = ["FINAL_STATES", "Rollout", "new_rollout_id"]

FINAL_STATES = frozenset({"completed", "rolled_back", "aborted"})


def new_rollout_id() -> str:
    return "ro_" + secrets.token_hex(6)


@dataclass
class Rollout:
    id: str
    model: str
    from_version: str
    to_version: str
    steps: tuple[float, ...]
    criteria: RolloutCriteria
    base_weights: dict[str, float]
    started_at: float                      # epoch s
    step_started_at: float                 # epoch s
    step_started_mono: float               # monotonic: the step's window starts here
    state: str = "running"                 # running | completed | rolled_back | aborted
    step: int = 0                          # index into steps
    percent: float = 0.0                   # the to_version's share now
    reason: str | None = None
    ended_at: float | None = None
    rounds: int = 0
    last: dict[str, Any] | None = field(default=None)   # the last decision (JSON)

    @property
    def running(self) -> bool:
        return self.state == "running"

    def weights_at(self, percent: float) -> dict[str, float]:
        """The two versions' weights at ``percent`` (see the module docstring)."""
        total = self.base_weights.get(self.from_version, 0.0) + self.base_weights.get(self.to_version, 0.0)
        if total <= 0:
            total = 100.0
        to = total * percent / 100.0
        return {self.to_version: to, self.from_version: total - to}

    def next_percent(self) -> float | None:
        return self.steps[self.step + 1] if self.step + 1 < len(self.steps) else None

    def data(self) -> dict[str, Any]:
        """The process's start data ``rollout`` (processes/README.md)."""
        return {"id": self.id, "model": self.model, "from_version": self.from_version,
                "to_version": self.to_version, "percent": self.percent, "step": self.step,
                "steps": list(self.steps), "next_percent": self.next_percent(), "state": self.state}

    def row(self) -> dict[str, Any]:
        """Every column of the ``rollouts`` row (times in epoch seconds)."""
        return {"id": self.id, "model": self.model, "from_version": self.from_version,
                "to_version": self.to_version, "steps": list(self.steps),
                "criteria": self.criteria.model_dump(), "base_weights": dict(self.base_weights),
                "state": self.state, "step": self.step, "percent": self.percent, "reason": self.reason,
                "started_at": self.started_at, "step_started_at": self.step_started_at, "ended_at": self.ended_at}

    def progress(self) -> dict[str, Any]:
        """The columns a round may change."""
        return {"state": self.state, "step": self.step, "percent": self.percent, "reason": self.reason,
                "step_started_at": self.step_started_at, "ended_at": self.ended_at}

    def to_json(self) -> dict[str, Any]:
        return {**self.row(), "next_percent": self.next_percent() if self.running else None,
                "rounds": self.rounds, "last_decision": self.last}
