"""The dashboard's "LoRA adapters" panel data (``GET /dashboard/lora``): pure.

Contract: :func:`lora_panel` takes the fleet's models (config/settings.py ``ModelConfig``: the
ones with ``lora``, config/lora.py) and the gateway's node descriptions
(fleet/state.py ``Fleet.describe``: each node's ``lora`` from its last fresh metrics sample and
the adapters cooling down after a failed load) and returns ``{"enabled", "models": [{"model",
"adapters", "base", "failure_cooldown_s"}], "nodes": [{"node", "running", "waiting", "max_lora",
"failed"}]}``; ``enabled`` false with a ``reason`` when no model is served as an adapter. What
an operator reads there: where each adapter runs or waits now, how many slots each node has, and
which node is out for which adapter (routing skips it for that adapter only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["LORA_OFF_REASON", "lora_panel"]

LORA_OFF_REASON = "no model is served as a LoRA adapter (models[].lora in the fleet file)"


def _adapters(m: Any) -> list[str]:
    """The adapter names requests for ``m`` reach its nodes with (config/lora.py)."""
    own = m.lora.adapter or m.upstream_name or m.name
    names = [v.upstream_name or own for v in m.versions] if m.versions else [own]
    return sorted(set(names))


def lora_panel(models: Sequence[Any], nodes: Sequence[dict[str, Any]]) -> dict[str, Any]:
    lora_models = [m for m in models if getattr(m, "lora", None) is not None]
    if not lora_models:
        return {"enabled": False, "reason": LORA_OFF_REASON, "models": [], "nodes": []}
    out_models = [{"model": m.name, "adapters": _adapters(m), "base": m.lora.base,
                   "failure_cooldown_s": m.lora.failure_cooldown_s} for m in lora_models]
    out_nodes = []
    for n in nodes:
        lora = n.get("lora") or {}
        out_nodes.append({"node": n["name"], "running": list(lora.get("running", [])),
                          "waiting": list(lora.get("waiting", [])), "max_lora": lora.get("max_lora"),
                          "failed": list(lora.get("failed", []))})
    return {"enabled": True, "models": out_models, "nodes": out_nodes}
