"""The dashboard's "Versions and rollouts" panel data (``GET /dashboard/versions``).

Contract (pure; the route in ``api/dashboard.py`` adds the database reads):

* ``models``: each versioned model's versions with the weights in force and their traffic shares
  (:meth:`~inferlb.versions.table.VersionTable.describe`, less the nodes), ``overridden``
  when a rollout or an operator moved them off the fleet file's weights.
* ``rollouts``: every running rollout first (newest started first), then the last ``limit`` ended
  ones (latest ended first). Each has its id, model, ``from_version`` → ``to_version``, ``state``,
  ``percent`` (the to-version's share now), ``step`` (index into ``steps``), ``steps``, ``reason``
  (why it ended), ``started_at`` / ``ended_at`` (epoch seconds) and ``last_decision``
  (``action``, ``reason``, ``at``: the rollout's event not yet written, else its last
  ``rollout_events`` row, else this gateway's last in-memory verdict, else null).
  This gateway's rollouts (``live``) win over the database's rows of the same id.
* ``enabled`` is False, with ``reason``, when no model of the fleet has versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["ROLLOUT_FIELDS", "VERSIONS_OFF_REASON", "versions_panel"]

VERSIONS_OFF_REASON = "no model has versions: list them under a model's 'versions:' in the fleet file"
ROLLOUT_FIELDS = ("id", "model", "from_version", "to_version", "state", "step", "percent", "steps", "reason",
                  "started_at", "ended_at")


def _decision(row: Mapping[str, Any], event: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if event is not None:
        return {"action": event.get("action"), "reason": event.get("reason"), "at": event.get("at")}
    last = row.get("last_decision")
    if isinstance(last, Mapping) and last.get("action"):
        return {"action": last.get("action"), "reason": last.get("reason"), "at": None}
    return None


def versions_panel(versions: Sequence[Mapping[str, Any]], live: Iterable[Mapping[str, Any]],
                   stored: Iterable[Mapping[str, Any]], last_events: Mapping[str, Mapping[str, Any]],
                   *, limit: int) -> dict[str, Any]:
    """``versions``: ``VersionTable.describe()``; ``live``: the manager's rollouts (JSON);
    ``stored``: database rows (running and recently ended); ``last_events``: by rollout id."""
    merged: dict[str, Mapping[str, Any]] = {}
    for row in live:
        merged[str(row["id"])] = row
    for row in stored:
        merged.setdefault(str(row["id"]), row)
    running = sorted((r for r in merged.values() if r.get("state") == "running"),
                     key=lambda r: (-(r.get("started_at") or 0.0), str(r["id"])))
    ended = sorted((r for r in merged.values() if r.get("state") != "running"),
                   key=lambda r: (-(r.get("ended_at") or r.get("started_at") or 0.0), str(r["id"])))[:limit]
    rollouts = [{**{k: r.get(k) for k in ROLLOUT_FIELDS}, "last_decision": _decision(r, last_events.get(str(r["id"])))}
                for r in running + ended]
    models = [{"model": m["model"], "overridden": bool(m.get("overridden")),
               "versions": [{"name": v["name"], "weight": v["weight"], "share": v["share"]} for v in m["versions"]]}
              for m in versions]
    out: dict[str, Any] = {"enabled": bool(models), "models": models, "rollouts": rollouts}
    if not models:
        out["reason"] = VERSIONS_OFF_REASON
    return out
