"""``GET /reports/capacity`` (scaling advice) and ``GET /admin/autoscale`` (the autoscaler's state).

Thin adapters: the report is :func:`inferlb.autoscale.report.capacity_report` over the app's
store and fleet config; ``since`` / ``until`` as the other reports (default: the last 7 days),
``bucket`` the window size of the "add" advice (default ``1h``). Bad parameters answer the
OpenAI error envelope (400), never a 500. ``/admin/autoscale`` gives the runner's status and its
forecast / actual / capacity series (what the dashboard panel draws); 404 when autoscaling is off.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from inferlb.api.deps import AutoscalerDep, GatewayDep, StoreDep
from inferlb.autoscale.report import capacity_report
from inferlb.errors import ClientError
from inferlb.store.report_params import parse_time

__all__ = ["AutoscaleOff", "router"]

router = APIRouter()


class AutoscaleOff(ClientError):
    """404: this gateway runs no autoscaler (no ``autoscale:`` in the fleet file)."""

    status = 404

    def __init__(self) -> None:
        super().__init__("autoscaling is off: the fleet file has no (enabled) autoscale: section",
                         code="autoscale_off")


@router.get("/reports/capacity")
def report_capacity(store: StoreDep, gateway: GatewayDep, since: str | None = None, until: str | None = None,
                    bucket: str | None = None) -> dict[str, Any]:
    """Per model and GPU type: utilisation, SLO, cost per million tokens; advice in words."""
    return capacity_report(store.engine, gateway.rt.fleet.cfg, since=parse_time(since, param="since"),
                           until=parse_time(until, param="until"), bucket=bucket)


@router.get("/admin/autoscale")
async def autoscale_status(runner: AutoscalerDep) -> dict[str, Any]:
    if runner is None:
        raise AutoscaleOff()
    return {**runner.status(), "points": list(runner.points)}
