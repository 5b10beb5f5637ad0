"""Which client endpoints a node serves, and the node path each one is forwarded to.

Every node kind speaks the OpenAI chat, completions and embeddings routes (the gateway's contract
with its fleet). The Responses API (``/v1/responses``) is served by vLLM and by OpenAI-compatible
servers that implement it (``openai``; the emulator, ``sim``); TGI, SGLang, Triton, Ollama and
llama.cpp nodes are never sent one. ``predict`` goes to the KServe-v2 path of the model.
"""

from __future__ import annotations

__all__ = ["NODE_PATHS", "RESPONSES_NODE_KINDS", "node_path", "serves"]

NODE_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings",
              "responses": "/v1/responses"}
RESPONSES_NODE_KINDS = frozenset({"vllm", "openai", "sim"})


def serves(endpoint: str, node_kind: str) -> bool:
    """True when a node of ``node_kind`` serves ``endpoint``."""
    return endpoint != "responses" or node_kind in RESPONSES_NODE_KINDS


def node_path(endpoint: str, upstream_model: str) -> str:
    """The path on the node for ``endpoint`` (``predict``: the model's KServe-v2 infer path)."""
    if endpoint == "predict":
        return f"/v2/models/{upstream_model}/infer"
    return NODE_PATHS[endpoint]
