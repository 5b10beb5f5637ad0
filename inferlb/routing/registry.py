"""The routing plugins' table (:data:`BUILTINS`, an :class:`inferlb.plugins.Table`): type names →
``"module:attr"``; a user's own plugin is named by ``"module:attr"`` directly (uvicorn style).

Contract of a target: a class; when it has a ``Params`` pydantic model (rejecting unknown keys) it
is called with the validated params, else with no argument. Plugins are resolved and their params
validated once, when the router is built (the fleet file's load builds it), never per request. A
name that does not resolve is a :class:`~inferlb.errors.PluginError` at ``routing``; bad params a
:class:`~inferlb.errors.ConfigError` at ``routing.params.<name>``.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError

from inferlb.errors import ConfigError, PluginError
from inferlb.plugins import Table

__all__ = ["BUILTINS", "make_plugin", "resolve"]

_P = "inferlb.routing.plugins"
_R = "inferlb.routing"

BUILTINS = Table("routing plugin", {
    # filters
    "healthy": f"{_P}:Healthy",
    "serves-model": f"{_P}:ServesModel",
    "has-capacity": f"{_P}:HasCapacity",
    "node-selector": f"{_R}.selector:NodeSelectorFilter",
    "lora-available": f"{_R}.lora:LoraAvailable",
    # scorers
    "outstanding-tokens": f"{_P}:OutstandingTokens",
    "queue-depth": f"{_P}:QueueDepth",
    "kv-cache": f"{_P}:KVCacheScorer",
    "static-weight": f"{_P}:StaticWeight",
    "least-requests": f"{_P}:LeastRequests",
    "decode-speed": f"{_P}:DecodeSpeed",
    "predicted-latency": "inferlb.routing.learned:PredictedLatency",
    "rtt": f"{_R}.rtt:Rtt",
    "lora-affinity": f"{_R}.lora:LoraAffinity",
    # pickers
    "max-score": f"{_P}:MaxScore",
    "weighted-random": f"{_P}:WeightedRandom",
    "power-of-two": f"{_P}:PowerOfTwo",
    "round-robin": f"{_P}:RoundRobin",
    "softmax-bandit": "inferlb.routing.learned:SoftmaxBandit",
    "affinity": f"{_R}.affinity:Affinity",
})


def resolve(name: str) -> Any:
    """The plugin class for a built-in type name or a ``module:attr`` string; PluginError (at
    ``routing``) when it resolves to nothing."""
    try:
        return BUILTINS.load(name)
    except PluginError as exc:
        raise exc.located(path="routing") from exc.__cause__


def make_plugin(name: str, params: dict[str, Any] | None) -> Any:
    """Instantiate a plugin with validated params (unknown keys rejected)."""
    cls = resolve(name)
    model: type[BaseModel] | None = getattr(cls, "Params", None)
    if model is None:
        return cls()
    try:
        return cls(model.model_validate(params or {}))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"{first['msg']} ({'.'.join(str(x) for x in first['loc'])})",
                          path=f"routing.params.{name}") from exc
