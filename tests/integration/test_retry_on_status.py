"""``retry.retry_on_status`` in the fleet file decides which upstream statuses are tried on another
node. Real HTTP: simulated nodes answering a fixed status, the gateway on a loopback port."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from inferlb.config.settings import fleet_from_mapping
from inferlb.errors import UpstreamStatusError
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def _attempts(tmp: Path, status: int, retry: dict[str, Any] | None) -> tuple[int, int]:
    """(client status, requests the nodes saw) for one request when every node answers ``status``."""
    async with SimFleet(fast_specs(3, faults=FaultSpec(status=status))) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        raw = fleet_for(urls, profile="round-robin", seed=1).model_dump(mode="json")
        if retry is not None:
            raw["retry"] = {**raw["retry"], **retry}
        async with running_gateway(settings_for(tmp, fleet_from_mapping(raw))) as (base, _app), \
                httpx.AsyncClient(base_url=base, timeout=10) as client:
            r = await client.post("/v1/chat/completions", json=CHAT)
        return r.status_code, sum(node.stats.requests_total for node in sim.nodes.values())


@pytest.mark.parametrize(("status", "retry", "hits"), [
    (500, None, 3),                                   # default: a node's internal error is tried elsewhere
    (501, None, 1),                                   # default: 501 is not worth another node
    (501, {"retry_on_status": [501, 503]}, 3),         # listed: three attempts on three nodes
    (500, {"retry_on_status": [429]}, 1),              # not listed any more: one attempt
    (503, None, 3),                                   # default: 503 is retried
    (503, {"retry_on_status": [429]}, 1),              # not listed any more: one attempt
])
async def test_retry_on_status_decides(tmp_path: Path, status: int, retry: dict[str, Any] | None,
                                       hits: int) -> None:
    code, seen = await _attempts(tmp_path, status, retry)
    assert seen == hits
    assert code >= 500


def test_status_error_retryable_under_the_setting() -> None:
    err = UpstreamStatusError(501)
    assert not err.retryable and err.retryable_under({501})
    assert UpstreamStatusError(500).retryable
    assert UpstreamStatusError(503).retryable and not UpstreamStatusError(503).retryable_under({429})
