"""Validation of ``POST /v1/responses`` (the OpenAI Responses API), kept minimal: the gateway reads
``model``, ``input``, ``stream`` and ``max_output_tokens``; every other field goes to the node
untouched (the node validates them), except fields that would redirect traffic or credentials."""

from __future__ import annotations

from typing import Any

from inferlb.api import validation_fields as f
from inferlb.api.validation import ValidatedRequest
from inferlb.errors import InvalidRequest

__all__ = ["MAX_OUTPUT_TOKENS", "validate_responses"]

#: The largest ``max_output_tokens`` the validator lets through (a model's own limit applies after it).
MAX_OUTPUT_TOKENS = 1 << 31


def _text_bytes(value: Any, parts: list[str]) -> None:
    """Collect the text the model reads: a string, messages' ``content``, parts' ``text``."""
    if isinstance(value, str):
        parts.append(value)
    elif isinstance(value, list):
        for item in value:
            _text_bytes(item, parts)
    elif isinstance(value, dict):
        for key in ("content", "text"):
            if key in value:
                _text_bytes(value[key], parts)


def validate_responses(body: dict[str, Any], *, want_text: bool = False) -> ValidatedRequest:
    """``model`` (required), ``input`` (a non-empty string or list), ``stream`` (bool),
    ``max_output_tokens`` (integer ≥ 1)."""
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", param=None)
    model = f.check_model(body)
    inp = body.get("input")
    if not (isinstance(inp, str) and inp) and not (isinstance(inp, list) and inp):
        raise InvalidRequest("'input' is required: a non-empty string or a list of input items", param="input",
                             code="missing_required_parameter" if inp is None else "invalid_value")
    stream = bool(f.opt_bool(body, "stream"))
    max_tokens = f.opt_int(body, "max_output_tokens", 1, MAX_OUTPUT_TOKENS)
    f.find_forbidden(body)
    parts: list[str] = []
    _text_bytes(inp, parts)
    text = "\n".join(parts)
    nbytes = len(text.encode("utf-8", "replace"))
    return ValidatedRequest("responses", model, stream, False, max_tokens, 1, nbytes,
                            text if want_text else None, body)
