"""The demo banner says whether authentication is on (it used to say OFF whatever the settings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inferlb.cli.demo import demo_banner, demo_fleet
from inferlb.config.admission import AdmissionSettings
from inferlb.config.settings import Settings, fleet_from_mapping

URLS = ["http://127.0.0.1:9001"]


def _settings(tmp: Path, **over: Any) -> Settings:
    base: dict[str, Any] = {"fleet": demo_fleet({"sim-a": URLS[0]}), "database_url": f"sqlite:///{tmp / 'a.db'}"}
    base.update(over)
    return Settings(**base)


def test_banner_says_off_by_default(tmp_path: Path) -> None:
    text = demo_banner(_settings(tmp_path), URLS)
    assert "Authentication is OFF" in text and "Authentication is ON" not in text


def test_banner_says_on_when_the_env_turns_auth_on(tmp_path: Path) -> None:
    text = demo_banner(_settings(tmp_path, admission=AdmissionSettings(auth=True, redis_url=None)), URLS)
    assert "Authentication is ON" in text and "OFF" not in text


def test_banner_says_on_when_the_fleet_file_turns_auth_on(tmp_path: Path) -> None:
    fleet = fleet_from_mapping({"models": [{"name": "m"}], "nodes": [{"name": "a", "url": URLS[0], "models": ["m"]}],
                                "admission": {"auth": True}})
    assert "Authentication is ON" in demo_banner(_settings(tmp_path, fleet=fleet), URLS)


async def test_the_demo_ships_two_versions_and_a_rollout_starts_at_once(tmp_path: Path) -> None:
    """``inferlb demo``'s fleet over its simulated nodes: both versions answer (v2 under the name
    the nodes know it by) and ``POST /admin/rollouts`` from v1 to v2 is accepted as is."""
    import httpx
    from openai import AsyncOpenAI

    from inferlb.simulator.emulator import SimFleet
    from inferlb.simulator.spec import demo_specs
    from tests.support import running_gateway, settings_for

    async with SimFleet(demo_specs()) as sim:
        fleet = demo_fleet({n: node.url for n, node in sim.nodes.items()})
        async with running_gateway(settings_for(tmp_path, fleet)) as (base, _app), \
                httpx.AsyncClient(base_url=base, timeout=10) as http:
            client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            msg = [{"role": "user", "content": "hi"}]
            v1 = await client.chat.completions.create(model="demo-llm", messages=msg, max_tokens=2)
            v2 = await client.chat.completions.create(model="demo-llm", messages=msg, max_tokens=2,
                                                      extra_headers={"x-inferlb-model-version": "v2"})
            assert (v1.model, v2.model) == ("demo-llm", "demo-llm-v2")
            await client.close()
            r = await http.post("/admin/rollouts", json={"model": "demo-llm", "from_version": "v1", "to_version": "v2"})
            assert r.status_code == 201, r.text
            assert r.json()["percent"] == 10.0 and r.json()["next_percent"] == 50.0


def test_banner_sends_the_admin_commands_to_the_loopback_admin_listener(tmp_path: Path) -> None:
    """No admin key: the admin routes are on 127.0.0.1, the gateway's port + 1, without a key (the
    gateway's port answers them 404); with one, the commands send it and the key is not printed."""
    text = demo_banner(_settings(tmp_path, host="0.0.0.0", port=9000), URLS)
    assert "admin routes: http://127.0.0.1:9001 (loopback only, no key" in text
    assert "curl -s 'http://127.0.0.1:9001/reports/sla?group_by=node'" in text
    assert "inferlb rollout start --url http://127.0.0.1:9001 " in text
    assert "http://0.0.0.0:9000/v1/chat/completions" in text
    secret = "admin-" + "b" * 32
    keyed = demo_banner(_settings(tmp_path, admission=AdmissionSettings(admin_key=secret, redis_url=None)), URLS)
    assert "curl -s -H \"authorization: Bearer $INFERLB_ADMIN_KEY\" 'http://127.0.0.1:8081/audit/requests" in keyed
    assert secret not in keyed


def _snippet(banner: str) -> str:
    """The banner's ``python - <<'PY' … PY`` lines, as a user pastes them into a shell."""
    lines = banner.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("python - <<'PY'"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i] == "PY")
    return "\n".join(lines[start:end + 1]) + "\n"


async def test_the_printed_sdk_snippet_pastes_and_runs_as_printed(tmp_path: Path) -> None:
    """The snippet the banner prints, run by bash against a running demo fleet: it streams an answer
    (it used to be indented inside its heredoc, so Python refused it and the heredoc never ended)."""
    import asyncio
    import os
    import sys

    from inferlb.simulator.emulator import SimFleet
    from inferlb.simulator.spec import demo_specs
    from tests.support import running_gateway, settings_for

    async with SimFleet(demo_specs()) as sim:
        fleet = demo_fleet({n: node.url for n, node in sim.nodes.items()})
        async with running_gateway(settings_for(tmp_path, fleet), public=True) as (base, _app):
            host, port = base.removeprefix("http://").split(":")
            banner = demo_banner(_settings(tmp_path, host=host, port=int(port)), URLS)
            assert "pip install openai" in banner
            bindir = tmp_path / "bin"
            bindir.mkdir()
            # the snippet says `python`: this interpreter (a wrapper, so a venv keeps its packages)
            (bindir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
            (bindir / "python").chmod(0o755)
            proc = await asyncio.create_subprocess_exec(
                "bash", "-e", "-c", _snippet(banner), env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"},
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 60)   # a hang guard, not a timing
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip(), "the snippet printed no answer"
