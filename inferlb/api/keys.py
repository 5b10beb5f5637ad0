"""Admin API for tenant keys and the admission state: ``POST/GET /admin/keys``,
``GET /admin/keys/{id}``, ``DELETE /admin/keys/{id}`` (revoke), ``GET /admin/admission``.

Contract: every route follows the admin rule (:func:`~inferlb.api.auth.require_admin`): with an
admin key configured it takes ``Authorization: Bearer <INFERLB_ADMIN_KEY>`` (a tenant key gets 403,
no or a wrong key 401); with none, only the loopback admin listener serves it. A created key is returned once,
in ``key``; afterwards only its ``hint`` is ever shown. Changes reach this gateway's key cache at
once; other replicas find a new key on its first use and, on PostgreSQL, drop a revoked one at
once (the store's ``NOTIFY``, admission/store.py), else within ``admission.keys_refresh_s``.
Database calls run in a worker thread; database errors are 503 in the OpenAI envelope.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import JSONResponse

from inferlb.admission.store import create_key, get_key, list_keys, revoke_key
from inferlb.api.auth import require_admin
from inferlb.api.deps import AdmissionDep, StoreDep
from inferlb.errors import ClientError, InvalidRequest, StoreError
from inferlb.store.report_params import parse_time

__all__ = ["KeyNotFound", "NewKey", "router"]

router = APIRouter(dependencies=[Depends(require_admin)])


class KeyNotFound(ClientError):
    """404: no key has this id."""

    status = 404

    def __init__(self, key_id: str) -> None:
        super().__init__(f"No API key with id {key_id!r}", param="id", code="key_not_found")


class NewKey(BaseModel):
    """The body of ``POST /admin/keys``."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1, max_length=128)
    name: str | None = Field(None, max_length=128)
    models: list[str] | None = None
    priority_ceiling: str | None = None
    # Bounded by their columns (Integer: 32 bits; BigInteger: 64): a larger number is a 400, not a 500.
    rpm: int | None = Field(None, ge=1, le=2_147_483_647)
    tpm: int | None = Field(None, ge=1, le=9_223_372_036_854_775_807)
    max_parallel: int | None = Field(None, ge=1, le=2_147_483_647)
    budget: float | None = Field(None, ge=0, allow_inf_nan=False)
    expires_in_s: float | None = Field(None, gt=0)
    pin_versions: bool = False     # may pin a model version (x-inferlb-model-version)


async def _db(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return await asyncio.to_thread(fn, *args, **kwargs)
    except StoreError as exc:
        raise _Unavailable(str(exc)) from exc


class _Unavailable(ClientError):
    status = 503
    type = "server_error"

    def __init__(self, detail: str) -> None:
        super().__init__(f"The key store is unavailable: {detail[:200]}", code="store_unavailable")


@router.post("/admin/keys", status_code=201)
async def create(body: NewKey, ctl: AdmissionDep, store: StoreDep) -> JSONResponse:
    if body.priority_ceiling is not None and ctl.policy.rank(body.priority_ceiling) is None:
        raise InvalidRequest(f"priority_ceiling {body.priority_ceiling!r} is not a configured class "
                             f"({', '.join(c.name for c in ctl.policy.classes)})", param="priority_ceiling")
    unknown = sorted(set(body.models or ()) - set(ctl.fleet.models))
    if unknown:
        raise InvalidRequest(f"unknown models: {', '.join(unknown)}", param="models")
    now = ctl.clock.time()
    # The expiry is a time like any other: the one validator refuses what the database cannot hold.
    expires_at = parse_time(now + body.expires_in_s, param="expires_in_s") if body.expires_in_s else None
    key, secret = await _db(create_key, store.engine, tenant=body.tenant, now=now, name=body.name,
                            models=body.models, priority_ceiling=body.priority_ceiling, rpm=body.rpm,
                            tpm=body.tpm, max_parallel=body.max_parallel, budget=body.budget,
                            expires_at=expires_at, pin_versions=body.pin_versions)
    ctl.keys.put(key)
    return JSONResponse({**key.public(), "key": secret}, status_code=201)


@router.get("/admin/keys")
async def list_all(store: StoreDep, tenant: str | None = None) -> dict[str, Any]:
    keys = await _db(list_keys, store.engine, tenant=tenant)
    return {"object": "list", "data": [k.public() for k in keys]}


@router.get("/admin/keys/{key_id}")
async def get_one(key_id: str, store: StoreDep) -> dict[str, Any]:
    key = await _db(get_key, store.engine, key_id)
    if key is None:
        raise KeyNotFound(key_id)
    out: dict[str, Any] = key.public()
    return out


@router.delete("/admin/keys/{key_id}")
async def revoke(key_id: str, ctl: AdmissionDep, store: StoreDep) -> dict[str, Any]:
    key = await _db(revoke_key, store.engine, key_id, now=ctl.clock.time())
    if key is None:
        raise KeyNotFound(key_id)
    ctl.keys.put(key)
    out: dict[str, Any] = key.public()
    return out


@router.get("/admin/admission")
async def admission(ctl: AdmissionDep) -> dict[str, Any]:
    """Per pool: slots, queue depth and oldest wait, shed/expired counts, the retry budget."""
    out: dict[str, Any] = ctl.snapshot()
    return out
