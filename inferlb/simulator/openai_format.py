"""OpenAI wire formats the emulator produces: pure functions from values to JSON bytes.

The shapes follow OpenAI's API reference exactly (field names, ``object`` values, ``usage: null``
on every stream chunk when ``stream_options.include_usage`` is set, a final usage chunk with
``choices: []``), so the real ``openai`` SDK parses them and the gateway sees what real servers
send. Token text is ``"tok{i} "``: it needs no JSON escaping, which lets a stream chunk be built
by splicing the token into a pre-serialised template (one concat per token, like a real server).

The sampling fields a real server honours are honoured as vLLM answers them (:class:`GenOptions`):
``n`` choices, each with its ``index``; ``logprobs`` objects (chat: ``logprobs.content[]`` of
``token`` / ``logprob`` / ``bytes`` / ``top_logprobs``; completions: ``tokens`` /
``token_logprobs`` / ``top_logprobs`` / ``text_offset``); completions ``echo`` prepending the
prompt; embeddings ``dimensions`` truncating (and re-normalising) the vector. Every choice carries
the same token text, and ``usage.completion_tokens`` counts the tokens of all choices.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferlb.errors import InferlbError
from inferlb.simulator.latency import estimate_tokens

__all__ = [
    "ChunkTemplate",
    "GenOptions",
    "OptionError",
    "answer_text",
    "completion_body",
    "dumps",
    "embedding_vector",
    "embeddings_body",
    "error_body",
    "gen_options",
    "models_body",
    "prompt_text_of",
    "prompt_tokens_of",
    "sse",
    "token_text",
    "usage_of",
]

SSE_DONE = b"data: [DONE]\n\n"
MAX_CHOICES = 128          # vLLM has no fixed cap; this keeps one request's answer bounded
MAX_LOGPROBS = 20          # vLLM's default --max-logprobs (and OpenAI's top_logprobs cap)


def dumps(obj: Any) -> bytes:
    """Compact JSON, as servers send it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def sse(obj: Any) -> bytes:
    """One SSE event carrying ``obj`` as JSON."""
    return b"data: " + dumps(obj) + b"\n\n"


def token_text(index: int) -> str:
    """The text of output token ``index``."""
    return f"tok{index} "


def answer_text(tokens: int) -> str:
    """The whole text of an answer of ``tokens`` output tokens (every choice's, streamed or not):
    what a client that resends the conversation puts in the assistant message, and what the
    node's prefix cache keeps after the prompt (:mod:`.prefix_cache`)."""
    return "".join(token_text(i) for i in range(max(0, tokens)))


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


class OptionError(InferlbError, ValueError):
    """A sampling field with an unusable value; ``param`` names it for the error envelope. Also a
    ``ValueError``: the node's embeddings handler catches ``ValueError`` from :func:`embeddings_body` and
    reads ``param`` when it is this one."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class GenOptions:
    """The fields that change the shape of a generation's answer (defaults: one plain choice)."""

    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    echo: str | None = None    # completions: the prompt text every choice starts with

    @property
    def plain(self) -> bool:
        """True when the answer has the default shape (the pre-serialised fast path applies)."""
        return self.n == 1 and not self.logprobs and self.echo is None


def _int_field(body: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise OptionError(f"{key} must be an integer from {lo} to {hi}", key)
    return value


def _echo_text(prompt: Any) -> str:
    """The prompt as text (token ids are shown as the emulator's own token text)."""
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return "".join(token_text(t) for t in prompt)
    raise OptionError("echo needs a single prompt (a string or a list of token ids)", "echo")


def gen_options(body: Mapping[str, Any], *, chat: bool) -> GenOptions:
    """The :class:`GenOptions` of a chat / completions body; :class:`OptionError` for bad values."""
    n = _int_field(body, "n", 1, MAX_CHOICES) or 1
    if chat:
        lp = body.get("logprobs")
        if lp is not None and not isinstance(lp, bool):
            raise OptionError("logprobs must be a boolean", "logprobs")
        top = _int_field(body, "top_logprobs", 0, MAX_LOGPROBS)
        if top is not None and not lp:
            raise OptionError("top_logprobs needs logprobs: true", "top_logprobs")
        return GenOptions(n=n, logprobs=bool(lp), top_logprobs=top or 0)
    k = _int_field(body, "logprobs", 0, MAX_LOGPROBS)
    echo = body.get("echo")
    if echo is not None and not isinstance(echo, bool):
        raise OptionError("echo must be a boolean", "echo")
    return GenOptions(n=n, logprobs=k is not None, top_logprobs=k or 0,
                      echo=_echo_text(body.get("prompt")) if echo else None)


def token_logprob(index: int, rank: int = 0) -> float:
    """A fixed log-probability for output token ``index`` (``rank`` > 0: the rank-th alternative,
    always less likely than the token that was chosen)."""
    chosen = -round(0.02 + ((index * 7) % 11) * 0.03, 4)
    return chosen if rank == 0 else round(chosen - 0.75 * rank, 4)


def _alternatives(index: int, k: int) -> list[tuple[str, float]]:
    """The ``k`` most likely tokens at ``index``, the chosen one first."""
    return [(token_text(index) if r == 0 else f"alt{r} ", token_logprob(index, r)) for r in range(k)]


def _chat_logprob(index: int, top: int) -> dict[str, Any]:
    tok = token_text(index)
    return {"token": tok, "logprob": token_logprob(index), "bytes": list(tok.encode()),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())}
                             for t, lp in _alternatives(index, top)]}


