"""Client-input validation: docs/reliability.md §8 rows V-01..V-31 (body-level), positives, a fuzzer.

Every rejection must be a ClientError with the right status and ``param``, and its message must
carry no traceback, no Python repr and no long echo of client input (the CANARY below).
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import pytest

from inferlb.engine.api.validation import (
    ValidatedRequest,
    parse_json_body,
    validate_chat,
    validate_completions,
    validate_embeddings,
    validate_predict,
)
from inferlb.engine.errors import ClientError, InvalidRequest, PayloadTooLarge

CANARY = "canary-7f3a" + "Z" * 300  # must never come back in an error message
MAX_BYTES = 1 << 20
MAX_DEPTH = 64


def _assert_clean(err: ClientError) -> None:
    """The envelope is well formed and safe: no traceback, repr or long echo of the input."""
    env = err.envelope()["error"]
    assert set(env) == {"message", "type", "param", "code"}
    msg = env["message"]
    assert isinstance(msg, str) and 0 < len(msg) <= 300
    assert "Traceback" not in msg and 'File "' not in msg
    assert "<class" not in msg and "object at 0x" not in msg
    for text in (msg, env["param"] or ""):
        assert CANARY[:80] not in text
    json.dumps(err.envelope(), ensure_ascii=False).encode("utf-8")  # no lone surrogates either


def _parse(raw: bytes, **kw: Any) -> dict[str, Any]:
    return parse_json_body(raw, max_bytes=MAX_BYTES, max_depth=MAX_DEPTH, **kw)


def _chat(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 2+2?"},
        ],
        "canary_field": CANARY,
    }
    body.update(over)
    return {k: v for k, v in body.items() if v is not _DROP}


_DROP: Any = object()


def _rows(rows: list[tuple[Any, ...]]) -> list[Any]:
    """Case tables are ``(id, *args)`` rows; the id doubles as the catalog row (V-nn)."""
    return [pytest.param(*args, id=case_id) for case_id, *args in rows]


_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


# -- parse level: rows 1, 2, 3, 5, 9, 10, 11, 12, 13 ---------------------------------------------

DEEP_ARRAY = b"[" * 20_000 + b"]" * 20_000
DEEP_TOOL_SCHEMA = (
    b'{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":'
    b'{"name":"f","parameters":' + b'{"a":' * 1000 + b"1" + b"}" * 1000 + b"}}]}"
)

PARSE_CASES = [
    ("V-01-truncated", b'{"model":', 400, "invalid_json"),
    ("V-01-form-encoded", b"model=m&stream=true", 400, "invalid_json"),
    ("V-01-trailing-data", b'{"a": 1} trailing', 400, "invalid_json"),
    ("V-02-array", b"[]", 400, "invalid_type"),
    ("V-02-number", b"123", 400, "invalid_type"),
    ("V-02-null", b"null", 400, "invalid_type"),
    ("V-02-string", b'"s"', 400, "invalid_type"),
    ("V-02-bool", b"true", 400, "invalid_type"),
    ("V-03-empty", b"", 400, "invalid_json"),
    ("V-03-whitespace", b" \r\n\t", 400, "invalid_json"),
    ("V-05-over-cap", b'{"p":"' + b"x" * MAX_BYTES + b'"}', 413, "payload_too_large"),
    ("V-09-array-20000-deep", DEEP_ARRAY, 400, "json_too_deep"),
    ("V-09-array-100000-deep-unclosed", b"[" * 100_000, 400, "json_too_deep"),
    ("V-09-object-1000-deep-in-tool-params", DEEP_TOOL_SCHEMA, 400, "json_too_deep"),
    ("V-09-depth-65-over-64", b'{"a":' * 65 + b"1" + b"}" * 65, 400, "json_too_deep"),
    ("V-10-nan", b'{"t": NaN}', 400, "invalid_json"),
    ("V-10-infinity", b'{"t": Infinity}', 400, "invalid_json"),
    ("V-10-minus-infinity", b'{"t": -Infinity}', 400, "invalid_json"),
    ("V-10-overflow-to-inf", b'{"t": 1e999}', 400, "invalid_json"),
    ("V-10-million-digit-int", b'{"t": ' + b"9" * 1_000_000 + b"}", 400, "invalid_json"),
    ("V-10-million-digit-float", b'{"t": 0.' + b"1" * 1_000_000 + b"}", 400, "invalid_json"),
    ("V-11-invalid-utf8", b'{"model": "\xff\xfe"}', 400, "invalid_encoding"),
    ("V-11-bad-continuation", b'{"model": "\xc3\x28"}', 400, "invalid_encoding"),
    ("V-11-utf8-encoded-surrogate", b'{"model": "\xed\xa0\x80"}', 400, "invalid_encoding"),
    ("V-11-utf16-body", b"\xff\xfe{\x00}\x00", 400, "invalid_encoding"),
]


@pytest.mark.parametrize(("raw", "status", "code"), _rows(PARSE_CASES))
def test_parse_rejects(raw: bytes, status: int, code: str) -> None:
    with pytest.raises(ClientError) as info:
        _parse(raw)
    err = info.value
    assert type(err) is (PayloadTooLarge if status == 413 else InvalidRequest)
    assert err.status == status and err.code == code and err.param is None
    assert err.__context__ is None and err.__cause__ is None  # no chained error holding the body
    _assert_clean(err)


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        pytest.param(
            rb'{"messages":[{"role":"user","content":"a\ud800b"}]}',
            "messages[0].content",
            id="V-12-lone-high",
        ),
        pytest.param(rb'{"x":{"y":["ok","\uDFFF"]}}', "x.y[1]", id="V-12-lone-low-nested"),
        pytest.param(rb'{"s":"\ude00\ud83d"}', "s", id="V-12-reversed-pair"),
    ],
)
def test_lone_surrogates_rejected(raw: bytes, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        _parse(raw)
    assert info.value.param == param and info.value.code == "invalid_encoding"
    _assert_clean(info.value)


def test_surrogate_pair_and_escaped_backslash_accepted() -> None:
    body = _parse(rb'{"a":"\ud83d\ude00","b":"\\ud800 is text","c":"\u00e9"}')
    assert body == {"a": "\U0001f600", "b": "\\ud800 is text", "c": "é"}


def test_v13_duplicate_keys_rejected_by_default_last_wins_when_allowed() -> None:
    raw = b'{"model":"m","stream":false,"messages":[],"stream":true}'
    with pytest.raises(InvalidRequest) as info:
        _parse(raw)
    assert info.value.param == "stream" and info.value.code == "duplicate_key"
    _assert_clean(info.value)
    assert _parse(raw, reject_duplicate_keys=False)["stream"] is True


def test_v13_duplicate_long_key_is_clipped() -> None:
    raw = json.dumps({"x": 1}).replace('"x"', f'"{CANARY}": 1, "{CANARY}"').encode()
    with pytest.raises(InvalidRequest) as info:
        _parse(raw)
    _assert_clean(info.value)


def test_v14_nul_in_content_is_forwarded_but_not_in_model() -> None:
    body = _parse(rb'{"model":"m","messages":[{"role":"user","content":"a\u0000b"}]}')
    assert validate_chat(body).body["messages"][0]["content"] == "a\x00b"
    with pytest.raises(InvalidRequest) as info:
        validate_chat(_parse(rb'{"model":"m\u0000x","messages":[{"role":"user","content":"a"}]}'))
    assert info.value.param == "model"


def test_parse_edges_accepted() -> None:
    assert _parse(b'\xef\xbb\xbf{"a": 1}') == {"a": 1}  # UTF-8 BOM tolerated
    assert _parse(b'{"a":' * 63 + b"[1]" + b"}" * 63) is not None  # depth exactly 64
    assert _parse(b'{"x": 1e308, "y": -0.0, "z": 1e-999}')["z"] == 0.0
    assert _parse(b'{"p":"' + b"x" * (MAX_BYTES - 8) + b'"}')  # exactly at the cap
    wide = b'{"a":[' + b",".join([b"[1]"] * 5000) + b"]}"  # many brackets, shallow
    assert len(_parse(wide)["a"]) == 5000


# -- body level: chat rows 15, 19, 20, 21, 23–31 -------------------------------------------------

MISSING, TYPE, VALUE = "missing_required_parameter", "invalid_type", "invalid_value"
FORBIDDEN = "forbidden_parameter"
M0, P0 = "messages[0]", "messages[0].content[0]"


def _msgs(*messages: Any) -> dict[str, Any]:
    return {"messages": list(messages)}


def _user(content: Any, **extra: Any) -> dict[str, Any]:
    return _msgs({"role": "user", "content": content, **extra})


def _parts(*parts: Any) -> dict[str, Any]:
    return _user(list(parts))


def _assistant_calls(calls: Any) -> dict[str, Any]:
    return _msgs({"role": "assistant", "tool_calls": calls})


def _fmt(**response_format: Any) -> dict[str, Any]:
    return {"response_format": response_format}


def _tools(*tools: Any, **over: Any) -> dict[str, Any]:
    return {"tools": list(tools), **over}


def _fn(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": function}


CHAT_CASES = [
    # V-15 model
    ("V-15-model-missing", {"model": _DROP}, "model", MISSING),
    ("V-15-model-null", {"model": None}, "model", MISSING),
    ("V-15-model-int", {"model": 7}, "model", TYPE),
    ("V-15-model-list", {"model": ["m"]}, "model", TYPE),
    ("V-15-model-empty", {"model": ""}, "model", "empty_string"),
    ("V-15-model-blank", {"model": "   "}, "model", "empty_string"),
    ("V-15-model-too-long", {"model": CANARY}, "model", "string_above_max_length"),
    ("V-15-model-control-char", {"model": "a\nb"}, "model", VALUE),
    # V-19 messages
    ("V-19-messages-missing", {"messages": _DROP}, "messages", MISSING),
    ("V-19-messages-null", {"messages": None}, "messages", MISSING),
    ("V-19-messages-string", {"messages": CANARY}, "messages", TYPE),
    ("V-19-messages-object", {"messages": {"role": "user"}}, "messages", TYPE),
    ("V-19-messages-empty", {"messages": []}, "messages", "empty_array"),
    # V-20 message shape
    ("V-20-message-not-object", _msgs("hi"), M0, TYPE),
    ("V-20-no-role", _msgs({"content": "x"}), f"{M0}.role", MISSING),
    ("V-20-unknown-role", _msgs({"role": CANARY, "content": "x"}), f"{M0}.role", VALUE),
    ("V-20-role-int", _msgs({"role": 1, "content": "x"}), f"{M0}.role", TYPE),
    ("V-20-content-int", _user(5), f"{M0}.content", TYPE),
    ("V-20-content-object", _user({"t": CANARY}), f"{M0}.content", TYPE),
    ("V-20-user-content-missing", _msgs({"role": "user"}), f"{M0}.content", MISSING),
    ("V-20-assistant-null-no-tools", _msgs({"role": "assistant", "content": None}), f"{M0}.content", MISSING),
    ("V-20-content-parts-empty", _user([]), f"{M0}.content", "empty_array"),
    ("V-20-part-not-object", _parts("x"), P0, TYPE),
    ("V-20-part-no-type", _parts({"text": "x"}), f"{P0}.type", MISSING),
    ("V-20-part-unknown-type", _parts({"type": CANARY}), f"{P0}.type", VALUE),
    ("V-20-text-part-text-int", _parts({"type": "text", "text": 5}), f"{P0}.text", TYPE),
    ("V-20-text-part-no-text", _parts({"type": "text"}), f"{P0}.text", MISSING),
    ("V-20-image-no-url", _parts({"type": "image_url", "image_url": {}}), f"{P0}.image_url.url", MISSING),
    ("V-20-image-int", _parts({"type": "image_url", "image_url": 3}), f"{P0}.image_url", TYPE),
    (
        "V-20-audio-part-no-format",
        _parts({"type": "input_audio", "input_audio": {"data": "AA=="}}),
        f"{P0}.input_audio.format",
        MISSING,
    ),
    ("V-20-name-int", _user("x", name=3), f"{M0}.name", TYPE),
    (
        "V-20-tool-call-id-int",
        _msgs({"role": "tool", "content": "x", "tool_call_id": 3}),
        f"{M0}.tool_call_id",
        TYPE,
    ),
    # V-21 too many messages
    ("V-21-2049", _msgs(*[{"role": "user", "content": "x"}] * 2049), "messages", "array_above_max_length"),
    # V-23 max_tokens / max_completion_tokens
    ("V-23-max-tokens-zero", {"max_tokens": 0}, "max_tokens", "integer_below_min_value"),
    ("V-23-max-tokens-negative", {"max_tokens": -186}, "max_tokens", "integer_below_min_value"),
    ("V-23-max-tokens-float", {"max_tokens": 1.5}, "max_tokens", TYPE),
    ("V-23-max-tokens-integral-float", {"max_tokens": 16.0}, "max_tokens", TYPE),
    ("V-23-max-tokens-string", {"max_tokens": "100"}, "max_tokens", TYPE),
    ("V-23-max-tokens-bool", {"max_tokens": True}, "max_tokens", TYPE),
    ("V-23-max-tokens-over-int32", {"max_tokens": 2**31}, "max_tokens", "integer_above_max_value"),
    ("V-23-max-tokens-huge", {"max_tokens": 10**400}, "max_tokens", "integer_above_max_value"),
    ("V-23-mct-0", {"max_completion_tokens": 0}, "max_completion_tokens", "integer_below_min_value"),
    ("V-23-mct-bool", {"max_completion_tokens": False}, "max_completion_tokens", TYPE),
    (
        "V-23-aliases-disagree",
        {"max_tokens": 10, "max_completion_tokens": 20},
        "max_completion_tokens",
        VALUE,
    ),
    # V-24 n
    ("V-24-n-zero", {"n": 0}, "n", "integer_below_min_value"),
    ("V-24-n-over-cap", {"n": 9}, "n", "integer_above_max_value"),
    ("V-tools-empty", {"tools": []}, "tools", "empty_array"),
    ("V-24-n-bool", {"n": True}, "n", TYPE),
    ("V-24-n-float", {"n": 2.0}, "n", TYPE),
    # V-25 stream
    ("V-25-stream-yes", {"stream": "yes"}, "stream", TYPE),
    ("V-25-stream-string-true", {"stream": "true"}, "stream", TYPE),
    ("V-25-stream-one", {"stream": 1}, "stream", TYPE),
    ("V-25-stream-object", {"stream": {}}, "stream", TYPE),
    # V-26 stream_options
    (
        "V-26-stream-false",
        {"stream": False, "stream_options": {"include_usage": True}},
        "stream_options",
        VALUE,
    ),
    ("V-26-stream-absent", {"stream_options": {"include_usage": True}}, "stream_options", VALUE),
    ("V-26-not-object", {"stream": True, "stream_options": "usage"}, "stream_options", TYPE),
    (
        "V-26-include-usage-string",
        {"stream": True, "stream_options": {"include_usage": "true"}},
        "stream_options.include_usage",
        TYPE,
    ),
    # V-27 sampling numbers
    ("V-27-temperature-negative", {"temperature": -0.1}, "temperature", "decimal_out_of_range"),
    ("V-27-temperature-over-2", {"temperature": 2.01}, "temperature", "decimal_out_of_range"),
    ("V-27-temperature-nan", {"temperature": float("nan")}, "temperature", VALUE),
    ("V-27-temperature-inf", {"temperature": float("inf")}, "temperature", VALUE),
    ("V-27-temperature-string", {"temperature": "0.5"}, "temperature", TYPE),
    ("V-27-temperature-bool", {"temperature": True}, "temperature", TYPE),
    ("V-27-top-p-over-1", {"top_p": 1.5}, "top_p", "decimal_out_of_range"),
    ("V-27-top-p-negative", {"top_p": -1}, "top_p", "decimal_out_of_range"),
    ("V-27-presence", {"presence_penalty": 2.5}, "presence_penalty", "decimal_out_of_range"),
    ("V-27-frequency", {"frequency_penalty": -3}, "frequency_penalty", "decimal_out_of_range"),
    # V-28 stop / logit_bias
    ("V-28-stop-5-items", {"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length"),
    ("V-28-stop-huge-string", {"stop": CANARY * 10}, "stop", "string_above_max_length"),
    ("V-28-stop-huge-item", {"stop": ["ok", CANARY * 10]}, "stop[1]", "string_above_max_length"),
    ("V-28-stop-item-int", {"stop": ["ok", 3]}, "stop[1]", TYPE),
    ("V-28-stop-int", {"stop": 3}, "stop", TYPE),
    ("V-28-bias-301", {"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", "object_above_max_size"),
    ("V-28-bias-over-100", {"logit_bias": {"50256": 101}}, "logit_bias.50256", VALUE),
    ("V-28-bias-under-minus-100", {"logit_bias": {"50256": -100.5}}, "logit_bias.50256", VALUE),
    ("V-28-bias-nan", {"logit_bias": {"50256": float("nan")}}, "logit_bias.50256", VALUE),
    ("V-28-bias-huge-int", {"logit_bias": {"50256": 10**400}}, "logit_bias.50256", VALUE),
    ("V-28-bias-string-value", {"logit_bias": {"50256": "1"}}, "logit_bias.50256", TYPE),
    ("V-28-bias-bad-key", {"logit_bias": {CANARY: 1}}, "logit_bias", VALUE),
    ("V-28-bias-array", {"logit_bias": [1, 2]}, "logit_bias", TYPE),
    # V-29 response_format
    (
        "V-29-schema-not-wrapped",
        _fmt(type="json_schema", schema={"type": "object"}),
        "response_format.json_schema",
        MISSING,
    ),
    (
        "V-29-json-schema-no-name",
        _fmt(type="json_schema", json_schema={"schema": {}}),
        "response_format.json_schema.name",
        VALUE,
    ),
    ("V-29-json-schema-str", _fmt(type="json_schema", json_schema="x"), "response_format.json_schema", TYPE),
    (
        "V-29-schema-array",
        _fmt(type="json_schema", json_schema={"name": "n", "schema": []}),
        "response_format.json_schema.schema",
        TYPE,
    ),
    ("V-29-unknown-type", _fmt(type=CANARY), "response_format.type", VALUE),
    ("V-29-no-type", _fmt(), "response_format.type", VALUE),
    ("V-29-not-object", {"response_format": "json"}, "response_format", TYPE),
    # V-30 tools / tool_choice
    ("V-30-tools-object", {"tools": {"type": "function"}}, "tools", TYPE),
    ("V-30-tool-string", _tools("get_weather"), "tools[0]", TYPE),
    ("V-30-tool-type", _tools({"type": "retrieval"}), "tools[0].type", VALUE),
    ("V-30-tool-no-function", _tools({"type": "function"}), "tools[0].function", TYPE),
    ("V-30-tool-name-space", _tools(_fn(name="bad name")), "tools[0].function.name", VALUE),
    ("V-30-tool-name-65", _tools(_fn(name="f" * 65)), "tools[0].function.name", VALUE),
    ("V-30-tool-name-missing", _tools(_fn()), "tools[0].function.name", VALUE),
    ("V-30-tool-params-str", _tools(_fn(name="f", parameters="x")), "tools[0].function.parameters", TYPE),
    ("V-30-129-tools", _tools(*[_TOOL] * 129), "tools", "array_above_max_length"),
    ("V-30-choice-unknown-mode", _tools(_TOOL, tool_choice="sometimes"), "tool_choice", VALUE),
    ("V-30-choice-no-such", _tools(_TOOL, tool_choice=_fn(name=CANARY)), "tool_choice.function.name", VALUE),
    ("V-30-choice-no-tools", {"tool_choice": _fn(name="get_weather")}, "tool_choice.function.name", VALUE),
    ("V-30-required-without-tools", {"tool_choice": "required"}, "tool_choice", VALUE),
    ("V-30-choice-no-fn", _tools(_TOOL, tool_choice={"type": "function"}), "tool_choice.function.name", TYPE),
    ("V-30-tool-choice-int", _tools(_TOOL, tool_choice=1), "tool_choice", TYPE),
    (
        "V-30-tool-call-no-function",
        _assistant_calls([{"id": "c", "type": "function"}]),
        f"{M0}.tool_calls[0].function",
        TYPE,
    ),
    ("V-30-tool-calls-object", _assistant_calls({"id": "c"}), f"{M0}.tool_calls", TYPE),
    (
        "V-30-tool-call-arguments-object",
        _assistant_calls([_fn(name="f", arguments={})]),
        f"{M0}.tool_calls[0].function.arguments",
        TYPE,
    ),
    # V-31 fields that would redirect traffic or credentials
    ("V-31-api-base", {"api_base": "http://169.254.169.254/"}, "api_base", FORBIDDEN),
    ("V-31-base-url", {"base_url": "http://127.0.0.1:1/"}, "base_url", FORBIDDEN),
    ("V-31-api-key", {"api_key": "sk-x"}, "api_key", FORBIDDEN),
    ("V-31-api-key-spelling", {"API-Key": "sk-x"}, "API-Key", FORBIDDEN),
    ("V-31-extra-headers", {"extra_headers": {"Authorization": "x"}}, "extra_headers", FORBIDDEN),
    ("V-31-nested", {"metadata": {"api_base": "http://e/"}}, "metadata.api_base", FORBIDDEN),
    (
        "V-31-nested-suffix-in-list",
        {"extra_body": [{"openai_base_url": "http://e/"}]},
        "extra_body[0].openai_base_url",
        FORBIDDEN,
    ),
    (
        "V-31-nested-credentials",
        {"litellm_params": {"aws_secret_access_key": "k"}},
        "litellm_params.aws_secret_access_key",
        FORBIDDEN,
    ),
    ("V-31-url", {"callback_endpoint": "https://169.254.169.254/"}, "callback_endpoint", FORBIDDEN),
    ("V-31-inside-message", _user("x", api_key="k"), f"{M0}.api_key", FORBIDDEN),
    (
        "V-31-inside-stream-options",
        {"stream": True, "stream_options": {"base_url": "http://x/"}},
        "stream_options.base_url",
        FORBIDDEN,
    ),
    ("V-31-kv-transfer-params", {"kv_transfer_params": {"remote_port": 1}}, "kv_transfer_params", FORBIDDEN),
    ("V-31-long-key-clipped", {CANARY + "_api_key": "k"}, None, FORBIDDEN),
    # extra fields
    ("X-seed-string", {"seed": "42"}, "seed", TYPE),
    ("X-seed-over-int64", {"seed": 2**64}, "seed", "integer_above_max_value"),
    ("X-user-int", {"user": 5}, "user", TYPE),
    ("X-user-too-long", {"user": CANARY}, "user", "string_above_max_length"),
    ("X-user-nul", {"user": "u\x00"}, "user", VALUE),
    ("X-lone-surrogate-in-dict", _user("a\ud800"), f"{M0}.content", "invalid_encoding"),
]


@pytest.mark.parametrize(("over", "param", "code"), _rows(CHAT_CASES))
def test_chat_rejects(over: dict[str, Any], param: str | None, code: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_chat(_chat(**over))
    err = info.value
    assert err.status == 400 and err.type == "invalid_request_error" and err.code == code
    if param is not None:
        assert err.param == param
    else:
        assert err.param is not None and len(err.param) <= 260
    _assert_clean(err)


def test_v23_max_tokens_cap_is_enforced() -> None:
    assert validate_chat(_chat(max_tokens=1000), max_tokens_cap=1000).max_tokens == 1000
    with pytest.raises(InvalidRequest) as info:
        validate_chat(_chat(max_completion_tokens=1001), max_tokens_cap=1000)
    assert info.value.param == "max_completion_tokens" and info.value.code == "integer_above_max_value"


def test_v24_n_cap_is_configurable() -> None:
    with pytest.raises(InvalidRequest) as info:
        validate_chat(_chat(n=9), max_n=8)
    assert info.value.param == "n"
    assert validate_chat(_chat(n=8)).n == 8              # the default cap is 8
    assert validate_chat(_chat(n=20), max_n=32).n == 20


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
