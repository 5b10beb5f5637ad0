"""Field checkers for :mod:`inferlb.api.validation` (pure, no I/O).

Each checker reads one field (or one small group) of an already-parsed request body and either
returns the value the gateway needs or raises :class:`~inferlb.errors.InvalidRequest` with
``param`` set to the field path (``tools[1].function.name``) and an OpenAI-style ``code``.

Contracts:

* A checker never mutates the body and never copies it.
* ``null`` (``None``) means "absent" for every optional field, as in the OpenAI API.
* ``bool`` is never accepted where a number is expected (``True`` is not ``1``), and no string is
  accepted where a ``bool`` is expected (``"true"`` is not ``True``): strict, unlike pydantic's
  lax mode.
* Messages name JSON types (``number``, ``array``), never Python reprs, and echo client text only
  through :func:`clip` (at most ~64 characters).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any, Final, NoReturn

from inferlb.errors import InvalidRequest

__all__ = [
    "ECHO_MAX_CHARS",
    "FORBIDDEN_KEYS",
    "INT32_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "Link",
    "check_logit_bias",
    "check_max_tokens",
    "check_model",
    "check_n",
    "check_response_format",
    "check_sampling",
    "check_stop",
    "check_stream",
    "check_tool_choice",
    "check_tools",
    "check_user",
    "clip",
    "fail",
    "find_forbidden",
    "join_path",
    "json_type",
    "opt_bool",
    "opt_int",
    "opt_number",
    "render_path",
]

ECHO_MAX_CHARS: Final = 64
MODEL_MAX_CHARS: Final = 256
USER_MAX_CHARS: Final = 256
STOP_MAX_ITEMS: Final = 4
STOP_MAX_CHARS: Final = 1024
LOGIT_BIAS_MAX_ENTRIES: Final = 300
TOOLS_MAX: Final = 128
INT32_MAX: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1

_UNSAFE = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
_TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_TOKEN_ID_KEY = re.compile(r"[0-9]{1,10}")
_RESPONSE_FORMAT_TYPES: Final = frozenset({"text", "json_object", "json_schema", "structural_tag"})
_TOOL_CHOICE_MODES: Final = frozenset({"none", "auto", "required"})

# Fields that would redirect traffic or credentials if a node (often itself a proxy such as
# LiteLLM) honoured them. Compared after lower-casing and turning "-" into "_".
FORBIDDEN_KEYS: Final = frozenset({
    "api_base", "base_url", "api_key", "api_url", "api_endpoint", "endpoint_url", "api_token",
    "extra_headers", "headers", "default_headers", "extra_query", "organization",
    "azure_endpoint", "azure_ad_token", "azure_ad_token_provider", "azure_deployment",
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "aws_profile_name",
    "aws_role_name", "aws_web_identity_token", "aws_bedrock_runtime_endpoint",
    "vertex_credentials", "vertex_project", "vertex_location",
    "proxy", "proxies", "http_client", "custom_llm_provider",
    "callbacks", "success_callback", "failure_callback", "callback_url", "webhook_url",
    # vLLM prefill/decode disaggregation: names the host a decode node pulls KV cache from; only
    # the gateway (the P/D proxy) may set it.
    "kv_transfer_params", "remote_host",
})  # fmt: skip
# ...and any key whose separator-free lower-case form ends with one of these.
_FORBIDDEN_SUFFIXES: Final = (
    "apibase", "baseurl", "apikey", "apitoken", "accesstoken", "secretkey",
    "endpointurl", "callbackurl", "webhookurl", "proxyurl",
)  # fmt: skip
# Media references that OpenAI / vLLM define in content parts: URL values are allowed there.
_MEDIA_URL_KEYS: Final = frozenset({"url", "image_url", "video_url", "audio_url", "file_url"})
# Keys known to be harmless: skips the normalisation work on the hot path.
_SAFE_KEYS: Final = frozenset({
    "model", "messages", "role", "content", "name", "type", "text", "prompt", "input", "stream",
    "stream_options", "include_usage", "max_tokens", "max_completion_tokens", "n", "temperature",
    "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
    "stop", "seed", "user", "logit_bias", "logprobs", "top_logprobs", "response_format", "tools",
    "tool_choice", "function", "parameters", "description", "strict", "tool_calls", "tool_call_id",
    "id", "arguments", "image_url", "url", "detail", "input_audio", "data", "format",
    "encoding_format", "dimensions", "ignore_eos", "min_tokens", "continuous_usage_stats",
    "priority", "echo", "suffix", "best_of", "parallel_tool_calls", "metadata", "json_schema",
    "schema", "refusal", "reasoning_content", "properties", "required", "items", "enum",
})  # fmt: skip

_JSON_TYPES: Final[dict[type, str]] = {
    str: "string", bool: "boolean", int: "integer", float: "number", list: "array", dict: "object",
    type(None): "null",
}  # fmt: skip


def json_type(value: object) -> str:
    """The JSON name of ``value``'s type (never a Python repr)."""
    return _JSON_TYPES.get(type(value), "value")


