"""Nothing secret is ever written down (docs/security.md): a gateway with auth on, an admin key, a
metrics token and node keys runs a catalog of operations that carry known canary secrets (a tenant
key made through the admin API and used, wrong tenant, admin and metrics keys, node URLs with a
password refused, node keys from the fleet file and from the environment sent upstream, a failing
node, a reload that changes a node key, one refused for a password in a URL and one for a YAML
error on a key's line); then every log
record (every logger at DEBUG, uvicorn's access log included), every row of every database table,
the admin and audit API answers, the node events, ``/metrics`` and every file the gateway wrote
(journal, WAL, the database file) are searched for each canary: none may appear.

Real HTTP: emulated nodes and the gateway on loopback ports, a SQLite file database, the fleet file
on disk (``POST /admin/reload`` re-reads it)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import inspect, text

from inferlb.config.admission import AdmissionSettings
from inferlb.config.settings import Settings
from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import FaultSpec
from inferlb.store.db import make_engine
from inferlb.store.schema import Base
from tests.support import fast_specs, free_port, running_gateway

ADMIN = "sk-admin-CANARY-7f3a9c01e2"
WRONG_ADMIN = "sk-admin-CANARY-wrong-55d1b7"
WRONG_TENANT = "sk-gw-CANARY-wrong-tenant-0c4e2b9d"
METRICS = "metrics-CANARY-token-a81f"
WRONG_METRICS = "metrics-CANARY-wrong-3b20"
URL_PASSWORD = "CANARYPW-url-9e0d"
RELOAD_URL_PASSWORD = "CANARYPW-reload-44af"
FILE_KEY = "sk-node-CANARY-file-61c7"          # n0's api_key in the fleet file
FAILING_KEY = "sk-node-CANARY-failing-d2e8"    # n1's, a node that answers 500
RELOADED_KEY = "sk-node-CANARY-reloaded-19b3"  # n0's after the reload
ENV_KEY = "sk-node-CANARY-env-8a5f"            # n2's, added live through api_key_env
LITERAL_KEY = "sk-node-CANARY-literal-c6d4"    # a literal key sent to the admin API (refused)
VAR = "INFERLB_TEST_NO_SECRETS_NODE_KEY"
MSG = [{"role": "user", "content": "hello"}]


def _doc(urls: dict[str, str], n0_key: str, n1_url: str | None = None) -> dict[str, Any]:
    return {
        "models": [{"name": "m", "max_output_tokens": 1024, "default_max_tokens": 4},
                   {"name": "emb", "kind": "embedding"}],
        "nodes": [{"name": "n0", "url": urls["n0"], "models": ["m", "emb"], "api_key": n0_key},
                  {"name": "n1", "url": n1_url or urls["n1"], "models": ["m", "emb"], "api_key": FAILING_KEY}],
        "routing": {"profile": "round-robin", "seed": 1},
        "timeouts": {"connect_s": 1.0, "first_token_s": 2.0, "idle_s": 2.0, "total_s": 10.0},
    }


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _sent_key(headers: dict[str, str]) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == "authorization"), None)


def _record_text(rec: logging.LogRecord) -> str:
    """Everything a handler could write of ``rec``: the formatted message, the raw arguments, the
    extras (every attribute) and the formatted exception and stack."""
    parts = [rec.getMessage(), repr(rec.args), repr(vars(rec))]
    if rec.exc_info:
        parts.append(logging.Formatter().formatException(rec.exc_info))
    if rec.stack_info:
        parts.append(rec.stack_info)
    return "\n".join(parts)


def _files(root: Path, when: str, *, skip: Path) -> dict[str, str]:
    """Every file under ``root`` but ``skip`` (the operator's fleet file, which holds its keys by
    design): the database, its journal, the audit WAL segments and spool."""
    return {f"file {f.relative_to(root)} ({when})": f.read_bytes().decode("utf-8", "replace")
            for f in sorted(root.rglob("*")) if f.is_file() and f != skip}


def _tables(url: str) -> dict[str, str]:
    """Every row of every table of the database at ``url`` (the schema's and any other), as text."""
    eng = make_engine(url)
    try:
        names = set(inspect(eng).get_table_names())
        assert {t.name for t in Base.metadata.sorted_tables} <= names, names
        out = {}
        with eng.connect() as conn:
            for name in sorted(names):
                out[name] = repr(conn.execute(text(f'SELECT * FROM "{name}"')).all())
        return out
    finally:
        eng.dispose()


async def test_no_secret_reaches_a_log_a_table_an_event_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(VAR, ENV_KEY)
    caplog.set_level(logging.DEBUG)
    seen: dict[str, str] = {}   # where → what was shown there

    async with SimFleet(fast_specs(3)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        fleet_file = tmp_path / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump(_doc(urls, FILE_KEY)))
        db_url = f"sqlite:///{tmp_path / 'audit.db'}"
        settings = Settings(config=fleet_file, database_url=db_url, journal_dir=tmp_path / "journal",
                            audit_flush_interval_s=0.01, metrics_token=METRICS,
                            admission=AdmissionSettings(auth=True, admin_key=ADMIN, redis_url=None))
        await sim.nodes["n1"].set_faults(FaultSpec(status=500))
        async with running_gateway(settings, log_level="debug", access_log=True) as (base, app), \
                httpx.AsyncClient(base_url=base, timeout=30) as http:
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):   # they do not propagate
                logging.getLogger(name).addHandler(caplog.handler)
            try:
                # -- the admin key, right and wrong; a tenant key made through the admin API
                r = await http.post("/admin/keys", json={"tenant": "acme", "name": "ci"}, headers=_bearer(WRONG_ADMIN))
                assert r.status_code == 401, r.text
                r = await http.post("/admin/keys", json={"tenant": "acme", "name": "ci"}, headers=_bearer(ADMIN))
                assert r.status_code == 201, r.text
                tenant_key = r.json()["key"]
                assert (await http.get("/admin/fleet", headers=_bearer(tenant_key))).status_code == 403

                # -- OpenAI requests: the right key (n1 fails each time it is picked: retried), a wrong key
                async def traffic(key: str, rounds: int = 2) -> list[int]:
                    codes = []
                    for _ in range(rounds):
                        for path, body in [
                            ("/v1/chat/completions", {"model": "m", "messages": MSG, "max_tokens": 2}),
                            ("/v1/chat/completions", {"model": "m", "messages": MSG, "max_tokens": 2, "stream": True}),
                            ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2}),
                            ("/v1/responses", {"model": "m", "input": "hi", "max_output_tokens": 2}),
                            ("/v1/embeddings", {"model": "emb", "input": ["x"]}),
                        ]:
                            codes.append((await http.post(path, json=body, headers=_bearer(key))).status_code)
                    return codes

                assert set(await traffic(tenant_key)) == {200}
                assert not [n for n in sim.nodes.values() if tenant_key in repr(n.stats.last_headers)]   # never sent on
                assert set(await traffic(WRONG_TENANT, rounds=1)) == {401}
                assert sim.nodes["n1"].stats.requests_total > 0          # the failing node was tried
                assert _sent_key(sim.nodes["n0"].stats.last_headers) == f"Bearer {FILE_KEY}"
                assert _sent_key(sim.nodes["n1"].stats.last_headers) == f"Bearer {FAILING_KEY}"

                # -- node URLs carrying a password, a literal key: refused, nothing echoed
                n2 = {"name": "n2", "url": urls["n2"], "models": ["m", "emb"]}
                host = urls["n2"].removeprefix("http://")
                for method, path, body in [
                    ("post", "/admin/nodes", {**n2, "url": f"http://user:{URL_PASSWORD}@{host}"}),
                    ("patch", "/admin/nodes/n0", {"url": f"http://user:{URL_PASSWORD}@{host}"}),
                    ("post", "/admin/nodes", {**n2, "api_key": LITERAL_KEY}),
                ]:
                    r = await http.request(method, path, json=body, headers=_bearer(ADMIN))
                    assert r.status_code == 400, r.text
                    seen[f"{method} {path} refused"] = r.text

                # -- a node whose key comes from the environment, added live and used
                r = await http.post("/admin/nodes", json={**n2, "api_key_env": VAR}, headers=_bearer(ADMIN))
                assert r.status_code == 200, r.text
                seen["POST /admin/nodes"] = r.text
                fleet = app.state.gateway.rt.fleet
                for _ in range(5):       # health rounds (probes send the key too), driven instead of timed
                    await app.state.monitor.run_once()
                    if fleet.nodes["n2"].state == "healthy":
                        break
                assert fleet.nodes["n2"].state == "healthy", fleet.nodes["n2"].reason
                assert set(await traffic(tenant_key, rounds=1)) == {200}
                assert _sent_key(sim.nodes["n2"].stats.last_headers) == f"Bearer {ENV_KEY}"

                # -- reloads: one refused (a password in a node URL), one that changes n0's key
                fleet_file.write_text(yaml.safe_dump(_doc(urls, FILE_KEY,
                                                          n1_url=f"http://u:{RELOAD_URL_PASSWORD}@{host}")))
                r = await http.post("/admin/reload", headers=_bearer(ADMIN))
                assert 400 <= r.status_code < 500, r.text
                seen["reload refused"] = r.text
                broken = yaml.safe_dump(_doc(urls, FILE_KEY)).replace(f"api_key: {FILE_KEY}",
                                                                      f"api_key: {FILE_KEY}: oops")
                assert f"{FILE_KEY}: oops" in broken
                fleet_file.write_text(broken)       # not YAML, on the line of a key
                r = await http.post("/admin/reload", headers=_bearer(ADMIN))
                assert 400 <= r.status_code < 500 and "line" in r.text, r.text
                seen["reload refused (YAML)"] = r.text
                fleet_file.write_text(yaml.safe_dump(_doc(urls, RELOADED_KEY)))
                r = await http.post("/admin/reload", headers=_bearer(ADMIN))
                assert r.status_code == 200, r.text
                seen["reload"] = r.text
                assert set(await traffic(tenant_key, rounds=1)) == {200}
                assert _sent_key(sim.nodes["n0"].stats.last_headers) == f"Bearer {RELOADED_KEY}"

                # -- /metrics with the token, a wrong one, the admin key
                assert (await http.get("/metrics", headers=_bearer(WRONG_METRICS))).status_code == 401
                for key in (METRICS, ADMIN):
                    r = await http.get("/metrics", headers=_bearer(key))
                    assert r.status_code == 200, r.text
                    seen[f"/metrics ({key[:7]})"] = r.text

                # -- what the admin plane shows
                await app.state.store.writer.flush_once(force=True)
                for path in ("/admin/fleet", "/admin/keys", "/admin/admission", "/admin/rollouts",
                             "/audit/requests?limit=500"):
                    r = await http.get(path, headers=_bearer(ADMIN))
                    assert r.status_code == 200, (path, r.text)
                    seen[path] = r.text
                events = await http.get("/admin/fleet/events", params={"limit": 500}, headers=_bearer(ADMIN))
                assert events.status_code == 200 and events.json()["events"], events.text
                seen["/admin/fleet/events"] = events.text
                listed = (await http.get("/audit/requests", params={"limit": 500}, headers=_bearer(ADMIN))).json()
                rows = listed.get("data") or listed.get("requests") or []
                assert len(rows) >= 20, listed
                for row in rows:
                    rid = row["request_id"]
                    seen[f"/audit/requests/{rid}"] = (await http.get(f"/audit/requests/{rid}",
                                                                     headers=_bearer(ADMIN))).text
                # The files while the gateway runs: its WAL segments are deleted when it stops.
                seen.update(_files(tmp_path, "running", skip=fleet_file))
                assert any("wal-" in k for k in seen), sorted(seen)   # the WAL was searched
            finally:
                for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
                    logging.getLogger(name).removeHandler(caplog.handler)
    assert any(rec.name == "uvicorn.access" for rec in caplog.records)   # the access log was read too

    seen.update({f"table {name}": rows for name, rows in _tables(db_url).items()})
    for i, rec in enumerate(caplog.records):
        seen[f"log record {i} ({rec.name})"] = _record_text(rec)
    seen.update(_files(tmp_path, "stopped", skip=fleet_file))

    canaries = [ADMIN, WRONG_ADMIN, tenant_key, tenant_key.removeprefix("sk-gw-"), WRONG_TENANT, METRICS,
                WRONG_METRICS, URL_PASSWORD, RELOAD_URL_PASSWORD, FILE_KEY, FAILING_KEY, RELOADED_KEY, ENV_KEY,
                LITERAL_KEY]
    leaks = sorted({(secret, where) for where, shown in seen.items() for secret in canaries if secret in shown})
    assert leaks == [], "\n".join(f"{secret!r} in {where}: {_around(seen[where], secret)}" for secret, where in leaks)


