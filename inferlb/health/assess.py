"""``assess``: one round's samples → a verdict per node and source (pure, JSON in and out).

For each node, the newest sample of each source is classified:

* ``probe``: ``ok``; ``loading`` (the readiness path answered 503); ``fail`` (refused, timeout,
  any other status); ``stale`` (older than ``stale_after_s``: unknown, never a verdict);
* ``metrics``: ``ok`` with ``load`` = ``{"running", "waiting", "kv_usage", "age_s"}``, ``fail``, ``stale``;
* ``gpu`` (node agent or DCGM): ``ok`` with ``gpu`` = the report, ``unavailable`` (the agent
  answers but NVML does not; ``gpu_reason`` says why), ``fail``, ``stale``.

A source with no sample is absent from the node's entry. Errors are carried as strings.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from inferlb.node_types import Sample

__all__ = ["assess"]


def assess(samples: Iterable[dict[str, Any]], now: float, stale_after_s: float) -> dict[str, Any]:
    newest: dict[tuple[str, str], Sample] = {}
    for raw in samples:
        s = Sample.from_json(raw)
        src = "gpu" if s.source in ("agent", "dcgm") else s.source
        key = (s.node, src)
        old = newest.get(key)
        if old is None or s.taken_at >= old.taken_at:
            newest[key] = s
    nodes: dict[str, dict[str, Any]] = {}
    for (node, src), s in sorted(newest.items()):
        entry = nodes.setdefault(node, {})
        age = round(s.age(now), 3)
        if age > stale_after_s:
            entry[src] = "stale"
            entry[f"{src}_age_s"] = age
            continue
        if src == "probe":
            if s.ok:
                entry["probe"] = "ok"
            elif s.values.get("loading"):
                entry["probe"] = "loading"
            else:
                entry["probe"] = "fail"
            entry["probe_error"] = s.error
            entry["probe_status"] = s.status
        elif src == "metrics":
            entry["metrics"] = "ok" if s.ok else "fail"
            if s.ok:
                entry["load"] = {k: s.values.get(k) for k in ("running", "waiting", "kv_usage")} | {"age_s": age}
            else:
                entry["metrics_error"] = s.error
        else:
            if not s.ok:
                entry["gpu"] = "fail"
                entry["gpu_error"] = s.error
            elif s.values.get("nvml") != "ok":
                entry["gpu"] = "unavailable"
                entry["gpu_reason"] = s.values.get("reason")
            else:
                entry["gpu"] = "ok"
                entry["gpu_report"] = s.values
            entry["gpu_source"] = s.source
    return {"nodes": nodes, "stale_after_s": stale_after_s}
