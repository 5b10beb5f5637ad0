"""Driving a replica's shared admission controller directly (no HTTP): the request scope and
evaluation a gateway would pass, admit and end. Used by the cluster tests on the real Redis."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from inferlb.cluster.admission import SharedAdmission
from inferlb.cluster.service import ClusterService
from inferlb.store.records import RequestRecord

EV = {"priority": "standard", "model": "m", "prompt_tokens_est": 10, "output_budget": 10}


def _scope(rid: str) -> Any:
    rec = RequestRecord(request_id=rid, received_at=0.0, endpoint="chat", model_requested="m")
    return SimpleNamespace(record=rec, deadline_at=1e12, model="m", models_tried=[])


def _admit(svc: ClusterService, rid: str, key_id: str | None = None) -> dict[str, Any]:
    return svc.ctl.admit(_scope(rid), EV, {"key_id": key_id} if key_id else None)


def _end(svc: ClusterService, rid: str) -> None:
    svc.ctl.release(RequestRecord(request_id=rid, received_at=0.0, endpoint="chat", model_requested="m",
                                  status="ok"))


def _ctl(svc: ClusterService) -> SharedAdmission:
    return svc.ctl
