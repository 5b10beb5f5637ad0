"""``rollout/*``: the service operations of ``processes/rollout.bpmn`` (one decision round of one
canary rollout). Thin adapters over :class:`~inferlb.rollout.RolloutScope`; the logic is
in ``rollout`` (the guard in ``rollout/guard.py``). None sleeps or does I/O: the
manager writes the recorded events to the database after the round.

* ``rollout/observe``: both versions' counts over the step's window → ``observation``;
* ``rollout/decide``: the statistical guard → ``decision`` (``action``: promote | hold | rollback);
  its parameters (optional) override the rollout's criteria, e.g. ``min_requests``, ``confidence``;
* ``rollout/promote``: the next step, or completion after the last → ``promoted``;
* ``rollout/rollback``: the weights from before the rollout → ``rolled_back``;
* ``rollout/record``: this round's event for ``rollout_events`` → ``recorded``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferlb.rollout.rounds import RolloutScope

__all__ = ["decide", "observe", "promote", "record", "rollback"]


def observe(scope: RolloutScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Writes ``observation`` = ``{"canary", "baseline", "percent", "step_age_s", "window_s", "slo"}``."""
    return scope.observe()


def decide(scope: RolloutScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads ``observation``; writes ``decision`` = ``{"action", "reason", "checks", "percent", "next_percent"}``."""
    return scope.decide(data.get("observation") or {}, params)


def promote(scope: RolloutScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Writes ``promoted`` = ``{"percent", "state", "completed"}``."""
    return scope.promote()


def rollback(scope: RolloutScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads ``decision``; writes ``rolled_back`` = ``{"percent", "state"}``."""
    decision = data.get("decision") or {}
    return scope.rollback(str(decision.get("reason") or "rolled back by the process"))


def record(scope: RolloutScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads ``decision``, ``observation``; writes ``recorded`` = ``{"count", "action"}``."""
    return scope.record(data)
