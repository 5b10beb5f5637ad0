"""``/openapi.json`` describes the OpenAI routes' bodies and the errors the gateway really sends,
and schemathesis, run over real HTTP against a gateway with emulated nodes, finds no server error.

The fuzz run is bounded (a fixed seed, at most ``MAX_EXAMPLES`` generated cases per operation in
the fuzzing phase plus schemathesis' explicit-example and boundary-value ("coverage") cases,
positive and negative, one worker) and checks only ``not_a_server_error`` (less the 504
``deadline_exceeded`` a request with ``x-inferlb-deadline-ms`` gets when its own deadline passes:
``schemathesis_hooks.py``): client input never produces a 5xx. The emulated model's output cap
is small so that generated ``max_tokens`` values cost little. The admin key is sent so that the
admin routes are fuzzed too; the hooks in ``schemathesis_hooks.py`` let half the cases name a
served model.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferlb.api.schema import REQUEST_BODIES
from inferlb.config.admission import AdmissionSettings
from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, running_gateway, settings_for

MAX_EXAMPLES = 15
SEED = 13
ADMIN = "admin-" + "f" * 32
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")


@contextlib.asynccontextmanager
async def gateway(tmp: Path, **over: Any) -> AsyncIterator[tuple[str, Any]]:
    async with SimFleet(fast_specs(2)) as sim:
        fleet = fleet_from_mapping({
            "models": [{"name": "m", "max_output_tokens": 16, "default_max_tokens": 4},
                       {"name": "emb", "kind": "embedding"}],
            "nodes": [{"name": n, "url": node.url, "models": ["m", "emb"]} for n, node in sim.nodes.items()],
            "routing": {"profile": "round-robin", "seed": 1},
            "timeouts": {"connect_s": 1.0, "first_token_s": 2.0, "idle_s": 2.0, "total_s": 10.0},
        })
        settings = settings_for(tmp, fleet, admission=AdmissionSettings(auth=False, admin_key=ADMIN, redis_url=None),
                                **over)
        async with running_gateway(settings) as (base, app):
            yield base, app


async def test_openapi_documents_bodies_and_the_400_envelope(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (base, _app), httpx.AsyncClient(base_url=base) as http:
        doc = (await http.get("/openapi.json")).json()
    paths = doc["paths"]
    for path, schema in REQUEST_BODIES.items():
        body = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == schema and paths[path]["post"]["requestBody"]["required"] is True, path
    assert paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"][
        "properties"]["tools"]["minItems"] == 1
    assert "text/event-stream" in paths["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    resp = paths["/v1/responses"]["post"]      # the Responses API: its body, its stream, the deadline's 504
    body = resp["requestBody"]["content"]["application/json"]["schema"]
    assert body["required"] == ["model", "input"] and {"max_output_tokens", "stream"} <= set(body["properties"])
    assert "text/event-stream" in resp["responses"]["200"]["content"] and "504" in resp["responses"]
    assert any(p["name"] == "x-inferlb-deadline-ms" for p in resp["parameters"])
    envelope = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, ops in paths.items():
        for method, op in ops.items():
            assert "422" not in op["responses"], (method, path)
            assert op["responses"]["400"]["content"]["application/json"]["schema"] == envelope, (method, path)
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert set(schemas["ErrorBody"]["required"]) == {"message", "type", "param", "code"}


async def test_the_documented_n_cap_is_the_setting(tmp_path: Path) -> None:
    async with gateway(tmp_path, max_n=3) as (base, _app), httpx.AsyncClient(base_url=base) as http:
        doc = (await http.get("/openapi.json")).json()
    for path in ("/v1/chat/completions", "/v1/completions"):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body["properties"]["n"]["maximum"] == 3, path


async def test_a_framework_validation_error_is_the_documented_400(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (base, _app), httpx.AsyncClient(base_url=base) as http:
        r = await http.get("/admin/fleet/events", params={"limit": "0"}, headers={"authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = await http.post("/admin/keys", json={"tenant": ""}, headers={"authorization": f"Bearer {ADMIN}"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tenant", r.text


def _st() -> list[str]:
    exe = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    if exe is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[test]')")
    return [exe]


async def test_schemathesis_finds_no_server_error(tmp_path: Path) -> None:
    st = _st()
    async with gateway(tmp_path) as (base, _app):
        proc = await asyncio.create_subprocess_exec(
            *st, "run", f"{base}/openapi.json", "--checks", "not_a_server_error_but_the_clients_deadline",
            "--mode", "all",
            "--phases", "examples,coverage,fuzzing", "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
            "--workers", "1", "--request-timeout", "20", "--no-color", "--suppress-health-check", "all",
            "--report", "junit", "--report-dir", str(tmp_path / "report"),
            "--header", f"Authorization: Bearer {ADMIN}",   # reaches the admin-key routes too
            env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)},
            cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 300)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    junit = ET.fromstring(next((tmp_path / "report").glob("*.xml")).read_text())
    tested = {tc.get("name") for tc in junit.iter("testcase")}
    assert {f"POST {path}" for path in REQUEST_BODIES} <= tested, tested
    assert "GET /admin/fleet/events" in tested and "GET /reports/sla" in tested
    assert int(junit.get("tests") or sum(int(s.get("tests") or 0) for s in junit.iter("testsuite"))) >= 20
