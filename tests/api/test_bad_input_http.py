"""Bad input over real HTTP: every rejection is a 4xx in the OpenAI envelope, never a 500, and
leaves an audit row (``rejected_invalid``). The body-level rows V-01..V-31 are unit-tested in
test_validation*.py; this file proves the HTTP layer keeps the same promises end to end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio

from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

pytestmark = pytest.mark.asyncio(loop_scope="module")

OK_MSG = [{"role": "user", "content": "hi"}]

CASES: list[tuple[str, str, bytes | dict[str, Any], dict[str, str], int]] = [
    ("non_json", "/v1/chat/completions", b"{not json", {}, 400),
    ("array_top", "/v1/chat/completions", b"[1,2]", {}, 400),
    ("empty_body", "/v1/chat/completions", b"", {}, 400),
    ("nan", "/v1/chat/completions", b'{"model":"m","messages":[],"temperature":NaN}', {}, 400),
    ("deep", "/v1/chat/completions", b'{"model":"m","x":' + b"[" * 5000 + b"]" * 5000 + b"}", {}, 400),
    ("missing_model", "/v1/chat/completions", {"messages": OK_MSG}, {}, 400),
    ("unknown_model", "/v1/chat/completions", {"model": "nope", "messages": OK_MSG}, {}, 404),
    ("bad_messages", "/v1/chat/completions", {"model": "m", "messages": "hi"}, {}, 400),
    ("max_tokens_zero", "/v1/chat/completions", {"model": "m", "messages": OK_MSG, "max_tokens": 0}, {}, 400),
    ("max_tokens_over_model", "/v1/chat/completions", {"model": "m", "messages": OK_MSG, "max_tokens": 5000}, {}, 400),
    ("stream_str", "/v1/chat/completions", {"model": "m", "messages": OK_MSG, "stream": "true"}, {}, 400),
    ("api_base", "/v1/chat/completions", {"model": "m", "messages": OK_MSG, "api_base": "http://169.254.169.254"},
     {}, 400),
    ("nested_base_url", "/v1/predict/m", {"inputs": [], "cfg": {"base_url": "http://evil"}}, {}, 400),
    ("embed_on_llm", "/v1/embeddings", {"model": "m", "input": "x"}, {}, 400),
    ("bad_deadline", "/v1/chat/completions", {"model": "m", "messages": OK_MSG}, {"x-inferlb-deadline-ms": "soon"},
     400),
    ("too_large", "/v1/chat/completions", b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * 70_000
     + b'"}]}', {}, 413),
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gw(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    tmp = tmp_path_factory.mktemp("badinput")
    async with SimFleet(fast_specs(2)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        settings = settings_for(tmp, fleet_for(urls), max_body_bytes=65_536)
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base) as client:
            app.state.test_sim = sim
            yield client, app


@pytest.mark.parametrize(("name", "path", "body", "headers", "status"), CASES, ids=[c[0] for c in CASES])
async def test_rejected_in_envelope(gw: tuple[httpx.AsyncClient, Any], name: str, path: str,
                                    body: bytes | dict[str, Any], headers: dict[str, str], status: int) -> None:
    client, app = gw
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = await client.post(path, content=content, headers={"content-type": "application/json", **headers})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] in ("invalid_request_error",)
    assert "Traceback" not in r.text and "x" * 100 not in r.text


async def test_rejections_are_audited(gw: tuple[httpx.AsyncClient, Any]) -> None:
    client, app = gw
    r = await client.post("/v1/chat/completions", content=b"{bad", headers={"content-type": "application/json"})
    assert r.status_code == 400
    await app.state.store.writer.flush_once(force=True)
    rows = (await client.get("/audit/requests", params={"status": "rejected_invalid"})).json()["data"]
    assert rows, "a rejected request left no audit row"


async def test_unknown_path_and_wrong_method(gw: tuple[httpx.AsyncClient, Any]) -> None:
    client, _ = gw
    r = await client.get("/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    r = await client.post("/v1/nothing", json={})
    assert r.status_code == 404 and "error" in r.json()


async def test_client_authorization_never_reaches_the_node(gw: tuple[httpx.AsyncClient, Any]) -> None:
    client, app = gw
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": OK_MSG, "max_tokens": 2},
                          headers={"authorization": "Bearer sk-client-secret"})
    assert r.status_code == 200
    # S-04: the gateway builds node headers itself; the node saw no client credentials
    seen = [n.stats.last_headers for n in app.state.test_sim.nodes.values() if n.stats.last_headers]
    assert seen
    assert all("authorization" not in {k.lower() for k in h} for h in seen)
    assert all("sk-client-secret" not in json.dumps(h) for h in seen)


async def test_seeded_fuzz_never_500(gw: tuple[httpx.AsyncClient, Any]) -> None:
    import random

    client, _ = gw
    rng = random.Random(1234)
    atoms: list[Any] = [None, True, 0, -1, 1.5, "", "m", "x" * 300, [], {}, [{"role": "user"}], {"a": [1]}]
    keys = ["model", "messages", "max_tokens", "stream", "stream_options", "n", "temperature", "tools",
            "tool_choice", "stop", "logit_bias", "response_format", "prompt", "input"]
    for _ in range(300):   # bounded
        body = {k: rng.choice(atoms) for k in rng.sample(keys, rng.randint(0, 6))}
        if rng.random() < 0.5:
            body["model"] = "m"
            body.setdefault("messages", OK_MSG)
        path = rng.choice(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
        r = await client.post(path, json=body)
        assert r.status_code < 500, (path, body, r.text)
