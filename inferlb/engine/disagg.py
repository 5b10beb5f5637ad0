"""The prefill leg of a disaggregated request (vLLM's NixlConnector protocol, docs/disaggregation.md).

Contract: when the routing decision is a disaggregated pair (``scope.pair``, tasks/routing.py),
the dispatch task first runs :func:`run_prefill` on the pair's prefill node, then sends the
client's request to the decode node with the ``kv_transfer_params`` the prefill node answered
(:func:`decode_params`), streamed or not as the client asked. All of it happens before the first
byte to the client (the commit point, engine/gateway.py), so a prefill leg that fails is an
outcome like any attempt's: ``retryable`` (a connect error, a timeout, a 5xx listed in
``retry.retry_on_status``) re-routes the *pair* with the failed prefill node excluded (or, with
none left and ``colocated_fallback``, a decode-capable node serves the request whole); ``fatal``
(a 4xx) ends the request with the node's own error.

The prefill request is the client's body with ``max_tokens: 1`` (and ``max_completion_tokens: 1``
when the client sent it), ``stream: false``, no ``stream_options``, without ``min_tokens`` /
``min_completion_tokens`` (the prefill node cannot honour them in one token; the decode leg gets
them), and ``kv_transfer_params: {do_remote_decode: true, do_remote_prefill: false,
remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null}``: what
what vLLM's NixlConnector toy proxy sends (docs/disaggregation.md names the sources).

Audit: the prefill leg is an attempt of its own (its node, timings, outcome) in the record; the
decision entry says which attempt numbers were the ``prefill_attempt`` and the decode one, and
``kv_transfer`` says whether the prefill node answered transfer parameters (``missing``: the
decode node then prefilled the prompt itself, as vLLM does without them). A pair counts as one
attempt against ``retry.max_attempts``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from inferlb.engine.endpoints import node_path
from inferlb.engine.hops import hop_headers
from inferlb.errors import UpstreamError, UpstreamProtocolError
from inferlb.store.records import AttemptRecord

if TYPE_CHECKING:
    from inferlb.config.settings import TimeoutConfig
    from inferlb.engine.gateway import Gateway
    from inferlb.engine.scope import IncomingRequest, RequestScope

__all__ = ["PREFILL_KV_PARAMS", "decode_params", "prefill_body", "run_prefill"]

PREFILL_KV_PARAMS: dict[str, Any] = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                                     "remote_block_ids": None, "remote_host": None, "remote_port": None}
_JSON = "application/json"


def prefill_body(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The prefill leg's body from the client's (see the module docstring)."""
    out = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens", "min_completion_tokens")}
    out["model"] = model
    out["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in body:
        out["max_completion_tokens"] = 1
    return out


def decode_params(answer: bytes) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` of a prefill node's answer (None: it sent none);
    UpstreamProtocolError when the answer is not a JSON object."""
    try:
        parsed = json.loads(answer)
    except ValueError as exc:
        raise UpstreamProtocolError(f"the prefill answer is not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise UpstreamProtocolError("the prefill answer is not a JSON object")
    kv = parsed.get("kv_transfer_params")
    return kv if isinstance(kv, dict) and kv else None


def _timeouts(gw: Gateway, scope: RequestScope, node: str) -> TimeoutConfig:
    from inferlb.config.settings import TimeoutConfig

    t = scope.rt.fleet_cfg.timeouts
    left = max(0.001, scope.deadline_at - scope.rt.clock.monotonic())
    first = gw.first_byte.wait_s(node, stream=False, output_tokens=1,
                                 configured_s=t.first_token_s + t.per_output_token_s,
                                 prompt_tokens=int(scope.record.prompt_tokens_est or 0), floor_s=t.first_byte_floor_s)
    return TimeoutConfig.model_construct(
        connect_s=min(t.connect_s, left), first_token_s=min(first, t.total_s, left), idle_s=min(t.idle_s, left),
        total_s=min(t.total_s, left), per_output_token_s=t.per_output_token_s)


async def run_prefill(gw: Gateway, scope: RequestScope, req: IncomingRequest, node_name: str
                      ) -> dict[str, Any] | tuple[dict[str, Any], None]:
    """Run the prefill leg on ``node_name``: the decode leg's ``kv_transfer_params`` (``{}``:
    the node answered none) or, when it failed, the dispatch outcome (with no body)."""
    rt = scope.rt
    rec = scope.record
    node = rt.fleet.nodes[node_name].cfg
    attempt = AttemptRecord(number=len(rec.attempts) + 1, node=node_name, model=scope.model,
                            started_at=round(rt.clock.time(), 6))
    rec.attempts.append(attempt)
    entry = rec.decisions[-1] if rec.decisions else {}
    entry["prefill_attempt"] = attempt.number
    model = scope.upstream_model()
    headers = {"content-type": _JSON, "x-request-id": rec.request_id, "x-inferlb-attempt": str(scope.attempts + 1),
               "x-inferlb-leg": "prefill", **hop_headers(req.hops, gw.hop_id)}
    key = node.credential()
    if key:
        headers["authorization"] = f"Bearer {key}"
    tokens = int(rec.prompt_tokens_est or 0) + 1        # a prefill leg holds its prompt (and one token)
    from inferlb.engine.gateway import _cut_by, _deadline_phases  # gateway imports this module

    start = rt.clock.monotonic()
    body = json.dumps(prefill_body(req.body, model), separators=(",", ":")).encode()
    timeouts = _timeouts(gw, scope, node_name)
    cut = _deadline_phases(scope, timeouts, start)
    mark = rt.fleet.acquire(node_name, tokens)
    try:
        resp = await gw.upstream.open(node.url + node_path(req.endpoint, model), body, headers=headers,
                                      timeouts=timeouts, node=node_name, tls=node.tls)
        attempt.first_byte_at = round(rt.clock.time(), 6)
        try:
            answer = await resp.read_rest()
        finally:
            await resp.aclose()
        kv = decode_params(answer)
    except UpstreamError as exc:
        scope.attempts += 1              # the pair's try is spent
        scope.tried.append(node_name)    # the retried pair avoids this prefill node
        if entry:
            entry["attempt"] = attempt.number   # this decision's try ended here
        # A cut by the client's own deadline is no fault of the node (gateway.py _failed_outcome).
        return gw._failed_outcome(scope, attempt, node_name, exc, client_deadline=_cut_by(exc, cut)), None
    finally:
        cost = rt.fleet.release(node_name, tokens, mark)
        if cost > 0:
            rec.cost_est = round((rec.cost_est or 0.0) + cost, 9)
    took = rt.clock.monotonic() - start
    attempt.outcome = "ok"
    attempt.http_status = 200
    attempt.ended_at = round(rt.clock.time(), 6)
    rt.fleet.report_success(node_name, stream=False, completion_tokens=1, ttfb_s=took, e2e_s=took)
    gw.first_byte.observe(node_name, stream=False, ttfb_s=took, completion_tokens=1,
                          prompt_tokens=int(rec.prompt_tokens_est or 0))
    entry["kv_transfer"] = "params" if kv is not None else "missing"
    return kv or {}
