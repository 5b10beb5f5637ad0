"""``health/*``: the service operations of ``processes/node_health.bpmn`` (one monitoring round).

``health/probe`` is external (the monitor fetches every source concurrently and completes the
task with ``{"samples": [...]}``); the others run in the engine, never sleep, never do I/O:

* ``health/assess`` (pure): samples → per-node verdicts (``assessment``);
* ``health/isolate``: keeps the samples, then takes nodes out (probes, hardware, outlier sweep);
* ``health/restore``: brings nodes back (timers ran out, probes good, throttling cleared);
* ``health/record``: hands every queued state change (these sweeps' and the request path's) to
  the event writer, which writes them to ``node_events`` off the event loop.

Parameters (optional; absent ones come from the fleet file's ``health:`` section):
``assess.stale_after_s``, ``isolate.unhealthy_threshold``, ``isolate.hardware`` (bool),
``isolate.outliers`` (bool), ``restore.healthy_threshold``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inferlb.health.assess import assess as _assess
from inferlb.health.isolation import isolate as _isolate
from inferlb.health.isolation import observe
from inferlb.health.isolation import restore as _restore
from inferlb.health.scope import HealthScope

__all__ = ["assess", "isolate", "record", "restore"]


def _samples(data: Mapping[str, Any]) -> list[dict[str, Any]]:
    probe = data.get("probe") or {}
    samples = probe.get("samples") or []
    return [s for s in samples if isinstance(s, dict)]


def _opt_int(params: Mapping[str, Any], name: str) -> int | None:
    v = params.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or v < 1:
        raise ValueError(f"parameter {name} must be a number >= 1, got {v!r}")
    return int(v)


def assess(scope: HealthScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads ``probe``; writes ``assessment``."""
    stale = params.get("stale_after_s")
    stale_s = float(stale) if stale is not None else scope.fleet.health.stale_after_s
    return _assess(_samples(data), scope.clock.monotonic(), stale_s)


def isolate(scope: HealthScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Reads ``probe``, ``assessment``; writes ``isolated`` = ``{"events": [...], "count"}``."""
    observe(scope.fleet, _samples(data))
    events = _isolate(scope.fleet, dict(data.get("assessment") or {}),
                      unhealthy_threshold=_opt_int(params, "unhealthy_threshold"),
                      hardware=bool(params.get("hardware", True)), outliers=bool(params.get("outliers", True)))
    return {"events": events, "count": len(events)}


def restore(scope: HealthScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Writes ``restored`` = ``{"events": [...], "count"}``."""
    events = _restore(scope.fleet, healthy_threshold=_opt_int(params, "healthy_threshold"))
    return {"events": events, "count": len(events)}


def record(scope: HealthScope, data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Writes ``recorded`` = ``{"count", "dropped"}``: events handed to the writer."""
    events = scope.fleet.take_events()
    if events:
        scope.record(events)
    return {"count": len(events), "dropped": scope.fleet.events_dropped}
