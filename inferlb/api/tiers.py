"""Admin routes of model aliases with tiers (cost-tiered model choice, tiers/router.py).

* ``GET /admin/tiers``: each alias of the fleet in force: its tiers and thresholds, per tier the
  requests chosen and finished, errors, SLO misses, SLO attainment and cost since start, the
  guard's state (tripped, why, the window's rates) and the learned model's (when enabled), and the
  recent guard transitions.
* ``POST /admin/tiers/explain`` (body: an OpenAI chat or completions request naming an alias):
  the tier it would go to now, its score, features and contributions, without sending it (nor
  counting it). 400 for a model that is not an alias with tiers.

Guarded like the other admin routes (``app.py``: :func:`~inferlb.api.auth.require_admin`). Errors
use the OpenAI envelope.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from inferlb.api.deps import GatewayDep
from inferlb.errors import InvalidRequest
from inferlb.tiers.classify import request_text
from inferlb.tiers.router import TierRouter

__all__ = ["router"]

router = APIRouter()


@router.get("/admin/tiers")
async def tiers(gw: GatewayDep) -> dict[str, Any]:
    rt = gw.rt
    t = rt.tiers
    return {"object": "list", "data": t.describe(rt.fleet_cfg.models) if t is not None else []}


@router.post("/admin/tiers/explain")
async def explain(request: Request, gw: GatewayDep) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise InvalidRequest("the body must be a JSON object", param=None) from None
    if not isinstance(body, dict):
        raise InvalidRequest("the body must be a JSON object", param=None)
    rt = gw.rt
    name = body.get("model")
    m = rt.fleet_cfg.model(name) if isinstance(name, str) else None
    if m is None or m.tiers is None:
        raise InvalidRequest(f"'{name}' is not a model alias with tiers", param="model", code="model_not_tiered")
    endpoint = "chat" if "messages" in body else "completions"
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    max_tokens = max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) else None
    text = request_text(body)
    prompt = rt.estimator.estimate(m.tiers.models[0].model, len(text.encode("utf-8", "replace")), text, endpoint)
    # A scratch router on the live guards and learned models (a guard's due transition is the live
    # one's, kept in its transitions); its own choice counts are thrown away.
    dry = TierRouter(rt.clock)
    if rt.tiers is not None:
        dry.guards, dry.models, dry.transitions = rt.tiers.guards, rt.tiers.models, rt.tiers.transitions
    choice = dry.choose(m.name, m.tiers, body, prompt_tokens=prompt, max_tokens=max_tokens,
                        request_id="explain", text=text, slos=rt.fleet_cfg.slos)
    return choice.to_json()
