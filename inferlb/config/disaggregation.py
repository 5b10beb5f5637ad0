"""Prefill/decode disaggregation in the fleet file: a node's ``role`` and a model's ``disaggregation``.

A fleet that serves a model disaggregated::

    models:
      - name: llama-8b
        disaggregation:
          mode: prefill-decode        # the only mode
          protocol: vllm-nixl         # the request protocol of vLLM's NixlConnector (docs/disaggregation.md)
          min_prompt_tokens: 256      # shorter prompts are served whole on one decode-capable node
    nodes:
      - {name: p0, url: "http://p0:8000", models: [llama-8b], role: prefill}
      - {name: d0, url: "http://d0:8000", models: [llama-8b], role: decode}
      - {name: x0, url: "http://x0:8000", models: [llama-8b]}          # role: both (the default)

``role`` (``prefill`` | ``decode`` | ``both``, default ``both``) says which leg of a disaggregated
request a node may run; a ``both`` node runs either (and whole requests). A model with
``disaggregation`` needs at least one prefill-capable node (``prefill`` or ``both``) and one
decode-capable one (``decode`` or ``both``); a node whose role is not ``both`` serves only
disaggregated models (it is one half of a pair, never a whole server for another model).

:func:`disaggregation_problems` returns the first problem as ``(key path, message)`` so the fleet
loader (``config/settings.py``) raises one ConfigError naming file, key path and problem. It reads
models and nodes by attribute and does not import the settings module (which imports this one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DECODE_ROLES", "PREFILL_ROLES", "DisaggregationConfig", "NodeRole", "disaggregation_problems"]

NodeRole = Literal["prefill", "decode", "both"]
PREFILL_ROLES = frozenset({"prefill", "both"})
DECODE_ROLES = frozenset({"decode", "both"})


class DisaggregationConfig(BaseModel):
    """How a model is served disaggregated (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["prefill-decode"] = "prefill-decode"
    # The wire protocol between gateway and nodes: vLLM's kv_transfer_params (NixlConnector,
    # also what its P2P NCCL and Mooncake connectors accept); SGLang's bootstrap protocol is not done.
    protocol: Literal["vllm-nixl"] = "vllm-nixl"
    # Prompts shorter than this (estimated tokens) skip the prefill leg: the decode-capable node
    # serves them whole (a short prefill costs less than the KV transfer and the extra hop).
    min_prompt_tokens: int = Field(0, ge=0)
    # When no prefill-capable node is up (all ejected, or tried and failed): serve the request
    # whole on a decode-capable node (true), or fail it with 503 (false).
    colocated_fallback: bool = True


def disaggregation_problems(models: Sequence[Any], nodes: Sequence[Any]) -> tuple[str, str] | None:
    """The first problem of the fleet's roles and disaggregated models as (key path, message), or None."""
    disagg = {m.name for m in models if getattr(m, "disaggregation", None) is not None}
    for i, n in enumerate(nodes):
        role = getattr(n, "role", "both")
        if role == "both":
            continue
        for j, served in enumerate(n.models):
            if served not in disagg:
                return (f"nodes[{i}].models[{j}]",
                        f"node {n.name!r} has role {role!r}, but model {served!r} has no disaggregation: "
                        f"a {role} node serves only disaggregated models (give the model a "
                        f"disaggregation block, or the node role: both)")
    for i, m in enumerate(models):
        if getattr(m, "disaggregation", None) is None:
            continue
        if getattr(m, "kind", "llm") != "llm":
            return (f"models[{i}].disaggregation",
                    f"model {m.name!r} is of kind {m.kind!r}: only an llm model generates, so only one can "
                    f"be served prefill/decode disaggregated")
        serving = [n for n in nodes if m.name in n.models]
        pre = [n.name for n in serving if getattr(n, "role", "both") in PREFILL_ROLES]
        dec = [n.name for n in serving if getattr(n, "role", "both") in DECODE_ROLES]
        if not pre:
            return (f"models[{i}].disaggregation",
                    f"model {m.name!r} is disaggregated but no node serving it can prefill "
                    f"(role: prefill or both); serving it: {', '.join(n.name for n in serving) or 'none'}")
        if not dec:
            return (f"models[{i}].disaggregation",
                    f"model {m.name!r} is disaggregated but no node serving it can decode "
                    f"(role: decode or both); serving it: {', '.join(n.name for n in serving) or 'none'}")
    return None
