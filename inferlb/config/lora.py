"""The ``lora:`` of a model in the fleet file: the model is served as a LoRA adapter on a base model.

A model served as an adapter, and one whose versions are adapters::

    models:
      - name: sql-assistant
        lora: {adapter: sql-lora, base: llama-3-8b}
      - name: support-bot
        lora: {base: llama-3-8b, failure_cooldown_s: 60}
        versions:
          - {name: v1, weight: 90, upstream_name: support-lora-v1}
          - {name: v2, weight: 10, upstream_name: support-lora-v2}

vLLM serves an adapter under its adapter name (``--lora-modules sql-lora=/path``, or loaded at run
time): a request for it names the adapter in ``model``. So the adapter of a request is the model
name the node is asked for (engine/scope.py ``upstream_model``, the one place it is read from):
``adapter`` here, else the version's ``upstream_name``, else the model's ``upstream_name``, else
the model's own name. ``adapter`` is that upstream name, written where it says what it is: a model
gives ``adapter`` or ``upstream_name``, not two different ones.

``base``: the base model the nodes run (shown to operators; not sent anywhere).
``failure_cooldown_s``: how long a node where the adapter failed to load (vLLM answered 404/400
for it, routing/lora.py ``adapter_failure``) is skipped for that adapter, and for it only.

A fleet with a LoRA model routes with the ``lora-affinity`` profile unless its ``routing:`` names
a profile, filters or scorers of its own (:func:`default_profile`; routing/profiles.py).

:func:`lora_problems` returns the first problem as ``(key path, message)``, so the fleet loader
raises one ConfigError naming file, key path and problem; it reads models by attribute (the
settings module imports this one).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["ADAPTER_NAME", "LORA_PROFILE", "LoraConfig", "adapter_of", "default_profile", "lora_problems"]

# vLLM's LoRA names are free text, but they reach metric labels (comma-separated in
# vllm:lora_requests_info) and the audit trail: no commas, spaces or quotes.
ADAPTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]{0,127}")
LORA_PROFILE = "lora-affinity"


class LoraConfig(BaseModel):
    """A model served as a LoRA adapter (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    adapter: str | None = None
    base: str | None = None
    failure_cooldown_s: float = Field(30.0, gt=0)

    @field_validator("adapter")
    @classmethod
    def _adapter(cls, v: str | None) -> str | None:
        if v is not None and not ADAPTER_NAME.fullmatch(v):
            raise ValueError(f"adapter name {v!r}: 1-128 characters of letters, digits and _ . : / @ + - "
                             "(starting with a letter or digit; no commas or spaces)")
        return v

    @field_validator("failure_cooldown_s")
    @classmethod
    def _cooldown(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("failure_cooldown_s must be a finite number > 0")
        return v


def adapter_of(model: Any, upstream: str) -> str | None:
    """The adapter a request for ``model`` names on the node (``upstream``: the model name the node
    is asked for), or None when the model is not served as an adapter."""
    return upstream if getattr(model, "lora", None) is not None else None


def lora_problems(models: Sequence[Any]) -> tuple[str, str] | None:
    """The first problem of the models' ``lora`` settings as ``(key path, message)``, else None."""
    for i, m in enumerate(models):
        lc: LoraConfig | None = getattr(m, "lora", None)
        if lc is None:
            continue
        if lc.adapter is not None and m.upstream_name is not None and m.upstream_name != lc.adapter:
            return (f"models[{i}].lora.adapter",
                    f"model {m.name!r} names adapter {lc.adapter!r} and upstream_name {m.upstream_name!r}: the "
                    "adapter is the name the nodes are asked for, give one of them")
        names = [(f"models[{i}].upstream_name", m.upstream_name)]
        names += [(f"models[{i}].versions[{j}].upstream_name", v.upstream_name) for j, v in enumerate(m.versions)]
        if lc.adapter is None and m.upstream_name is None:
            names.append((f"models[{i}].name", m.name))
        for path, name in names:
            if name is not None and not ADAPTER_NAME.fullmatch(name):
                return path, (f"{name!r} is served as a LoRA adapter (models[{i}].lora), so it must be 1-128 "
                              "characters of letters, digits and _ . : / @ + - (no commas or spaces)")
    return None


def default_profile(raw: Mapping[str, Any]) -> Mapping[str, Any]:
    """A raw fleet mapping with ``routing.profile: lora-affinity`` when some model has ``lora`` and
    ``routing`` names no profile, filters or scorers of its own; ``raw`` itself otherwise."""
    models = raw.get("models")
    if not isinstance(models, list) or not any(isinstance(m, dict) and m.get("lora") is not None for m in models):
        return raw
    routing = raw.get("routing")
    if routing is None:
        routing = {}
    if not isinstance(routing, dict) or any(k in routing for k in ("profile", "filters", "scorers")):
        return raw
    return {**raw, "routing": {**routing, "profile": LORA_PROFILE}}