def _completion_logprobs(indices: range, top: int, offsets: list[int]) -> dict[str, Any]:
    """The completions ``logprobs`` object for tokens ``indices`` (``top_logprobs`` holds at least
    the chosen token, as vLLM answers ``logprobs: 0``)."""
    return {"tokens": [token_text(i) for i in indices],
            "token_logprobs": [token_logprob(i) for i in indices],
            "top_logprobs": [dict(_alternatives(i, max(1, top))) for i in indices],
            "text_offset": offsets}


def _text_offsets(start: int, count: int) -> list[int]:
    """Character offsets of the first ``count`` output tokens after ``start`` characters."""
    out, at = [], start
    for i in range(count):
        out.append(at)
        at += len(token_text(i))
    return out


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


def _text_of(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(p if isinstance(p, str) else p["text"] for p in value
                         if isinstance(p, str) or (isinstance(p, dict) and isinstance(p.get("text"), str)))
    return ""


def prompt_text_of(body: Mapping[str, Any], kind: str) -> str:
    """The prompt's text, messages joined with newlines (what the prefix cache hashes); empty for
    token-id prompts."""
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return ""
        return "\n".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict))
    value = body.get("prompt" if kind == "completion" else "input")
    return _text_of(value) if isinstance(value, str) or (isinstance(value, list) and value
                                                         and isinstance(value[0], str)) else ""


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
    """Serialises one stream's chunks; the token chunk is a pre-split template around the text.

    With non-default :class:`GenOptions` each event is built whole instead: one chunk per choice
    (``index`` 0 … n-1), each with its ``logprobs``, as vLLM streams ``n`` > 1."""

    __slots__ = ("_base", "_chat", "_include_usage", "_opts", "_post", "_pre")

    _MARK = "@@TOKEN@@"

    def __init__(self, *, chat: bool, rid: str, model: str, created: int, fingerprint: str,
                 include_usage: bool, options: GenOptions | None = None) -> None:
        self._chat = chat
        self._include_usage = include_usage
        self._opts = options or GenOptions()
        self._base: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": fingerprint,
        }
        pre, _, post = self._event(self._MARK, None).partition(self._MARK.encode())
        self._pre, self._post = pre, post

    def _choice(self, text: str | None, finish_reason: str | None, *, role: bool = False, index: int = 0,
                logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
        if self._chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}

    def _event(self, text: str | None, finish_reason: str | None, *, role: bool = False, index: int = 0,
               logprobs: dict[str, Any] | None = None) -> bytes:
        obj = dict(self._base, choices=[self._choice(text, finish_reason, role=role, index=index,
                                                     logprobs=logprobs)])
        if self._include_usage:
            obj["usage"] = None  # OpenAI sends usage: null on every chunk but the last
        return sse(obj)

    def _each(self, text: str | None, finish_reason: str | None, *, role: bool = False,
              logprobs: dict[str, Any] | None = None) -> bytes:
        return b"".join(self._event(text, finish_reason, role=role, index=j, logprobs=logprobs)
                        for j in range(self._opts.n))

    @property
    def is_chat(self) -> bool:
        return self._chat

    def role(self) -> bytes:
        """Chat only: the opening chunk carrying the assistant role and empty content."""
        return self._each("", None, role=True)

    def opening(self) -> bytes:
        """What precedes token 0: the role chunk (chat), the echoed prompt (completions with
        ``echo``), else nothing."""
        if self._chat:
            return self.role()
        return self._each(self._opts.echo, None) if self._opts.echo else b""

    def token(self, index: int) -> bytes:
        """The chunk carrying output token ``index`` (one per choice)."""
        opts = self._opts
        if opts.plain:
            return self._pre + token_text(index).encode() + self._post
        logprobs: dict[str, Any] | None = None
        if opts.logprobs and self._chat:
            logprobs = {"content": [_chat_logprob(index, opts.top_logprobs)]}
        elif opts.logprobs:
            start = len(opts.echo or "")
            offset = _text_offsets(start, index + 1)[index]
            logprobs = _completion_logprobs(range(index, index + 1), opts.top_logprobs, [offset])
        return self._each(token_text(index), None, logprobs=logprobs)

    def malformed(self, index: int) -> bytes:
        """A chunk whose JSON is cut short (broken backend)."""
        whole = self.token(index)
        return whole[: len(whole) // 2] + b"\n\n"

    def finish(self, finish_reason: str) -> bytes:
        """The closing chunk with ``finish_reason`` and no content (one per choice)."""
        return self._each(None, finish_reason)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        """The final usage chunk (``choices: []``) sent when ``include_usage`` was asked for;
        ``completion_tokens`` is per choice."""
        return sse(dict(self._base, choices=[], usage=usage_of(prompt_tokens, completion_tokens * self._opts.n)))

    @staticmethod
    def done() -> bytes:
        """The stream terminator."""
        return SSE_DONE


def completion_body(*, chat: bool, rid: str, model: str, created: int, fingerprint: str,
                    prompt_tokens: int, completion_tokens: int, finish_reason: str,
                    options: GenOptions | None = None) -> bytes:
    """The non-stream ``chat.completion`` / ``text_completion`` body (``completion_tokens`` per choice)."""
    opts = options or GenOptions()
    text = answer_text(completion_tokens)
    tokens = range(completion_tokens)
    logprobs: dict[str, Any] | None = None
    if opts.logprobs and chat:
        logprobs = {"content": [_chat_logprob(i, opts.top_logprobs) for i in tokens]}
    elif opts.logprobs:
        logprobs = _completion_logprobs(tokens, opts.top_logprobs,
                                        _text_offsets(len(opts.echo or ""), completion_tokens))
    choices: list[dict[str, Any]] = []
    for j in range(opts.n):
        if chat:
            choices.append({"index": j, "message": {"role": "assistant", "content": text, "refusal": None},
                            "logprobs": logprobs, "finish_reason": finish_reason})
        else:
            choices.append({"index": j, "text": (opts.echo or "") + text, "logprobs": logprobs,
                            "finish_reason": finish_reason})
    return dumps({
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": fingerprint,
        "choices": choices,
        "usage": usage_of(prompt_tokens, completion_tokens * opts.n),
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
    """The ``/v1/embeddings`` response body; ``ValueError`` for an unusable ``input`` (an
    :class:`OptionError` naming the field for ``encoding_format`` / ``dimensions``); ``dimensions``
    from 1 to ``dim``."""
    inputs = _embedding_inputs(body.get("input"))
    if not inputs:
        raise ValueError("input must not be empty")
    fmt = body.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise OptionError("encoding_format must be 'float' or 'base64'", "encoding_format")
    dims = _int_field(body, "dimensions", 1, dim)
    data = []
    for i, text in enumerate(inputs):
        vec = embedding_vector(text, model, dim)
        if dims is not None and dims < dim:
            # Matryoshka truncation, as vLLM does for ``dimensions``: the first ``dims``
            # components, normalised again.
            vec = vec[:dims]
            norm = sum(v * v for v in vec) ** 0.5 or 1.0
            vec = [v / norm for v in vec]
        emb: list[float] | str = vec
        if fmt == "base64":
            # The SDK decodes little-endian float32, as OpenAI sends it.
            emb = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": emb})
    tokens = prompt_tokens_of(body, "embedding")
    return dumps({"object": "list", "data": data, "model": model,
                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def models_body(models: list[str], owner: str) -> bytes:
    """The ``/v1/models`` list."""
    return dumps({"object": "list", "data": [
        {"id": m, "object": "model", "created": 0, "owned_by": owner} for m in models
    ]})
