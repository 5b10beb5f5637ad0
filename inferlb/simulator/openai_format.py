"""OpenAI wire formats the emulator produces: pure functions from values to JSON bytes.

The shapes follow OpenAI's API reference exactly (field names, ``object`` values, ``usage: null``
on every stream chunk when ``stream_options.include_usage`` is set, a final usage chunk with
``choices: []``), so the real ``openai`` SDK parses them and the gateway sees what real servers
send. Token text is ``"tok{i} "``: it needs no JSON escaping, which lets a stream chunk be built
by splicing the token into a pre-serialised template (one concat per token, like a real server).
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import struct
from collections.abc import Mapping
from typing import Any

from .latency import estimate_tokens

__all__ = [
    "ChunkTemplate",
    "completion_body",
    "dumps",
    "embedding_vector",
    "embeddings_body",
    "error_body",
    "models_body",
    "prompt_tokens_of",
    "sse",
    "token_text",
    "usage_of",
]

SSE_DONE = b"data: [DONE]\n\n"


def dumps(obj: Any) -> bytes:
    """Compact JSON, as servers send it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def sse(obj: Any) -> bytes:
    """One SSE event carrying ``obj`` as JSON."""
    return b"data: " + dumps(obj) + b"\n\n"


def token_text(index: int) -> str:
    """The text of output token ``index``."""
    return f"tok{index} "


def usage_of(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The OpenAI ``usage`` object."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def error_body(message: str, *, type_: str = "invalid_request_error", code: str | int | None = None,
               param: str | None = None) -> bytes:
    """The OpenAI error envelope."""
    return dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def _text_bytes(value: Any) -> int:
    """UTF-8 bytes of the text inside a prompt / message content (strings and text parts)."""
    if isinstance(value, str):
        return len(value.encode())
    if isinstance(value, list):
        total = 0
        for part in value:
            if isinstance(part, str):
                total += len(part.encode())
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"].encode())
        return total
    return 0


def prompt_tokens_of(body: Mapping[str, Any], kind: str) -> int:
    """Estimated prompt tokens of a request body of ``kind`` ``chat``, ``completion`` or ``embedding``."""
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return 0
        return estimate_tokens(sum(_text_bytes(m.get("content")) for m in messages if isinstance(m, dict)))
    value = body.get("prompt" if kind == "completion" else "input")
    if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        return len(value)  # already token ids
    if isinstance(value, list) and value and all(isinstance(t, list) for t in value):
        return sum(len(t) for t in value)
    if isinstance(value, list):
        # Several prompts / inputs are separate sequences, each tokenized on its own.
        return sum(estimate_tokens(_text_bytes(v)) for v in value)
    return estimate_tokens(_text_bytes(value))


class ChunkTemplate:
    """Serialises one stream's chunks; the token chunk is a pre-split template around the text."""

    __slots__ = ("_base", "_chat", "_include_usage", "_post", "_pre")

    _MARK = "@@TOKEN@@"

    def __init__(self, *, chat: bool, rid: str, model: str, created: int, fingerprint: str,
                 include_usage: bool) -> None:
        self._chat = chat
        self._include_usage = include_usage
        self._base: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint,
        }
        pre, _, post = self._event(self._MARK, None).partition(self._MARK.encode())
        self._pre, self._post = pre, post

    def _choice(self, text: str | None, finish_reason: str | None, *, role: bool = False) -> dict[str, Any]:
        if self._chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}

    def _event(self, text: str | None, finish_reason: str | None, *, role: bool = False) -> bytes:
        obj = dict(self._base, choices=[self._choice(text, finish_reason, role=role)])
        if self._include_usage:
            obj["usage"] = None  # OpenAI sends usage: null on every chunk but the last
        return sse(obj)

    @property
    def is_chat(self) -> bool:
        return self._chat

    def role(self) -> bytes:
        """Chat only: the opening chunk carrying the assistant role and empty content."""
        return self._event("", None, role=True)

    def token(self, index: int) -> bytes:
        """The chunk carrying output token ``index``."""
        return self._pre + token_text(index).encode() + self._post

    def malformed(self, index: int) -> bytes:
        """A chunk whose JSON is cut short (broken backend)."""
        whole = self.token(index)
        return whole[: len(whole) // 2] + b"\n\n"

    def finish(self, finish_reason: str) -> bytes:
        """The closing chunk with ``finish_reason`` and no content."""
        return self._event(None, finish_reason)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The final usage chunk (``choices: []``) sent when ``include_usage`` was asked for."""
        return sse(dict(self._base, choices=[], usage=usage_of(prompt_tokens, completion_tokens)))

    @staticmethod
    def done() -> bytes:
        """The stream terminator."""
        return SSE_DONE


def completion_body(*, chat: bool, rid: str, model: str, created: int, fingerprint: str,
                    prompt_tokens: int, completion_tokens: int, finish_reason: str) -> bytes:
    """The non-stream ``chat.completion`` / ``text_completion`` body."""
    text = "".join(token_text(i) for i in range(completion_tokens))
    choice: dict[str, Any]
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                  "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return dumps({
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": [choice],
        "usage": usage_of(prompt_tokens, completion_tokens),
    })


def embedding_vector(text: str, model: str, dim: int) -> list[float]:
    """A deterministic unit vector for ``text`` (same text and model → same vector, across runs)."""
    seed = int.from_bytes(hashlib.blake2b(f"{model}\x00{text}".encode(), digest_size=8).digest(), "big")
    rng = random.Random(seed)
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = sum(v * v for v in vec) ** 0.5 or 1.0
    return [v / norm for v in vec]


def _embedding_inputs(value: Any) -> list[str]:
    """The inputs of an embeddings request, each as a string key for the vector."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(t, int) for t in value):
        return [" ".join(map(str, value))]
    if isinstance(value, list):
        return [v if isinstance(v, str) else " ".join(map(str, v)) for v in value]
    raise ValueError("input must be a string, a list of strings or token ids")


def embeddings_body(body: Mapping[str, Any], *, model: str, dim: int) -> bytes:
    """The ``/v1/embeddings`` response body; ``ValueError`` for an unusable ``input``."""
    inputs = _embedding_inputs(body.get("input"))
    if not inputs:
        raise ValueError("input must not be empty")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise ValueError("encoding_format must be 'float' or 'base64'")
    data = []
    for i, text in enumerate(inputs):
        vec = embedding_vector(text, model, dim)
        emb: list[float] | str = vec
        if fmt == "base64":
            # The SDK decodes little-endian float32, as OpenAI sends it.
            emb = base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    tokens = prompt_tokens_of(body, "embedding")
    return dumps({"object": "list", "data": data, "model": model,
                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def models_body(models: list[str], owner: str) -> bytes:
    """The ``/v1/models`` list."""
    return dumps({"object": "list", "data": [
        {"id": m, "object": "model", "created": 0, "owned_by": owner} for m in models
    ]})
