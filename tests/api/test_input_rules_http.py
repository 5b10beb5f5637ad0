"""Input rules over real HTTP against a gateway with emulated nodes: one validator for every time
parameter (400 ``invalid_time``), the ``n`` cap and ``n × max_tokens`` in TPM, ``tools: []``, and
reports that stay bounded whatever model names clients send."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferlb.api.labels import MAX_STORED_CHARS, UNKNOWN_MODEL, clean_text
from inferlb.config.admission import AdmissionSettings
from inferlb.simulator.emulator import SimFleet
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

ADMIN = "admin-" + "y" * 32
AUTH = {"authorization": f"Bearer {ADMIN}"}
MSG = [{"role": "user", "content": "hello"}]


@contextlib.asynccontextmanager
async def gateway(tmp: Path, *, auth: bool = False, **over: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    async with SimFleet(fast_specs(2)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        settings = settings_for(tmp, fleet_for(urls), admission=AdmissionSettings(auth=auth, admin_key=ADMIN,
                                                                                  redis_url=None), **over)
        async with running_gateway(settings) as (base, app), \
                httpx.AsyncClient(base_url=base, timeout=10, headers=AUTH) as http:
            yield app, http


def _err(r: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = r.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    return body


# -- item 7: one time validator ----------------------------------------------------------------

TIME_ROUTES = ["/admin/fleet/events", "/audit/requests", "/reports/sla", "/reports/cost"]
BAD_TIMES = ["1e13", "nan", "NaN", "inf", "-inf", "-1", "1e400", "253402300800", "tomorrow", "9999999999999w"]


async def test_every_time_parameter_is_checked_by_one_validator(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (_app, http):
        for route in TIME_ROUTES:
            for good in ("0", "1h", "2026-01-01T00:00:00Z", "1767225600.5"):
                r = await http.get(route, params={"since": good})
                assert r.status_code == 200, (route, good, r.text)
            params = ["since"] if route == "/admin/fleet/events" else ["since", "until"]
            for param in params:
                for bad in BAD_TIMES:
                    r = await http.get(route, params={param: bad})
                    assert r.status_code == 400, (route, param, bad, r.status_code, r.text)
                    err = _err(r)
                    assert (err["code"], err["param"]) == ("invalid_time", param), (route, bad, err)


async def test_a_key_expiry_past_what_a_time_can_hold_is_invalid_time(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (_app, http):
        for seconds in (1e300, 1e13):
            r = await http.post("/admin/keys", json={"tenant": "t", "expires_in_s": seconds})
            assert r.status_code == 400, r.text
            assert (_err(r)["code"], _err(r)["param"]) == ("invalid_time", "expires_in_s")
        r = await http.post("/admin/keys", json={"tenant": "t", "expires_in_s": 3600})
        assert r.status_code == 201, r.text


# -- item 8: n, n × max_tokens, tools ----------------------------------------------------------

async def test_n_over_the_cap_and_empty_tools_are_400(tmp_path: Path) -> None:
    async with gateway(tmp_path) as (_app, http):
        for path, body in (("/v1/chat/completions", {"messages": MSG}), ("/v1/completions", {"prompt": "hi"})):
            r = await http.post(path, json={"model": "m", **body, "max_tokens": 2, "n": 9})
            assert r.status_code == 400 and _err(r)["param"] == "n", r.text
            r = await http.post(path, json={"model": "m", **body, "max_tokens": 2, "n": 8})
            assert r.status_code == 200, r.text
        r = await http.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "tools": []})
        assert r.status_code == 400 and (_err(r)["param"], _err(r)["code"]) == ("tools", "empty_array"), r.text


async def test_the_n_cap_is_a_setting(tmp_path: Path) -> None:
    async with gateway(tmp_path, max_n=2) as (_app, http):
        r = await http.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 2, "n": 3})
        assert r.status_code == 400 and "at most 2" in _err(r)["message"], r.text


async def test_tpm_counts_n_times_max_tokens(tmp_path: Path) -> None:
    async with gateway(tmp_path, auth=True) as (_app, http):
        keys = []
        for _ in range(2):
            r = await http.post("/admin/keys", json={"tenant": "acme", "tpm": 30})
            assert r.status_code == 201, r.text
            keys.append({"authorization": f"Bearer {r.json()['key']}"})
        body = {"model": "m", "messages": MSG, "max_tokens": 10}
        # Each key's first request uses 12 of its 30 tokens a minute (2 prompt + 10 output; the
        # bucket refills at 0.5 token/s, so the margins below hold for over 20 s between requests).
        for key in keys:
            r = await http.post("/v1/chat/completions", json=body, headers=key)
            assert r.status_code == 200 and r.json()["usage"]["total_tokens"] == 12, r.text
        # One more choice of 10 still fits what is left; three choices of 10 do not.
        one = await http.post("/v1/chat/completions", json={**body, "n": 1}, headers=keys[0])
        assert one.status_code == 200, one.text
        three = await http.post("/v1/chat/completions", json={**body, "n": 3}, headers=keys[1])
        assert three.status_code == 429, three.text
        assert _err(three)["code"] == "rate_limit_exceeded" and "tokens per minute" in _err(three)["message"]


# -- item 9: bounded reports -------------------------------------------------------------------

def _garbage(rng: random.Random) -> str:
    alphabet = "abcXYZ-_./:019 \t\n\r\x00\x01\x1b\x7f\u0085\u200e\u202e\ufeffé漢😀"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 300)))


async def test_garbage_model_names_leave_the_sla_report_bounded(tmp_path: Path) -> None:
    rng = random.Random(13)
    names = [_garbage(rng) for _ in range(40)] + [f"no-such-model-{i}" for i in range(20)]
    async with gateway(tmp_path) as (app, http):
        ok = await http.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 2})
        assert ok.status_code == 200
        ids = []
        for name in names:
            for path, body in (("/v1/chat/completions", {"messages": MSG}), ("/v1/embeddings", {"input": "x"})):
                r = await http.post(path, json={"model": name, **body, "max_tokens": 2} if "messages" in body
                                    else {"model": name, **body})
                assert r.status_code in (400, 404), (name, r.status_code, r.text)
                ids.append(r.headers["x-request-id"])
        r = await http.post("/v1/predict/" + "zz%01" * 50, json={"inputs": []})
        assert r.status_code == 404, r.text
        await app.state.store.writer.flush_once(force=True)
        rows = (await http.get("/reports/sla", params={"group_by": "model"})).json()["data"]
        models = {row["model"] for row in rows}
        assert models == {"m", UNKNOWN_MODEL}, models
        assert sum(row["count"] for row in rows if row["model"] == UNKNOWN_MODEL) == 2 * len(names) + 1
        rec = (await http.get(f"/audit/requests/{ids[0]}")).json()
        assert rec["model_requested"] == UNKNOWN_MODEL and rec["status"] == "rejected_invalid"
        sent = rec["tags"]["model_sent"]
        assert sent == clean_text(names[0]) and len(sent) <= MAX_STORED_CHARS
        assert not any(ord(c) < 32 or 0x7F <= ord(c) <= 0x9F for c in sent)
        listed = (await http.get("/audit/requests", params={"model": UNKNOWN_MODEL, "limit": "1000"})).json()["data"]
        assert len(listed) == 2 * len(names) + 1


@pytest.mark.parametrize(("text", "want"), [
    ("plain", "plain"),
    ("a\x00b\x1bc\u202ed\ufeff", "abcd"),
    ("x" * 500, "x" * (MAX_STORED_CHARS - 1) + "…"),
    ("\ud800z", "z"),
])
def test_clean_text(text: str, want: str) -> None:
    assert clean_text(text) == want
