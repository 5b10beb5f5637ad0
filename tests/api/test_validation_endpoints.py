"""Client-input validation of completions, embeddings and predict bodies, and the positives: valid
bodies pass with the fields the gateway reads, and the body forwarded untouched.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from inferlb.api.validation import (
    ValidatedRequest,
    validate_chat,
    validate_completions,
    validate_embeddings,
    validate_predict,
)
from inferlb.errors import InvalidRequest
from tests.api.validation_support import _DROP, _TOOL, CANARY, _assert_clean, _chat, _fmt, _fn, _parse, _rows, _tools

# -- completions and embeddings ------------------------------------------------------------------


def _completion(**over: Any) -> dict[str, Any]:
    body = {"model": "m", "prompt": "Once upon a time", "canary_field": CANARY, **over}
    return {k: v for k, v in body.items() if v is not _DROP}


COMPLETION_CASES = [
    ("V-19c-prompt-missing", {"prompt": _DROP}, "prompt", "missing_required_parameter"),
    ("V-19c-prompt-empty-string", {"prompt": ""}, "prompt", "empty_string"),
    ("V-19c-prompt-empty-list", {"prompt": []}, "prompt", "empty_array"),
    ("V-19c-prompt-empty-item", {"prompt": ["a", ""]}, "prompt[1]", "empty_string"),
    ("V-19c-prompt-mixed", {"prompt": ["a", 1]}, "prompt[1]", "invalid_type"),
    ("V-19c-token-negative", {"prompt": [1, -1]}, "prompt[1]", "invalid_value"),
    ("V-19c-token-bool", {"prompt": [1, True]}, "prompt[1]", "invalid_value"),
    ("V-19c-token-over-int32", {"prompt": [1, 2**31]}, "prompt[1]", "invalid_value"),
    ("V-19c-token-string", {"prompt": [1, "a"]}, "prompt[1]", "invalid_value"),
    ("V-19c-token-list-empty", {"prompt": [[]]}, "prompt[0]", "empty_array"),
    ("V-19c-token-lists-mixed", {"prompt": [[1], "a"]}, "prompt[1]", "invalid_type"),
    ("V-19c-token-float", {"prompt": [[1, 2.5]]}, "prompt[0][1]", "invalid_value"),
    ("V-19c-prompt-objects", {"prompt": [{"text": "x"}]}, "prompt[0]", "invalid_type"),
    ("V-19c-prompt-object", {"prompt": {"text": "x"}}, "prompt", "invalid_type"),
    ("V-19c-prompt-int", {"prompt": 5}, "prompt", "invalid_type"),
    ("V-21c-prompt-batch-2049", {"prompt": ["x"] * 2049}, "prompt", "array_above_max_length"),
    ("V-23c-max-tokens-zero", {"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
    ("X-best-of-below-n", {"n": 2, "best_of": 1}, "best_of", "invalid_value"),
    ("V-25c-stream-int", {"stream": 1}, "stream", "invalid_type"),
    (
        "V-26c-options-no-stream",
        {"stream_options": {"include_usage": True}},
        "stream_options",
        "invalid_value",
    ),
    ("V-27c-temperature", {"temperature": 3}, "temperature", "decimal_out_of_range"),
    ("V-31c-base-url", {"base_url": "http://evil/"}, "base_url", "forbidden_parameter"),
    ("V-15c-model-int", {"model": 1}, "model", "invalid_type"),
]


@pytest.mark.parametrize(("over", "param", "code"), _rows(COMPLETION_CASES))
def test_completions_rejects(over: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_completions(_completion(**over))
    assert (info.value.param, info.value.code) == (param, code)
    _assert_clean(info.value)


EMBEDDING_CASES = [
    ("E-input-missing", {"input": _DROP}, "input", "missing_required_parameter"),
    ("E-input-empty-string", {"input": ""}, "input", "empty_string"),
    ("E-input-empty-list", {"input": []}, "input", "empty_array"),
    ("E-input-null-item", {"input": ["a", None]}, "input[1]", "invalid_type"),
    ("E-input-negative-token", {"input": [[1, 2], [-3]]}, "input[1][0]", "invalid_value"),
    ("E-input-object", {"input": {"a": 1}}, "input", "invalid_type"),
    ("E-encoding-format", {"encoding_format": "binary"}, "encoding_format", "invalid_value"),
    ("E-encoding-format-int", {"encoding_format": 1}, "encoding_format", "invalid_value"),
    ("E-dimensions-zero", {"dimensions": 0}, "dimensions", "integer_below_min_value"),
    ("E-dimensions-bool", {"dimensions": True}, "dimensions", "invalid_type"),
    ("E-model-missing", {"model": _DROP}, "model", "missing_required_parameter"),
    ("E-user-list", {"user": ["u"]}, "user", "invalid_type"),
    ("E-V-31-extra-headers", {"extra_headers": {}}, "extra_headers", "forbidden_parameter"),
]


@pytest.mark.parametrize(("over", "param", "code"), _rows(EMBEDDING_CASES))
def test_embeddings_rejects(over: dict[str, Any], param: str, code: str) -> None:
    body = {"model": "bge", "input": "hello", **over}
    with pytest.raises(InvalidRequest) as info:
        validate_embeddings({k: v for k, v in body.items() if v is not _DROP})
    assert (info.value.param, info.value.code) == (param, code)
    _assert_clean(info.value)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"api_key": "k"}, id="top"),
        pytest.param({"inputs": "x", "parameters": {"Base-URL": "http://evil/"}}, id="nested"),
        pytest.param({"inputs": [{"name": "t", "data": [1, 2]}, {"headers": {}}]}, id="in-list"),
    ],
)
def test_predict_rejects_redirect_fields(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_predict(body)
    assert info.value.code == "forbidden_parameter" and info.value.param
    _assert_clean(info.value)


def test_validators_reject_non_objects() -> None:
    not_an_object: Any = [1, 2]
    for fn in (validate_chat, validate_completions, validate_embeddings, validate_predict):
        with pytest.raises(InvalidRequest) as info:
            fn(not_an_object)
        assert info.value.code == "invalid_type"


# -- positives -----------------------------------------------------------------------------------

VLLM_EXTRAS = {
    "ignore_eos": True,
    "top_k": 40,
    "min_p": 0.05,
    "min_tokens": 4,
    "priority": -3,
    "repetition_penalty": 1.1,
    "skip_special_tokens": False,
    "chat_template_kwargs": {"enable_thinking": False},
    "guided_json": {"type": "object", "properties": {"base_url": {"type": "string"}}},
    "x_big": 123456789012345678901234567890,
    "x_float": 0.1,
}


def test_typical_chat_accepted_and_body_untouched() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}}
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "héllo"}, image, audio]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", **_fn(name="get_weather", arguments="{}")}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    schema = {"type": "object", "properties": {"api_key": {"type": "string"}, "base_url": {"type": "string"}}}
    body = _chat(
        canary_field=_DROP,
        messages=messages,
        max_completion_tokens=128,
        stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True},
        **{"temperature": 0, "top_p": 1, "presence_penalty": -2, "frequency_penalty": 2.0, "n": 2},
        **{"stop": ["\n\n"], "seed": -5, "user": "u-1", "logit_bias": {"50256": -100, "11": 5.5}},
        **_fmt(type="json_schema", json_schema={"name": "answer", "strict": True, "schema": schema}),
        **_tools(_fn(name="get_weather", description="d", parameters=schema), tool_choice=_fn(name="get_weather")),
        **VLLM_EXTRAS,
    )
    raw = json.dumps(body).encode()
    parsed = _parse(raw)
    before = copy.deepcopy(parsed)
    vr = validate_chat(parsed, want_text=True)
    assert isinstance(vr, ValidatedRequest)
    assert vr.body is parsed and vr.body == before  # forwarded as-is, not mutated
    for key, value in VLLM_EXTRAS.items():  # unknown fields pass through byte for byte
        assert json.dumps(vr.body[key]) == json.dumps(value)
    assert json.dumps(vr.body).encode() == raw
    assert (vr.endpoint, vr.model, vr.stream, vr.include_usage) == ("chat", parsed["model"], True, True)
    assert (vr.max_tokens, vr.n, vr.prompt_token_ids) == (128, 2, 0)
    assert vr.prompt_text == "Be brief.\nhéllo\nsunny"
    assert vr.prompt_bytes == len(b"Be brief.") + len("héllo".encode()) + len(b"sunny")


def test_minimal_chat_defaults() -> None:
    vr = validate_chat({"model": "m", "messages": [{"role": "user", "content": ""}]})
    assert (vr.stream, vr.include_usage, vr.max_tokens, vr.n, vr.prompt_text) == (False, False, None, 1, None)
    optional = "stream stream_options max_tokens n temperature stop logit_bias tools tool_choice seed user"
    nulls = dict.fromkeys([*optional.split(), "response_format"])
    assert validate_chat(_chat(**nulls)).n == 1  # null means absent, as in the OpenAI API


@pytest.mark.parametrize("model", ["../x", "%2e%2e/x", "mоdel", "org/model:tag@v1"])
def test_v18_path_trick_models_are_opaque_strings(model: str) -> None:
    """Validation passes them through unchanged; the registry answers 404 (rows 16–18)."""
    assert validate_chat(_chat(model=model)).model == model


def test_max_completion_tokens_alias() -> None:
    assert validate_chat(_chat(max_completion_tokens=50)).max_tokens == 50
    assert validate_chat(_chat(max_tokens=50)).max_tokens == 50
    assert validate_chat(_chat(max_tokens=50, max_completion_tokens=50)).max_tokens == 50
    assert validate_completions(_completion(max_completion_tokens=7)).max_tokens == 7


def test_stream_without_usage_and_tool_choice_modes() -> None:
    vr = validate_chat(_chat(stream=True, tool_choice="auto"))
    assert (vr.stream, vr.include_usage) == (True, False)
    assert validate_chat(_chat(tool_choice="none")).stream is False
    assert validate_chat(_chat(tools=[_TOOL], tool_choice="required")).n == 1
    assert validate_chat(_chat(response_format={"type": "json_object"})).n == 1
    assert validate_chat(_chat(stop="END", tools=[_TOOL])).n == 1


@pytest.mark.parametrize(
    ("prompt", "nbytes", "ids", "text"),
    [
        pytest.param("héllo", 6, 0, "héllo", id="string"),
        pytest.param(["a", "bc"], 3, 0, "a\nbc", id="strings"),
        pytest.param([1, 2, 3], 0, 3, "", id="token-ids"),
        pytest.param([[1, 2], [3]], 0, 3, "", id="token-id-lists"),
    ],
)
def test_completions_prompt_shapes(prompt: Any, nbytes: int, ids: int, text: str) -> None:
    vr = validate_completions(_completion(prompt=prompt, top_k=5, echo=True, n=2, best_of=3), want_text=True)
    assert vr.endpoint == "completions"
    assert (vr.prompt_bytes, vr.prompt_token_ids, vr.prompt_text) == (nbytes, ids, text)
    assert vr.body["top_k"] == 5 and vr.n == 2


@pytest.mark.parametrize("inp", ["hello", ["a", "b"], [1, 2], [[1], [2, 3]]])
def test_embeddings_accepted(inp: Any) -> None:
    body = {"model": "bge", "input": inp, "encoding_format": "base64", "dimensions": 256, "truncate": 5}
    vr = validate_embeddings(body)
    assert (vr.endpoint, vr.stream, vr.max_tokens, vr.n) == ("embeddings", False, None, 1)
    assert vr.body is body and vr.prompt_text is None


def test_predict_passthrough() -> None:
    body = {
        "inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [0.5, 1.5]}],
        "parameters": {"temperature": 0.1},
        "image_url": "https://example.com/a.png",
    }
    assert validate_predict(body) is body
