"""The rollout manager's client errors (the OpenAI error envelope of errors.py).

Contract: ``RolloutBusy`` is a 409 (a model's second running rollout, or a rollout not running),
``RolloutNotFound`` a 404 (no such id), ``RolloutUnavailable`` a 503 (the ``rollouts`` row could
not be written: nothing was applied).
"""

from __future__ import annotations

from inferlb.errors import ClientError

__all__ = ["RolloutBusy", "RolloutNotFound", "RolloutUnavailable"]


class RolloutBusy(ClientError):
    """409: the model already has a running rollout, or the rollout is not running."""

    status = 409

    def __init__(self, message: str, *, code: str = "rollout_conflict") -> None:
        super().__init__(message, code=code)


class RolloutNotFound(ClientError):
    """404: no rollout has this id."""

    status = 404

    def __init__(self, rollout_id: str) -> None:
        super().__init__(f"No rollout with id {rollout_id!r}", param="id", code="rollout_not_found")


class RolloutUnavailable(ClientError):
    """503: the rollout could not be written to the database; nothing was applied."""

    status = 503
    type = "server_error"

    def __init__(self, detail: str) -> None:
        super().__init__(f"The rollout store is unavailable: {detail[:200]}", code="store_unavailable")
