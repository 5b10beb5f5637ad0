"""Client-input validation under a fuzzer: whatever the body or bytes, only ClientError may escape,
and its message stays clean.
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

from inferlb.api.validation import (
    ValidatedRequest,
    validate_chat,
    validate_completions,
    validate_embeddings,
    validate_predict,
)
from inferlb.api.validation_json import parse_json_body
from inferlb.errors import ClientError
from tests.api.validation_support import _TOOL, CANARY, _assert_clean, _chat, _fmt, _fn, _tools

# -- fuzz: only ClientError may ever escape ------------------------------------------------------

_KEY_WORDS = (
    "model messages prompt input max_tokens max_completion_tokens n stream stream_options temperature "
    "top_p presence_penalty frequency_penalty stop seed user logit_bias response_format tools tool_choice "
    "encoding_format dimensions best_of api_base Base-Url role content type text function name json_schema "
    "schema include_usage image_url url tool_calls parameters x"
)
_KEYS = _KEY_WORDS.split()
_STRINGS = ["", "a", "user", "assistant", "function", "text", "image_url", "http://x/", "\x00", "\ud800"]
_STRINGS += ["é", "true", "50256", "json_schema", "auto", "required", "get_weather", CANARY]
_SCALARS: list[Any] = [None, True, False, 0, 1, -1, 2, 4, 129, 2**31, 2**64, 10**400, -(10**30)]
_SCALARS += [0.5, 1.5, -0.0, 2.5, float("nan"), float("inf"), float("-inf")]


def _rand_char(rng: random.Random) -> str:
    return chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000), 0xD800, 0]))


def _rand_str(rng: random.Random) -> str:
    if rng.random() < 0.7:
        return rng.choice(_STRINGS)
    return "".join(_rand_char(rng) for _ in range(rng.randrange(8)))


def _rand_value(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if depth > 4 or r < 0.45:
        return _rand_str(rng) if rng.random() < 0.2 else rng.choice(_SCALARS)
    if r < 0.75:
        return [_rand_value(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {rng.choice(_KEYS): _rand_value(rng, depth + 1) for _ in range(rng.randrange(5))}


def _mutate(rng: random.Random, node: Any, depth: int = 0) -> Any:
    """Replace, drop or add one thing somewhere in a (deep-copied) valid body."""
    if type(node) is dict and node and rng.random() < 0.7:
        key = rng.choice(list(node))
        op = rng.random()
        if op < 0.15:
            del node[key]
        elif op < 0.5 and type(node[key]) in (dict, list) and depth < 6:
            _mutate(rng, node[key], depth + 1)
        elif op < 0.85:
            node[key] = _rand_value(rng)
        else:
            node[rng.choice(_KEYS)] = _rand_value(rng)
    elif type(node) is list and node:
        i = rng.randrange(len(node))
        if type(node[i]) in (dict, list) and rng.random() < 0.6 and depth < 6:
            _mutate(rng, node[i], depth + 1)
        else:
            node[i] = _rand_value(rng)
    return node


_CHAT_SEED = _chat(
    messages=[
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": None, "tool_calls": [_fn(name="f", arguments="{}")]},
    ],
    stream=True,
    stream_options={"include_usage": True},
    stop=["a"],
    logit_bias={"1": 2},
    **_tools(_TOOL, tool_choice=_fn(name="get_weather")),
    **_fmt(type="json_schema", json_schema={"name": "n", "schema": {}}),
)
_SEEDS = [
    ("chat", _CHAT_SEED),
    ("completions", {"model": "m", "prompt": [[1, 2], [3]], "max_tokens": 5, "n": 2, "best_of": 2}),
    ("embeddings", {"model": "m", "input": ["a", "b"], "encoding_format": "float", "dimensions": 8}),
    ("predict", {"inputs": [{"data": [1.0]}], "parameters": {"x": {"y": [1]}}}),
]
_VALIDATORS: dict[str, Any] = dict(
    chat=validate_chat,
    completions=validate_completions,
    embeddings=validate_embeddings,
    predict=validate_predict,
)


def test_fuzz_bodies_only_client_errors_escape() -> None:
    rng = random.Random(20240611)
    outcomes = {"ok": 0, "rejected": 0}
    for _ in range(5000):
        kind, seed = rng.choice(_SEEDS)
        body = copy.deepcopy(seed)
        for _ in range(rng.randrange(1, 4)):
            _mutate(rng, body)
        if rng.random() < 0.05:
            body = _rand_value(rng)
        try:
            result = _VALIDATORS[kind](body)
        except ClientError as err:
            outcomes["rejected"] += 1
            _assert_clean(err)
        else:
            outcomes["ok"] += 1
            assert isinstance(result, (ValidatedRequest, dict))
    assert outcomes["ok"] > 100 and outcomes["rejected"] > 1000  # the fuzzer exercises both sides


def test_fuzz_raw_bytes_only_client_errors_escape() -> None:
    rng = random.Random(7)
    seeds = [json.dumps(s).encode() for _, s in _SEEDS]
    junk = [b"{", b"}", b"[", b"]", b'"', b"\\", b"\\ud800", b"NaN", b"1e999", b",", b":", b"\xff", b"\x00"]
    for _ in range(2000):
        raw = bytearray(rng.choice(seeds))
        for _ in range(rng.randrange(1, 4)):
            pos = rng.randrange(len(raw) + 1)
            op = rng.random()
            if op < 0.4:
                raw[pos:pos] = rng.choice(junk)
            elif op < 0.7:
                del raw[pos : pos + rng.randrange(1, 4)]
            else:
                raw[pos:pos] = bytes([rng.randrange(256)])
        try:
            body = parse_json_body(bytes(raw), max_bytes=4096, max_depth=8)
            validate_chat(body)
        except ClientError as err:
            _assert_clean(err)
