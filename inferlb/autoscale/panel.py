"""The dashboard's autoscaling panel data (``GET /dashboard/autoscale``), from the runner's state.

Contract (pure; the route in ``api/dashboard.py`` adds the database read):

* :func:`autoscale_panel` turns the runner's in-memory :attr:`~.runner.AutoscaleRunner.points`
  (one per model per round, oldest first, this process's uptime only) into one entry per model,
  in the order the models first appear: ``t`` (epoch seconds of each round) and, aligned with it,
  ``forecast`` / ``actual`` / ``capacity`` in tokens/s (``forecast`` null where the forecaster
  gave none) and ``replicas`` ``{gpu: [replicas in place after the round]}`` (null before a pool
  first appears); ``method`` is the forecaster of the model's last round.
* ``events`` are the last scaling decisions (``scaling_events`` rows, newest first) with the
  ``detail`` JSON left out (the panel shows the reason; ``inferlb`` readers of the table get all).
* ``enabled`` is True; :data:`AUTOSCALE_OFF` is the whole answer when no autoscaler runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["AUTOSCALE_OFF", "EVENT_FIELDS", "autoscale_panel"]

AUTOSCALE_OFF: dict[str, Any] = {
    "enabled": False,
    "reason": "autoscaling is off: the fleet file has no (enabled) autoscale: section",
}

EVENT_FIELDS = ("at", "round", "model", "gpu", "from_replicas", "to_replicas", "applied_replicas", "status",
                "actuator", "forecaster", "forecast_tokens_s", "actual_tokens_s", "capacity_tokens_s", "reason")


def autoscale_panel(status: Mapping[str, Any], points: Iterable[Mapping[str, Any]],
                    events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    models: dict[str, dict[str, Any]] = {}
    for p in points:
        name = str(p["model"])
        m = models.get(name)
        if m is None:
            m = models[name] = {"model": name, "method": None, "t": [], "forecast": [], "actual": [],
                                "capacity": [], "replicas": {}}
        i = len(m["t"])
        m["t"].append(p["at"])
        m["forecast"].append(p.get("forecast"))
        m["actual"].append(p.get("actual"))
        m["capacity"].append(p.get("capacity"))
        m["method"] = p.get("method")
        replicas: dict[str, list[int | None]] = m["replicas"]
        for gpu, n in (p.get("replicas") or {}).items():
            replicas.setdefault(str(gpu), [None] * i).append(n)
        for series in replicas.values():   # a pool missing from this round: no value, not a zero
            if len(series) == i:
                series.append(None)
    return {"enabled": True, "status": dict(status), "models": list(models.values()),
            "events": [{k: e.get(k) for k in EVENT_FIELDS} for e in events]}
