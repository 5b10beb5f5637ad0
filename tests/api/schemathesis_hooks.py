"""Schemathesis hooks for tests/api/test_openapi_fuzz.py (loaded through ``SCHEMATHESIS_HOOKS``).

A generated model name is almost never one the fleet serves, so most cases would stop at the 404.
These hooks let Hypothesis choose, per case, between the generated name and a served one, so the
fuzzer also reaches admission, routing and the emulated nodes."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import strategies as st

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
