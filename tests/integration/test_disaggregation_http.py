"""Prefill/decode disaggregation end to end: the real OpenAI SDK → the gateway → an emulated
prefill node (max_tokens 1, kv_transfer_params back) → an emulated decode node (the params in its
body); both legs in the audit record; a failing prefill node retried on another pair before the
first byte to the client."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from inferlb.config.settings import fleet_from_mapping
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec, NodeSpec
from tests.support import running_gateway, settings_for

ROLES = {"p0": "prefill", "p1": "prefill", "d0": "decode", "d1": "decode"}
PROMPT = [{"role": "user", "content": "word " * 200}]


def _fleet(urls: dict[str, str], timeouts: dict[str, float] | None = None, **disagg: Any) -> Any:
    return fleet_from_mapping({
        "models": [{"name": "m", "max_output_tokens": 64, "default_max_tokens": 8,
                    "disaggregation": {"mode": "prefill-decode", "protocol": "vllm-nixl", **disagg}}],
        "nodes": [{"name": n, "url": u, "models": ["m"], "role": ROLES[n]} for n, u in urls.items()],
        "routing": {"profile": "token-aware", "seed": 1},
        "timeouts": {"connect_s": 1.0, "first_token_s": 2.0, "idle_s": 2.0, "total_s": 10.0, **(timeouts or {})},
    })


@contextlib.asynccontextmanager
async def _stack(tmp: Path, faults: dict[str, FaultSpec] | None = None, timeouts: dict[str, float] | None = None,
                 **disagg: Any) -> AsyncIterator[tuple[SimFleet, AsyncOpenAI, httpx.AsyncClient, Any]]:
    specs = [NodeSpec(name=n, models=["m"], base_ttft_s=0.002, tpot_s=0.0005,
                      faults=(faults or {}).get(n, FaultSpec())) for n in ROLES]
    async with SimFleet(specs) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        async with running_gateway(settings_for(tmp, _fleet(urls, timeouts, **disagg))) as (base, app), \
                httpx.AsyncClient(base_url=base, timeout=10) as http:
            sdk = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, http_client=http)
            yield sim, sdk, http, app


async def _audit(http: httpx.AsyncClient, app: Any, rid: str) -> dict[str, Any]:
    await app.state.store.writer.flush_once(force=True)
    r = await http.get(f"/audit/requests/{rid}")
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def _legs(sim: SimFleet) -> dict[str, tuple[int, int]]:
    return {n: (node.stats.prefill_legs, node.stats.decode_legs) for n, node in sim.nodes.items()}


async def test_a_request_runs_prefill_then_decode_streamed_and_not(tmp_path: Path) -> None:
    async with _stack(tmp_path) as (sim, sdk, http, app):
        raw = await sdk.chat.completions.with_raw_response.create(model="m", messages=PROMPT, max_tokens=5)
        chat = raw.parse()
        assert chat.usage is not None and chat.usage.completion_tokens == 5
        streamed = await sdk.chat.completions.with_raw_response.create(model="m", messages=PROMPT, max_tokens=5,
                                                                        stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in streamed.parse() if c.choices])
        assert text
        legs = _legs(sim)
        assert sum(p for p, _ in legs.values()) == 2 and sum(d for _, d in legs.values()) == 2
        assert all(d == 0 for n, (_, d) in legs.items() if ROLES[n] == "prefill")
        assert all(p == 0 for n, (p, _) in legs.items() if ROLES[n] == "decode")
        for r in (raw, streamed):
            rec = await _audit(http, app, r.headers["x-request-id"])
            assert rec["status"] == "ok"
            [pre, dec] = rec["attempts"]
            assert ROLES[pre["node"]] == "prefill" and ROLES[dec["node"]] == "decode"
            assert pre["outcome"] == dec["outcome"] == "ok"
            assert pre["started_at"] <= pre["first_byte_at"] <= pre["ended_at"] <= dec["started_at"]
            assert rec["node"] == dec["node"]
            pd = rec["decision"]["disaggregation"]
            assert pd["mode"] == "disaggregated" and pd["pair"] == {"prefill": pre["node"], "decode": dec["node"]}
            assert set(pd["prefill"]["scores"][pre["node"]]) == {"prefill-load", "queue", "total"}
            assert set(rec["decision"]["scores"][dec["node"]]) == {"decode-load", "kv", "total"}
            [entry] = rec["decisions"]
            assert (entry["prefill_attempt"], entry["attempt"], entry["kv_transfer"]) == (1, 2, "params")


async def test_the_decode_node_gets_the_prefill_nodes_kv_transfer_params(tmp_path: Path) -> None:
    async with _stack(tmp_path) as (sim, sdk, http, app):
        raw = await sdk.chat.completions.with_raw_response.create(model="m", messages=PROMPT, max_tokens=3,
                                                                   extra_body={"min_tokens": 2})
        rec = await _audit(http, app, raw.headers["x-request-id"])
        pre, dec = (a["node"] for a in rec["attempts"])
        assert sim.nodes[pre].stats.last_headers.get("x-inferlb-leg") == "prefill"
        assert sim.nodes[dec].stats.decode_legs == 1


@pytest.mark.parametrize(("fault", "error_class"), [
    (FaultSpec(status=500), "upstream_status"),
    (FaultSpec(hang_before_headers=True), "timeout_first_token"),   # the prefill leg's own first-byte timeout
])
async def test_a_failing_prefill_node_is_retried_on_another_pair(tmp_path: Path, fault: FaultSpec,
                                                                 error_class: str) -> None:
    fast = {"first_token_s": 0.4, "per_output_token_s": 0.0, "first_byte_floor_s": 0.1}
    async with _stack(tmp_path, faults={"p0": fault}, timeouts=fast) as (sim, sdk, http, app):
        for _ in range(30):   # ties between p0 and p1 are broken by the runtime's rng
            raw = await sdk.chat.completions.with_raw_response.create(model="m", messages=PROMPT, max_tokens=3)
            assert raw.parse().choices[0].message.content
            rec = await _audit(http, app, raw.headers["x-request-id"])
            nodes = [(a["node"], a["outcome"]) for a in rec["attempts"]]
            if nodes[0] == ("p0", "retryable"):
                assert rec["attempts"][0]["error_class"] == error_class
                assert nodes[1:] == [("p1", "ok"), (nodes[2][0], "ok")] and ROLES[nodes[2][0]] == "decode"
                assert len(rec["decisions"]) == 2 and rec["decisions"][0]["attempt"] == 1
                assert "p0" not in rec["decisions"][1]["disaggregation"]["prefill"]["candidates"]
                break
        else:
            raise AssertionError("the broken prefill node was never picked")
        assert sim.nodes["p0"].stats.prefill_legs == 0


async def test_no_prefill_node_left_fails_cleanly_or_serves_whole(tmp_path: Path) -> None:
    down = {"p0": FaultSpec(status=503), "p1": FaultSpec(status=503)}
    async with _stack(tmp_path, faults=down, colocated_fallback=False) as (sim, sdk, http, app):
        r = await http.post("/v1/chat/completions", json={"model": "m", "messages": PROMPT, "max_tokens": 3})
        # Both prefill nodes tried (each once), then no pair left: the last failure, in the envelope.
        assert r.status_code == 502, r.text
        assert json.loads(r.text)["error"]["code"] == "upstream_error"
        assert sum(sim.nodes[n].stats.requests_total for n in ("p0", "p1")) == 2
        assert all(d == 0 for _, d in _legs(sim).values())
    (tmp_path / "b").mkdir()
    async with _stack(tmp_path / "b", faults=down) as (sim, sdk, http, app):
        raw = await sdk.chat.completions.with_raw_response.create(model="m", messages=PROMPT, max_tokens=3)
        assert raw.parse().choices[0].message.content
        rec = await _audit(http, app, raw.headers["x-request-id"])
        assert [ROLES[a["node"]] for a in rec["attempts"]] == ["prefill", "prefill", "decode"]
        assert rec["decisions"][-1]["disaggregation"]["mode"] == "colocated"
        assert all(d == 0 for _, d in _legs(sim).values())   # served whole: no KV pulled


async def test_a_reload_turns_disaggregation_on_and_a_bad_one_names_the_key(tmp_path: Path) -> None:
    import yaml

    from inferlb.config.settings import Settings

    specs = [NodeSpec(name=n, models=["m"], base_ttft_s=0.002, tpot_s=0.0005) for n in ("p0", "d0")]
    async with SimFleet(specs) as sim:
        urls = {name: node.url for name, node in sim.nodes.items()}
        doc = _fleet(urls).model_dump(mode="json", exclude_none=True)
        colocated = {**doc, "models": [{k: v for k, v in doc["models"][0].items() if k != "disaggregation"}],
                     "nodes": [{**n, "role": "both"} for n in doc["nodes"]]}
        path = tmp_path / "fleet.yaml"
        path.write_text(yaml.safe_dump(colocated))
        settings = Settings(config=path, database_url=f"sqlite:///{tmp_path / 'audit.db'}",
                            journal_dir=tmp_path / "journal", audit_flush_interval_s=0.01)
        async with running_gateway(settings) as (base, app), httpx.AsyncClient(base_url=base, timeout=10) as http:
            body = {"model": "m", "messages": PROMPT, "max_tokens": 3}
            assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
            assert all(legs == (0, 0) for legs in _legs(sim).values())
            bad = {**doc, "nodes": [{**n, "role": "prefill"} for n in doc["nodes"]]}
            path.write_text(yaml.safe_dump(bad))
            r = await http.post("/admin/reload")
            assert r.status_code == 400 and r.json()["error"]["param"] == "models[0].disaggregation", r.text
            path.write_text(yaml.safe_dump(doc))
            assert (await http.post("/admin/reload")).status_code == 200
            assert (await http.post("/v1/chat/completions", json=body)).status_code == 200
            assert _legs(sim) == {"p0": (1, 0), "d0": (0, 1)}
