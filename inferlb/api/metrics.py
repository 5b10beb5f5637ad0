"""``GET /metrics``: the gateway's Prometheus metrics (text format, or OpenMetrics when asked).

Contract: reads the app's observability hub (``ObservabilityDep``, an
:class:`~inferlb.observability.hub.Observability` built by ``create_app``); answers 404 in
the OpenAI envelope when metrics are disabled in the fleet file. The handler is ``async``: the
scrape-time gauges read the fleet's live counters, which only the event loop mutates, so reading
them on the loop gives a consistent snapshot (a scrape costs well under a millisecond per node).
With ``serve --workers N`` the answering worker merges every worker's metrics
(server/worker_metrics.py: counters summed, gauges per ``worker``). Who may read it:
:func:`~inferlb.api.auth.require_metrics_reader` (open while auth is off and no
``INFERLB_METRICS_TOKEN`` is set; else that token or the admin key).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from inferlb.api.auth import require_metrics_reader
from inferlb.api.deps import ObservabilityDep, WorkerMetricsDep
from inferlb.errors import ClientError

__all__ = ["MetricsDisabled", "router"]

router = APIRouter(dependencies=[Depends(require_metrics_reader)])


class MetricsDisabled(ClientError):
    """404: ``observability.metrics.enabled`` is false."""

    status = 404

    def __init__(self) -> None:
        super().__init__("Metrics are disabled (observability.metrics.enabled: false)", code="metrics_disabled")


@router.get("/metrics", include_in_schema=False)
async def metrics(request: Request, obs: ObservabilityDep, workers: WorkerMetricsDep) -> Response:
    if obs is None or obs.metrics is None:
        raise MetricsDisabled()
    if workers is not None:   # serve --workers N: every worker's, summed (server/worker_metrics.py)
        body, content_type = await workers.exposition(request.headers.get("accept"))
    else:
        body, content_type = obs.exposition(request.headers.get("accept"))
    return Response(body, media_type=content_type)
