"""Prefill/decode disaggregation in the emulator: vLLM's ``kv_transfer_params`` and the KV-transfer cost.

Contract (the protocol of vLLM's NixlConnector, docs/disaggregation.md):

- A request whose ``kv_transfer_params`` has ``do_remote_decode: true`` is a *prefill leg*: the
  node prefills the prompt, generates the one token asked for (``max_tokens: 1``) and answers with
  ``kv_transfer_params`` for the decode node (:func:`prefill_answer_params`: ``do_remote_prefill:
  true``, ``remote_engine_id``, ``remote_block_ids``, ``remote_host``, ``remote_port``,
  ``remote_request_id``, ``tp_size``), as vLLM's ``NixlConnectorScheduler.request_finished`` does.
- A request whose ``kv_transfer_params`` has ``do_remote_prefill: true`` is a *decode leg*: the
  node reads the prompt's KV from the prefill node, which takes :meth:`KVTransferSpec.transfer_s`
  (prompt tokens × ``bytes_per_token`` ÷ ``link_bytes_per_s`` + ``latency_s``; the decode node's
  link), then prefills only the prompt's last token (vLLM's consumer recomputes it) and decodes.
  The transfer does not occupy the engine's steps (vLLM's request waits in
  ``WAITING_FOR_REMOTE_KVS`` while running sequences keep decoding).
- :func:`kv_leg` says which leg a body is, or raises ``ValueError`` (the node answers 400) for
  parameters vLLM would refuse: not an object, both flags, or a decode leg without
  ``remote_engine_id``.

Pure: no I/O, no clock; the node (:mod:`.node`) and the DES (:mod:`.des.pd`) use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["KVTransferSpec", "kv_leg", "prefill_answer_params"]

Leg = Literal["prefill", "decode"]


@dataclass(frozen=True, slots=True)
class KVTransferSpec:
    """The cost of moving a prompt's KV cache to this node (its link to the prefill nodes).

    Defaults: 128 KiB of KV per token (a Llama-3-8B layout: 32 layers × 8 KV heads × 128 dims ×
    K and V × 2 bytes), a 25 GB/s link (RDMA at 200 Gb/s) and 1 ms of set-up per transfer."""

    bytes_per_token: int = 131_072
    link_bytes_per_s: float = 25e9
    latency_s: float = 0.001

    def __post_init__(self) -> None:
        if self.bytes_per_token < 0:
            raise ValueError("kv_transfer.bytes_per_token must be >= 0")
        if not (math.isfinite(self.link_bytes_per_s) and self.link_bytes_per_s > 0):
            raise ValueError("kv_transfer.link_bytes_per_s must be a finite number > 0")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise ValueError("kv_transfer.latency_s must be a finite number >= 0")

    def transfer_s(self, prompt_tokens: int) -> float:
        """Seconds to pull ``prompt_tokens`` tokens of KV over the link."""
        return self.latency_s + max(0, prompt_tokens) * self.bytes_per_token / self.link_bytes_per_s


def kv_leg(body: dict[str, Any]) -> Leg | None:
    """Which leg ``body`` is (None: a whole request); ValueError for parameters vLLM refuses."""
    params = body.get("kv_transfer_params")
    if params is None:
        return None
    if not isinstance(params, dict):
        raise ValueError("kv_transfer_params must be an object")
    decode = params.get("do_remote_decode") is True
    prefill = params.get("do_remote_prefill") is True
    if decode and prefill:
        raise ValueError("kv_transfer_params: do_remote_decode and do_remote_prefill cannot both be true")
    if decode:
        return "prefill"
    if prefill:
        if not isinstance(params.get("remote_engine_id"), str) or not params.get("remote_engine_id"):
            raise ValueError("kv_transfer_params: a remote prefill needs remote_engine_id")
        if not isinstance(params.get("remote_block_ids"), list):
            raise ValueError("kv_transfer_params: a remote prefill needs remote_block_ids")
        return "decode"
    return None


def prefill_answer_params(*, engine_id: str, host: str, port: int, request_id: str, prompt_tokens: int,
                          block_tokens: int = 16) -> dict[str, Any]:
    """The ``kv_transfer_params`` a prefill node returns (vLLM NixlConnector's field names)."""
    blocks = -(-max(0, prompt_tokens) // max(1, block_tokens))
    return {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": list(range(blocks)),
            "remote_engine_id": engine_id, "remote_request_id": request_id, "remote_host": host,
            "remote_port": port, "tp_size": 1}