def clip(text: str, limit: int = ECHO_MAX_CHARS) -> str:
    """``text`` cut to ``limit`` characters, control characters and lone surrogates escaped
    (``\\u0000``): safe to echo back and to encode as UTF-8."""
    cut = text if len(text) <= limit else text[:limit] + "…"
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", cut)


def join_path(path: str, key: str | int) -> str:
    """``path`` extended by an index (``[2]``) or a key (``.name``); a key is clipped to 64
    characters, so a path never echoes a long client string."""
    if type(key) is int:
        return f"{path}[{key}]"
    key = clip(str(key))
    return f"{path}.{key}" if path else key


def fail(message: str, param: str | None = None, code: str = "invalid_value") -> NoReturn:
    """Raise the 400 for ``param``; the one raiser the validation modules share."""
    raise InvalidRequest(message, param=param, code=code)


def _bad(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


def _type_error(param: str, expected: str, value: object) -> InvalidRequest:
    return _bad(f"'{param}' must be {expected}, got {json_type(value)}", param, "invalid_type")


def opt_bool(body: dict[str, Any], key: str, param: str | None = None) -> bool | None:
    """``body[key]`` if it is a JSON boolean, ``None`` if absent or null; else 400."""
    value = body.get(key)
    if value is None or value is True or value is False:
        return value
    raise _type_error(param or key, "a boolean", value)


def _is_int(value: object) -> bool:
    return type(value) is int  # bool is a subclass of int: excluded on purpose


def opt_int(body: dict[str, Any], key: str, lo: int, hi: int | None, param: str | None = None) -> int | None:
    """``body[key]`` as an integer in ``[lo, hi]``, ``None`` if absent or null; else 400."""
    value = body.get(key)
    if value is None:
        return None
    p = param or key
    if not _is_int(value):
        raise _type_error(p, "an integer", value)
    if value < lo:
        raise _bad(f"'{p}' must be at least {lo}", p, "integer_below_min_value")
    if hi is not None and value > hi:
        raise _bad(f"'{p}' must be at most {hi}", p, "integer_above_max_value")
    return int(value)


def opt_number(body: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    """``body[key]`` as a finite number in ``[lo, hi]``, ``None`` if absent or null; else 400."""
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not float and type(value) is not int:
        raise _type_error(key, "a number", value)
    if type(value) is float and not math.isfinite(value):
        raise _bad(f"'{key}' must be a finite number", key)
    if not lo <= value <= hi:
        raise _bad(f"'{key}' must be between {lo:g} and {hi:g}", key, "decimal_out_of_range")
    return float(value)


def check_model(body: dict[str, Any]) -> str:
    """``model``: required, a non-empty string of at most 256 characters with no control
    characters or lone surrogates (it reaches logs and the audit row; PostgreSQL rejects NUL)."""
    value = body.get("model")
    if value is None:
        raise _bad("you must provide a model parameter", "model", "missing_required_parameter")
    if type(value) is not str:
        raise _type_error("model", "a string", value)
    if not value.strip():
        raise _bad("'model' must not be empty", "model", "empty_string")
    if len(value) > MODEL_MAX_CHARS:
        raise _bad(f"'model' is longer than {MODEL_MAX_CHARS} characters", "model", "string_above_max_length")
    if _UNSAFE.search(value):
        raise _bad("'model' must not contain control characters or lone surrogates", "model")
    return value


def check_user(body: dict[str, Any]) -> None:
    """``user``: optional string of at most 256 characters, no control characters."""
    value = body.get("user")
    if value is None:
        return
    if type(value) is not str:
        raise _type_error("user", "a string", value)
    if len(value) > USER_MAX_CHARS:
        raise _bad(f"'user' is longer than {USER_MAX_CHARS} characters", "user", "string_above_max_length")
    if _UNSAFE.search(value):
        raise _bad("'user' must not contain control characters or lone surrogates", "user")


def check_max_tokens(body: dict[str, Any], cap: int | None) -> int | None:
    """The output budget from ``max_tokens`` or its alias ``max_completion_tokens``.

    Each must be an integer ≥ 1 and ≤ ``cap`` (or ≤ 2³¹−1 when no cap is given). Both present with
    different values is a 400 naming ``max_completion_tokens``.
    """
    hi = INT32_MAX if cap is None else min(cap, INT32_MAX)
    legacy = opt_int(body, "max_tokens", 1, hi)
    newer = opt_int(body, "max_completion_tokens", 1, hi)
    if legacy is not None and newer is not None and legacy != newer:
        raise _bad(
            "'max_tokens' and 'max_completion_tokens' are aliases; give one, or the same value",
            "max_completion_tokens",
        )
    return newer if newer is not None else legacy


def check_n(body: dict[str, Any], max_n: int) -> int:
    """``n``: integer in ``[1, max_n]``; 1 when absent or null."""
    value = opt_int(body, "n", 1, max_n)
    return 1 if value is None else value


def check_stream(body: dict[str, Any]) -> tuple[bool, bool]:
    """``(stream, include_usage)``.

    ``stream`` is a strict boolean. ``stream_options`` is only allowed with ``stream: true``
    (OpenAI answers 400 otherwise), must be an object, and its ``include_usage`` a boolean.
    Other keys inside ``stream_options`` (vLLM's ``continuous_usage_stats``) pass through.
    """
    stream = opt_bool(body, "stream") is True
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise _bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if type(options) is not dict:
        raise _type_error("stream_options", "an object", options)
    include = opt_bool(options, "include_usage", "stream_options.include_usage")
    return stream, include is True


def check_stop(body: dict[str, Any]) -> None:
    """``stop``: a string or a list of at most 4 strings, each at most 1,024 characters."""
    value = body.get("stop")
    if value is None:
        return
    if type(value) is str:
        items: list[Any] = [value]
    elif type(value) is list:
        if len(value) > STOP_MAX_ITEMS:
            raise _bad(f"'stop' takes at most {STOP_MAX_ITEMS} sequences", "stop", "array_above_max_length")
        items = value
    else:
        raise _type_error("stop", "a string or an array of strings", value)
    for i, item in enumerate(items):
        param = "stop" if type(value) is str else f"stop[{i}]"
        if type(item) is not str:
            raise _type_error(param, "a string", item)
        if len(item) > STOP_MAX_CHARS:
            raise _bad(f"'{param}' is longer than {STOP_MAX_CHARS} characters", param, "string_above_max_length")


def check_logit_bias(body: dict[str, Any]) -> None:
    """``logit_bias``: object of at most 300 token-id strings → numbers in [−100, 100]."""
    value = body.get("logit_bias")
    if value is None:
        return
    if type(value) is not dict:
        raise _type_error("logit_bias", "an object", value)
    if len(value) > LOGIT_BIAS_MAX_ENTRIES:
        raise _bad(
            f"'logit_bias' takes at most {LOGIT_BIAS_MAX_ENTRIES} entries",
            "logit_bias",
            "object_above_max_size",
        )
    for key, bias in value.items():
        if type(key) is not str or not _TOKEN_ID_KEY.fullmatch(key):
            raise _bad(f"'logit_bias' keys must be token ids (decimal strings), got '{clip(str(key))}'", "logit_bias")
        if type(bias) is not int and type(bias) is not float:
            raise _type_error(f"logit_bias.{key}", "a number", bias)
        if not -100 <= bias <= 100:  # also false for NaN
            raise _bad(f"'logit_bias.{key}' must be between -100 and 100", f"logit_bias.{key}")


def check_sampling(body: dict[str, Any]) -> None:
    """``temperature`` [0, 2], ``top_p`` [0, 1], the penalties [−2, 2] (finite numbers), ``seed``
    (64-bit integer), ``user``, ``stop`` and ``logit_bias``."""
    if "temperature" in body:
        opt_number(body, "temperature", 0.0, 2.0)
    if "top_p" in body:
        opt_number(body, "top_p", 0.0, 1.0)
    if "presence_penalty" in body:
        opt_number(body, "presence_penalty", -2.0, 2.0)
    if "frequency_penalty" in body:
        opt_number(body, "frequency_penalty", -2.0, 2.0)
    if "seed" in body:
        opt_int(body, "seed", INT64_MIN, INT64_MAX)
    if "user" in body:
        check_user(body)
    if "stop" in body:
        check_stop(body)
    if "logit_bias" in body:
        check_logit_bias(body)


def check_response_format(body: dict[str, Any]) -> dict[str, Any] | None:
    """``response_format``: ``{"type": text | json_object | json_schema | structural_tag}``.

    ``json_schema`` needs a ``json_schema`` object with a ``name`` (``^[a-zA-Z0-9_-]{1,64}$``), an
    optional ``schema`` object and an optional boolean ``strict``; a schema given directly under
    ``response_format`` is the classic mistake (vllm-project/vllm#35438) and gets a 400 saying so.
    ``structural_tag`` is vLLM's and passes through unchecked. Returns the schema object (opaque
    client data) or ``None``.
    """
    value = body.get("response_format")
    if value is None:
        return None
    if type(value) is not dict:
        raise _type_error("response_format", "an object", value)
    kind = value.get("type")
    if type(kind) is not str or kind not in _RESPONSE_FORMAT_TYPES:
        raise _bad(
            "'response_format.type' must be one of 'text', 'json_object', 'json_schema'",
            "response_format.type",
        )
    if kind != "json_schema":
        return None
    spec = value.get("json_schema")
    if spec is None:
        hint = " (wrap the schema: {'name': ..., 'schema': {...}})" if "schema" in value else ""
        raise _bad(
            f"'response_format.json_schema' is required when type is 'json_schema'{hint}",
            "response_format.json_schema",
            "missing_required_parameter",
        )
    if type(spec) is not dict:
        raise _type_error("response_format.json_schema", "an object", spec)
    name = spec.get("name")
    if type(name) is not str or not _TOOL_NAME.fullmatch(name):
        raise _bad(
            "'response_format.json_schema.name' must match ^[a-zA-Z0-9_-]{1,64}$",
            "response_format.json_schema.name",
        )
    schema = spec.get("schema")
    if schema is not None and type(schema) is not dict:
        raise _type_error("response_format.json_schema.schema", "an object", schema)
    opt_bool(spec, "strict", "response_format.json_schema.strict")
    return schema


def check_tools(body: dict[str, Any]) -> tuple[set[str] | None, list[dict[str, Any]]]:
    """``tools``: 1 to 128 ``{"type": "function", "function": {"name", "parameters"?}}`` (``[]`` is a 400).

    Returns ``(names, schemas)``: the declared function names (``None`` when ``tools`` is
    absent) and the ``parameters`` objects, which are opaque JSON Schemas.
    """
    value = body.get("tools")
    if value is None:
        return None, []
    if type(value) is not list:
        raise _type_error("tools", "an array", value)
    if not value:
        # OpenAI's own rule ("[] is too short - 'tools'"): an empty list is not "no tools".
        raise _bad("'tools' must not be empty: omit it or list at least one tool", "tools", "empty_array")
    if len(value) > TOOLS_MAX:
        raise _bad(f"'tools' takes at most {TOOLS_MAX} tools", "tools", "array_above_max_length")
    names: set[str] = set()
    schemas: list[dict[str, Any]] = []
    for i, tool in enumerate(value):
        p = f"tools[{i}]"
        if type(tool) is not dict:
            raise _type_error(p, "an object", tool)
        if tool.get("type") != "function":
            raise _bad(f"'{p}.type' must be 'function'", f"{p}.type")
        fn = tool.get("function")
        if type(fn) is not dict:
            raise _type_error(f"{p}.function", "an object", fn)
        name = fn.get("name")
        if type(name) is not str or not _TOOL_NAME.fullmatch(name):
            raise _bad(f"'{p}.function.name' must match ^[a-zA-Z0-9_-]{{1,64}}$", f"{p}.function.name")
        if "description" in fn and fn["description"] is not None and type(fn["description"]) is not str:
            raise _type_error(f"{p}.function.description", "a string", fn["description"])
        params = fn.get("parameters")
        if params is not None:
            if type(params) is not dict:
                raise _type_error(f"{p}.function.parameters", "an object", params)
            schemas.append(params)
        opt_bool(fn, "strict", f"{p}.function.strict")
        names.add(name)
    return names, schemas


def check_tool_choice(body: dict[str, Any], names: set[str] | None) -> None:
    """``tool_choice``: ``none`` | ``auto`` | ``required`` | ``{"type": "function", "function":
    {"name"}}`` naming a declared tool. ``required`` or a named tool without ``tools`` is a 400;
    ``none`` / ``auto`` without ``tools`` pass (clients send them routinely, nodes ignore them)."""
    value = body.get("tool_choice")
    if value is None:
        return
    if type(value) is str:
        if value not in _TOOL_CHOICE_MODES:
            raise _bad("'tool_choice' must be 'none', 'auto', 'required' or an object", "tool_choice")
        if value == "required" and not names:
            raise _bad("'tool_choice' is 'required' but no 'tools' were given", "tool_choice")
        return
    if type(value) is not dict:
        raise _type_error("tool_choice", "a string or an object", value)
    if value.get("type") != "function":
        raise _bad("'tool_choice.type' must be 'function'", "tool_choice.type")
    fn = value.get("function")
    if type(fn) is not dict or type(fn.get("name")) is not str:
        raise _bad("'tool_choice.function.name' must be a string", "tool_choice.function.name", "invalid_type")
    if names is None or fn["name"] not in names:
        raise _bad(
            f"'tool_choice' names the function '{clip(fn['name'])}', which is not in 'tools'",
            "tool_choice.function.name",
        )


def _forbidden_key(key: object) -> bool:
    if type(key) is not str:  # only reachable for dicts not built by the JSON parser
        return False
    norm = key.lower().replace("-", "_")
    return norm in FORBIDDEN_KEYS or norm.replace("_", "").endswith(_FORBIDDEN_SUFFIXES)


def _url_bearing(key: object, value: object) -> bool:
    if type(value) is not str or "://" not in value or type(key) is not str:
        return False
    norm = key.lower().replace("-", "_")
    return norm not in _MEDIA_URL_KEYS and norm.endswith(("url", "uri", "endpoint", "host"))


Link = tuple["Link | None", "str | int"]  # (parent link, key or index): a path built lazily


def render_path(link: Link | None) -> str:
    """The path (``tools[0].function.name``) of a :data:`Link` chain; client keys clipped, the
    whole clipped to 256 characters."""
    parts: list[str | int] = []
    while link is not None:
        link, key = link
        parts.append(key)
    out = ""
    for part in reversed(parts):
        out = join_path(out, part)
    return clip(out, 256)


def find_forbidden(root: object, opaque: Iterable[object] = ()) -> None:
    """400 naming the first field that would redirect traffic or credentials, at any depth.

    Checked: keys in :data:`FORBIDDEN_KEYS` (case and ``-``/``_`` insensitive), keys ending in
    ``api_base``/``base_url``/``api_key``/… and keys ending in ``url``/``uri``/``endpoint``/``host``
    whose value is a URL (``…://…``), except the media keys of content parts (``image_url.url``).
    The objects in ``opaque`` (by identity: the client's JSON Schemas, already-checked token
    lists) are client data, not inspected: a tool may well take a ``base_url`` argument.
    Iterative, so depth cannot overflow the stack; paths are only formatted for the error.
    """
    skip = {id(o) for o in opaque}
    stack: list[tuple[object, Link | None]] = [(root, None)]
    while stack:
        node, link = stack.pop()
        if type(node) is dict:
            if not node.keys() <= _SAFE_KEYS:  # the common case skips the per-key checks
                for key, value in node.items():
                    if key not in _SAFE_KEYS and (_forbidden_key(key) or _url_bearing(key, value)):
                        where = render_path((link, key))
                        raise _bad(
                            f"'{clip(where)}' is not allowed: the gateway chooses backends and credentials",
                            where,
                            "forbidden_parameter",
                        )
            for key, value in node.items():
                if (type(value) is dict or type(value) is list) and id(value) not in skip:
                    stack.append((value, (link, key)))
        elif type(node) is list:
            for i, value in enumerate(node):
                if (type(value) is dict or type(value) is list) and id(value) not in skip:
                    stack.append((value, (link, i)))
