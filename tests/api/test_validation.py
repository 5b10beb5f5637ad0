"""Client-input validation of chat bodies: docs/reliability.md §8 rows V-15..V-31 (body-level).

Every rejection must be a ClientError with the right status and ``param``, and its message must
carry no traceback, no Python repr and no long echo of client input (validation_support.CANARY).
The parse level is test_validation_parse.py, the other endpoints and the positives
test_validation_endpoints.py, the fuzzer test_validation_fuzz.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from inferlb.api.validation import (
    validate_chat,
)
from inferlb.errors import InvalidRequest
from tests.api.validation_support import (
    _DROP,
    _TOOL,
    CANARY,
    _assert_clean,
    _assistant_calls,
    _chat,
    _fmt,
    _fn,
    _msgs,
    _parts,
    _rows,
    _tools,
    _user,
)

# -- body level: chat rows 15, 19, 20, 21, 23–31 -------------------------------------------------

MISSING, TYPE, VALUE = "missing_required_parameter", "invalid_type", "invalid_value"
FORBIDDEN = "forbidden_parameter"
M0, P0 = "messages[0]", "messages[0].content[0]"


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
