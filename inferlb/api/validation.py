"""Client-input validation for the OpenAI-compatible endpoints (pure: no I/O, no FastAPI).

Contract (docs/architecture.md, "Contracts worth keeping"; docs/reliability.md §7, §8, §9.4):

* Validate the fields the gateway reads (``model``, ``messages`` / ``prompt`` / ``input``,
  ``max_tokens`` and its alias ``max_completion_tokens``, ``n``, ``stream``, ``stream_options``)
  and the well-known OpenAI fields whose malformed values crash nodes (sampling numbers, ``stop``,
  ``logit_bias``, ``response_format``, ``tools``, ``tool_choice``, ``seed``, ``user``).
* Pass every other field through untouched: :attr:`ValidatedRequest.body` *is* the client's
  dict, not a copy, so vLLM's ``ignore_eos``, ``top_k``, ``min_tokens``, ``priority``… reach the
  node exactly as sent.
* Never honour fields that redirect traffic or credentials: ``api_base``, ``base_url``,
  ``api_key``, ``extra_headers`` and the like are **rejected** with a 400 naming the field, at the
  top level and nested (catalog row 31 allows stripping too; rejecting tells the client its
  setting was not used, where stripping would silently drop it). JSON Schemas the client supplies
  (``tools[].function.parameters``, ``response_format.json_schema.schema``, legacy
  ``functions[].parameters``, vLLM's ``guided_json`` / ``structured_outputs.json``) are opaque
  data and not inspected: a tool may legitimately take a ``base_url`` argument.
* Every rejection is a :class:`~inferlb.errors.ClientError` (400 ``InvalidRequest`` or
  413 ``PayloadTooLarge``) with ``param`` set to the field path (``messages[2].content``) and a
  message that names JSON types, never Python reprs or tracebacks, and echoes client text only
  clipped to ~64 characters. No other exception escapes, whatever the input.

Policies for the catalog rows that leave a choice (docs/reliability.md §8):

* Not body-level, so not here: rows 4 (Content-Type), 5 as a cap enforced while streaming the
  body, 6–8, 32–40 (HTTP layer), 16–18 (model registry: ``model`` is an opaque string here) and
  22 (context window: the caller has ``prompt_bytes``, ``prompt_token_ids`` and ``max_tokens``).
* Row 12, lone surrogates (``"\\ud800"``): 400. Valid surrogate *pairs* (``"\\ud83d\\ude00"``,
  what ``json.dumps`` emits for emoji) decode to one code point and are fine.
* Row 13, duplicate keys: 400 by default (the catalog's "safest"): the gateway validates the
  last value while a node or a log reader that sees the raw bytes may take the first, a classic
  parser differential. ``reject_duplicate_keys=False`` restores last-wins.
* Row 14, ``\\u0000`` in content: forwarded (models accept it; prompts are not stored by
  default, and the audit path stores lengths and hashes only). NUL and other control characters
  are rejected in ``model`` and ``user``, which do reach logs and the audit row.
* Row 23, ``max_tokens`` over the cap: 400, never clamped.
* ``tool_choice`` ``none``/``auto`` without ``tools`` pass; ``required`` or a named function
  without a matching tool is a 400.

Speed (it runs on every request). On a typical 355-byte streaming chat body with 3 messages,
measured as min of 7 x 50k runs: ``validate_chat`` takes about 9.6 µs. A strict pydantic v2
model of the same fields takes about 5.6 µs for ``model_validate`` alone. That model cannot
express the forbidden-field walk, the byte accounting, the alias and ``stream_options`` rules or
paths that echo nothing, and adding those around it gives about 13.6 µs. So the checks are
hand-written. ``parse_json_body`` takes about 10.6 µs on the same bytes; plain ``json.loads``
takes about 5 µs, and the duplicate-key hook is most of the difference. These were measured on a
2-core dev box that other jobs were loading (Python 3.11.7, pydantic 2.14), so compare the
ratios, not the absolute numbers. A quick check (its body is shorter than the one above)::

    /work/venv/bin/python -m timeit -s "from inferlb.api.validation import validate_chat" \\
      -s "b={'model':'m','messages':[{'role':'system','content':'Be brief.'},\\
      {'role':'user','content':'Hi'},{'role':'assistant','content':'Hello'}],\\
      'max_tokens':64,'temperature':0.7,'stream':True,'stream_options':{'include_usage':True}}" \\
      "validate_chat(b)"
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from inferlb.api import validation_fields as f
from inferlb.api.validation_content import _check_messages, _check_prompt, _Text
from inferlb.api.validation_fields import fail as _fail

__all__ = [
    "DEFAULT_MAX_ITEMS",
    "DEFAULT_MAX_MESSAGES",
    "DEFAULT_MAX_N",
    "ValidatedRequest",
    "validate_chat",
    "validate_completions",
    "validate_embeddings",
    "validate_predict",
]

DEFAULT_MAX_MESSAGES: Final = 2048
DEFAULT_MAX_ITEMS: Final = 2048  # batch size of a prompt / input list
DEFAULT_MAX_N: Final = 8   # Settings.max_n (INFERLB_MAX_N) overrides it per gateway
_DIMENSIONS_MAX: Final = 65536
_ENCODING_FORMATS: Final = frozenset({"float", "base64"})


@dataclass(frozen=True, slots=True)
class ValidatedRequest:
    """What the gateway reads from a valid request; ``body`` is forwarded to the node.

    ``prompt_bytes`` counts the UTF-8 bytes of the text the model will read (message text, text
    parts, prompt strings, input strings; not images or audio). ``prompt_token_ids`` counts the
    tokens a client sent directly as ids (``prompt: [1, 2, 3]``); estimate the prompt as
    ``prompt_token_ids + tokens(prompt_bytes)``. ``prompt_text`` joins the text with newlines and
    is only built when asked for (a tokenizer, or an affinity router hashing the prompt's
    prefix); it must never be logged. ``include_usage`` is true only for a stream with
    ``stream_options.include_usage`` (non-streaming answers always carry usage). ``body`` is the
    client's own dict (not copied, nothing removed).
    """

    endpoint: Literal["chat", "completions", "embeddings", "responses"]
    model: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    n: int
    prompt_bytes: int
    prompt_text: str | None
    body: dict[str, Any]
    prompt_token_ids: int = 0

# -- entry points --------------------------------------------------------------------------------


def _check_common(body: dict[str, Any], max_tokens_cap: int | None, max_n: int) -> tuple[bool, bool, int | None, int]:
    stream, include_usage = f.check_stream(body)
    return stream, include_usage, f.check_max_tokens(body, max_tokens_cap), f.check_n(body, max_n)


def _schemas(body: dict[str, Any]) -> list[object]:
    """Client JSON Schemas outside ``tools`` / ``response_format``: vLLM's ``guided_json`` and
    ``structured_outputs.json``, and the legacy ``functions[].parameters``. Opaque data."""
    found: list[object] = []
    if "guided_json" in body:
        found.append(body["guided_json"])
    outputs = body.get("structured_outputs")
    if type(outputs) is dict and "json" in outputs:
        found.append(outputs["json"])
    functions = body.get("functions")
    if type(functions) is list:
        found += [fn["parameters"] for fn in functions if type(fn) is dict and "parameters" in fn]
    return found


def _require_object(body: object) -> dict[str, Any]:
    if type(body) is not dict:
        _fail(f"request body must be a JSON object, got {f.json_type(body)}", None, "invalid_type")
    return body


def validate_chat(
    body: dict[str, Any],
    *,
    want_text: bool = False,
    max_tokens_cap: int | None = None,
    max_n: int = DEFAULT_MAX_N,
    max_messages: int = DEFAULT_MAX_MESSAGES,
) -> ValidatedRequest:
    """Validate a ``/v1/chat/completions`` body (see the module docstring for the rules)."""
    body = _require_object(body)
    model = f.check_model(body)
    text = _Text(want_text)
    _check_messages(body, text, max_messages)
    stream, include_usage, max_tokens, n = _check_common(body, max_tokens_cap, max_n)
    f.check_sampling(body)
    opaque = _schemas(body)
    if "response_format" in body and (schema := f.check_response_format(body)) is not None:
        opaque.append(schema)
    if "tools" in body or "tool_choice" in body:
        names, schemas = f.check_tools(body)
        opaque += schemas
        f.check_tool_choice(body, names)
    f.find_forbidden(body, opaque)
    return ValidatedRequest("chat", model, stream, include_usage, max_tokens, n, text.nbytes, text.joined(), body)


def validate_completions(
    body: dict[str, Any],
    *,
    want_text: bool = False,
    max_tokens_cap: int | None = None,
    max_n: int = DEFAULT_MAX_N,
    max_items: int = DEFAULT_MAX_ITEMS,
) -> ValidatedRequest:
    """Validate a ``/v1/completions`` body: ``prompt`` is a non-empty string, array of strings,
    array of token ids or array of arrays of token ids; ``best_of`` (if given) ≥ ``n``."""
    body = _require_object(body)
    model = f.check_model(body)
    text = _Text(want_text)
    ids = _check_prompt(body, "prompt", text, max_items)
    stream, include_usage, max_tokens, n = _check_common(body, max_tokens_cap, max_n)
    f.check_sampling(body)
    best_of = f.opt_int(body, "best_of", 1, max_n)
    if best_of is not None and best_of < n:
        _fail("'best_of' must be greater than or equal to 'n'", "best_of")
    opaque = _schemas(body)
    opaque.append(body["prompt"])
    if "response_format" in body and (schema := f.check_response_format(body)) is not None:
        opaque.append(schema)
    f.find_forbidden(body, opaque)
    return ValidatedRequest(
        "completions", model, stream, include_usage, max_tokens, n, text.nbytes, text.joined(), body, ids
    )


def validate_embeddings(
    body: dict[str, Any], *, want_text: bool = False, max_items: int = DEFAULT_MAX_ITEMS
) -> ValidatedRequest:
    """Validate a ``/v1/embeddings`` body: ``input`` as for ``prompt``; ``encoding_format``
    ``float`` | ``base64``; ``dimensions`` an integer ≥ 1; ``user`` as for chat."""
    body = _require_object(body)
    model = f.check_model(body)
    text = _Text(want_text)
    ids = _check_prompt(body, "input", text, max_items)
    fmt = body.get("encoding_format")
    if fmt is not None and (type(fmt) is not str or fmt not in _ENCODING_FORMATS):
        _fail("'encoding_format' must be 'float' or 'base64'", "encoding_format")
    f.opt_int(body, "dimensions", 1, _DIMENSIONS_MAX)
    f.check_user(body)
    f.find_forbidden(body, (body["input"],))
    return ValidatedRequest("embeddings", model, False, False, None, 1, text.nbytes, text.joined(), body, ids)


def validate_predict(body: dict[str, Any]) -> dict[str, Any]:
    """Validate a generic ``/v1/predict`` payload: only that it is an object with no field that
    would redirect traffic or credentials (size, depth, encoding: :func:`parse_json_body`).
    Returns ``body`` itself."""
    body = _require_object(body)
    f.find_forbidden(body)
    return body
