"""Fleet-file schema of cache routing fed by the engines' KV events (inferlb/kvevents).

Three places, each optional (absent: the feature is off there):

* a model's ``kv_events`` (:class:`KVEventsModel`): routing for this model reads the event-fed
  index; ``tokenizer`` says how the gateway turns a prompt into the token ids the engine hashed:
  ``model`` (the model's ``tokenizer``, a Hugging Face tokenizer.json, needs the ``tokenizers``
  extra) or ``emulator`` (the emulator's own, inferlb/routing/kvindex.py ``sim_token_ids``, for
  emulated nodes); ``block_size``: the engine's KV block size in tokens (vLLM's
  ``--block-size``, 16 by default);
* a node's ``kv_events`` (:class:`KVEventsNode`): where its engine publishes (vLLM's
  ``--kv-events-config`` ``endpoint``, a ZeroMQ ``tcp://host:port`` the gateway connects to, and
  optionally its ``replay_endpoint``), and the ``topic`` to subscribe to ("" : every topic);
* the fleet's ``kv_index`` (:class:`KVIndexConfig`): the index's memory bounds and when a
  stream counts as stale (inferlb/routing/kvindex.py).

Validation is the fleet file's: an error names the key path and its line (config/settings.py).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["KVEventsModel", "KVEventsNode", "KVIndexConfig", "check_endpoint"]

_TCP = re.compile(r"^tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_endpoint(v: str) -> str:
    """``v`` when it is a ZeroMQ ``tcp://host:port`` (port 1–65535) or ``ipc://path``."""
    if v.startswith("ipc://") and len(v) > len("ipc://"):
        return v
    m = _TCP.match(v)
    if m is None:
        raise ValueError(f"{v[:80]!r} is not a ZeroMQ endpoint: tcp://host:port or ipc://path "
                         "(the gateway connects to it; a wildcard host such as * is the publisher's bind)")
    if not 1 <= int(m.group(2)) <= 65535:
        raise ValueError(f"{v[:80]!r}: port must be 1–65535")
    return v


class KVEventsModel(_Strict):
    """A model whose routing reads the engines' KV events."""

    tokenizer: Literal["model", "emulator"] = "model"
    block_size: int = Field(16, ge=1, le=4096)


class KVEventsNode(_Strict):
    """Where a node's engine publishes its KV events."""

    endpoint: str
    replay_endpoint: str | None = None
    topic: str = Field("", max_length=256)

    @field_validator("endpoint", "replay_endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        return None if v is None else check_endpoint(v)


class KVIndexConfig(_Strict):
    """The event-fed index's bounds and staleness rules."""

    max_blocks_per_node: int = Field(1_000_000, ge=1, le=100_000_000)
    max_blocks: int = Field(4_000_000, ge=1, le=1_000_000_000)
    max_lag_s: float = Field(2.0, gt=0, le=3600)
    recover_s: float = Field(30.0, ge=0, le=86_400)
