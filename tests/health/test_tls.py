"""The prober reaches an https node with the node's ``tls`` block (health/probe.py, config/tls.py):
its CA and client certificate; a node it cannot verify is an ``ok=False`` sample naming the
certificate problem, never an exception. Certificates are made in the test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from inferlb.config.settings import fleet_from_mapping
from inferlb.health.probe import Prober
from inferlb.types import ManualClock
from tests.support import Certs, certs, tls_node


@pytest.fixture
def pem(tmp_path: Path) -> Certs:
    return certs(tmp_path)


def _prober(url: str, tls: dict[str, Any] | None, **health: Any) -> Prober:
    node: dict[str, Any] = {"name": "secure", "url": url, "models": ["m"], "kind": "vllm"}
    if tls is not None:
        node["tls"] = tls
    cfg = fleet_from_mapping({"models": [{"name": "m"}], "nodes": [node], "health": health})
    return Prober(cfg.nodes, cfg.health, ManualClock())


@pytest.mark.parametrize("mtls", [False, True])
async def test_probes_use_the_node_tls(pem: Certs, mtls: bool) -> None:
    block = {"ca_file": str(pem.ca), "cert_file": str(pem.client_cert), "key_file": str(pem.client_key)}
    async with tls_node(pem, mtls=mtls) as (url, seen):
        prober = _prober(url, block, nodes={"secure": {"probe_path": "/v1/models", "metrics": "none"}})
        try:
            samples = await prober.collect()
        finally:
            await prober.close()
    assert [(s.source, s.ok, s.status) for s in samples] == [("probe", True, 200)]
    assert seen == ["/v1/models"]


async def test_a_node_it_cannot_verify_is_a_failed_sample(pem: Certs) -> None:
    async with tls_node(pem) as (url, seen):
        prober = _prober(url, None, nodes={"secure": {"probe_path": "/v1/models", "metrics": "none"}})
        try:
            (sample,) = await prober.collect()
        finally:
            await prober.close()
    assert not sample.ok and "certificate verify failed" in (sample.error or "").lower(), sample.error
    assert seen == []
