"""Schemathesis hooks for tests/api/test_openapi_fuzz.py (loaded through ``SCHEMATHESIS_HOOKS``).

A generated model name is almost never one the fleet serves, so most cases would stop at the 404.
These hooks let Hypothesis choose, per case, between the generated name and a served one, so the
fuzzer also reaches admission, routing and the emulated nodes. The run's one check,
``not_a_server_error_but_the_clients_deadline``, is defined here too."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

_SERVED = {"/v1/embeddings": "emb"}


@schemathesis.hook
def flatmap_body(context: schemathesis.HookContext, body: Any) -> st.SearchStrategy[Any]:
    path = context.operation.path if context.operation is not None else ""
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        return st.just(body)
    return st.sampled_from([body, {**body, "model": _SERVED.get(path, "m")}])


@schemathesis.hook
def flatmap_path_parameters(context: schemathesis.HookContext, params: Any) -> st.SearchStrategy[Any]:
    if not isinstance(params, dict) or not isinstance(params.get("model"), str):
        return st.just(params)
    return st.sampled_from([params, {**params, "model": "m"}])


@schemathesis.check
def not_a_server_error_but_the_clients_deadline(ctx: Any, response: Any, case: Any) -> None:
    """``not_a_server_error``, less the one 5xx a client asks for: a 504 ``deadline_exceeded`` to a
    request that set ``x-inferlb-deadline-ms`` (its own deadline passed before a node answered, a
    documented answer: engine/outcomes.py). A 504 for any other reason is still a failure."""
    sent = {k.lower() for k in (case.headers or {})}
    if response.status_code == 504 and "x-inferlb-deadline-ms" in sent:
        try:
            code = response.json()["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = None
        if code == "deadline_exceeded":
            return None
    not_a_server_error(ctx, response, case)
    return None