def _around(text_: str, secret: str, width: int = 160) -> str:
    i = text_.find(secret)
    return repr(text_[max(0, i - width):i + len(secret) + width])


async def test_the_redis_password_is_not_written_while_redis_is_away(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``INFERLB_REDIS_URL`` carries a password and nothing listens there: the replica serves on its
    share of the limits and says why (logs, ``/admin/admission``), never with the password."""
    caplog.set_level(logging.DEBUG)
    password = "CANARYPW-redis-0b7e"
    async with SimFleet(fast_specs(2)) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        fleet_file = tmp_path / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump(_doc(urls, FILE_KEY)))
        redis_url = f"redis://:{password}@127.0.0.1:{free_port()}/0"
        settings = Settings(config=fleet_file, database_url=f"sqlite:///{tmp_path / 'audit.db'}",
                            journal_dir=tmp_path / "journal", audit_flush_interval_s=0.01,
                            admission=AdmissionSettings(auth=False, admin_key=ADMIN, redis_url=redis_url))
        async with running_gateway(settings) as (base, _app), httpx.AsyncClient(base_url=base, timeout=30) as http:
            for _ in range(4):
                r = await http.post("/v1/chat/completions", json={"model": "m", "messages": MSG, "max_tokens": 2})
                assert r.status_code == 200, r.text
            shown = [(await http.get(p, headers=_bearer(ADMIN))).text for p in ("/admin/admission", "/admin/fleet")]
    assert "Redis unreachable" in caplog.text   # the outage was logged, with its cause
    texts = [*shown, *(_record_text(rec) for rec in caplog.records), *_tables(settings.database_url).values()]
    assert not [t for t in texts if password in t]
