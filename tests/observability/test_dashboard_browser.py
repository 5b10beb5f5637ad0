"""``GET /dashboard`` in a real headless Chromium, on SQLite and PostgreSQL.

Debian's ``chromium`` (/usr/bin/chromium) driven by ``playwright-core`` from npm
(``tests/observability/browser``: ``install.sh`` installs it, ``dashboard.mjs`` drives the page).
The gateway serves a seeded audit history, over which its autoscaler (dry-run) has played its
rounds (the app's clock injected); the page must load with no console error, no failed request and
no request to another origin, and every chart must draw data (points reported by the page, inked
canvas pixels), the autoscaling panel's too (forecast / actual / capacity and replicas per model,
the last scaling events), and the versions and rollouts panel's (the weights bar of the versioned
model at a running rollout's first step, the rollouts table: the running one, then one aborted, each
with its last decision; both started through ``POST /admin/rollouts``). With autoscaling off and no
versions, both panels say so. The screenshot goes to
``test-artifacts/dashboard-<backend>.png``; with ``INFERLB_UPDATE_DOCS_SCREENSHOT=1`` it also
replaces ``docs/dashboard.png`` (docs/observability.md shows it).

Skips with the reason when node, the driver or chromium is missing, unless
``INFERLB_REQUIRE_BROWSER=1`` (CI), where it fails.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import httpx
import pytest
from sqlalchemy import text

from inferlb.config.admission import AdmissionSettings
from inferlb.store.db import make_engine, upgrade
from inferlb.types import ManualClock
from tests.observability import seed
from tests.support import ROOT, running_gateway, settings_for

DRIVER = Path(__file__).parent / "browser"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
REQUIRED = os.environ.get("INFERLB_REQUIRE_BROWSER") == "1"
ARTIFACTS = ROOT / "test-artifacts"
CHARTS = ("chart-latency", "chart-ttft", "chart-slo", "chart-nodes", "chart-cost-tenant", "chart-cost-model")
# per seeded model (llama-3-8b, qwen-14b): forecast vs actual vs capacity, replicas per GPU type
AUTOSCALE_CHARTS = {"chart-autoscale-0": 3, "chart-replicas-0": 2, "chart-autoscale-1": 3, "chart-replicas-1": 1}


def _unavailable(reason: str) -> NoReturn:
    if REQUIRED:
        pytest.fail(f"{reason} (INFERLB_REQUIRE_BROWSER=1 requires the browser test)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def node() -> str:
    exe = shutil.which("node")
    if exe is None:
        _unavailable("node is not on PATH: the browser test drives chromium with playwright-core")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    match = re.match(r"v(\d+)\.", version)
    if match is None or int(match.group(1)) < 20:
        _unavailable(f"node {version or '(unknown)'} is too old: playwright-core needs >= 20")
    if not (DRIVER / "node_modules" / "playwright-core").is_dir():
        _unavailable("playwright-core is not installed: run tests/observability/browser/install.sh")
    if not os.access(CHROMIUM, os.X_OK):
        _unavailable(f"no chromium at {CHROMIUM}: apt-get install chromium")
    return exe


async def _drive(node: str, url: str, shot: Path, admin_key: str | None = None) -> dict[str, Any]:
    extra = [admin_key] if admin_key else []
    proc = await asyncio.create_subprocess_exec(node, str(DRIVER / "dashboard.mjs"), url, str(shot), "30000", *extra,
                                                cwd=DRIVER, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 90)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, f"browser driver failed:\n{out.decode()}\n{err.decode()}"
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


async def _rollouts(base: str, app: Any, clock: ManualClock) -> None:
    """Through the admin API: a rollout of llama-3-8b aborted, then one running that has played one
    round of rollout.bpmn (too few requests: it holds at 10 %)."""
    spec = {"model": "llama-3-8b", "from_version": "v2", "to_version": "v3"}
    async with httpx.AsyncClient(base_url=base) as http:
        first = await http.post("/admin/rollouts", json=spec)
        assert first.status_code == 201, first.text
        clock.advance(60)
        aborted = await http.post(f"/admin/rollouts/{first.json()['id']}/abort")
        assert aborted.status_code == 200, aborted.text
        clock.advance(60)
        second = await http.post("/admin/rollouts", json=spec)
        assert second.status_code == 201, second.text
    clock.advance(60)
    await app.state.rollouts.run_once()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_dashboard_renders_seeded_history_in_chromium(node: str, db_url: str, tmp_path: Path) -> None:
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:   # the PostgreSQL schema is shared by the session
            for table in ("scaling_events", "rollout_events", "rollouts"):
                conn.execute(text(f"DELETE FROM {table}"))
        seed.seed(engine)
        seed.settle_partitions(engine)
    finally:
        engine.dispose()
    backend = "sqlite" if db_url.startswith("sqlite") else "postgresql"
    settings = settings_for(tmp_path, seed.fleet(autoscale=True, versions=True), database_url=db_url)
    clock = ManualClock(wall=seed.AUTOSCALE_FROM)
    async with running_gateway(settings, clock=clock) as (base, app):
        await seed.autoscale_rounds(app.state.autoscaler, clock)
        await _rollouts(base, app, clock)
        url = f"{base}/dashboard?since={_iso(seed.START)}&until={_iso(seed.END)}&bucket=5m&refresh=0"
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / f"dashboard-{backend}.png"
        result = await _drive(node, url, shot)

    assert result["status"] == 200
    assert result["consoleErrors"] == [] and result["pageErrors"] == [], result
    assert result["external"] == [], "the dashboard must not load anything from another origin"
    for chart in CHARTS:
        assert result["charts"][chart]["points"] >= 10, (chart, result["charts"])
        assert result["inked"][chart] > 2000, (chart, result["inked"])   # lines were drawn, not an empty frame
    assert result["charts"]["chart-nodes"]["series"] == 8        # (3 nodes + "no node": rejections) x 2
    assert result["charts"]["chart-cost-tenant"]["series"] == 4  # 3 tenants + idle capacity
    assert result["stateSegments"] >= 3                          # one per node at least
    assert result["tables"] >= 2 + 3                              # 2 models + 3 tenants and idle
    tiles = " ".join(result["tiles"])
    assert "REQUESTS 1,440" in tiles.upper(), tiles
    # the autoscaling panel: one point per round in every series, lines drawn, the events listed
    assert result["autoscale"] == {"enabled": True, "models": 2, "events": 11}, result["scalingRows"]
    for chart, series in AUTOSCALE_CHARTS.items():
        assert result["charts"][chart] == {"series": series, "points": series * seed.ROUNDS}, (chart, result["charts"])
        assert result["inked"][chart] > 2000, (chart, result["inked"])
    assert f"rounds {seed.ROUNDS}" in result["autoscaleStatus"] and "actuator dry-run" in result["autoscaleStatus"]
    rows = result["scalingRows"]
    # newest first: the last round's two events (llama-3-8b's h100 pool, sized for the share the
    # router sent it, held; qwen-14b scaled down), then the older ones
    assert len(rows) == 11 and all(r.startswith("2026-01-01 02:00:00") for r in rows[:2]), rows
    assert any(r.startswith("2026-01-01 02:00:00 qwen-14b a100 4 → 3") for r in rows[:2]), rows
    assert not rows[2].startswith("2026-01-01 02:00:00"), rows
    assert all(("dry_run" in r or "held" in r) and "seasonal-naive" in r for r in rows), rows
    assert result["autoscaleOff"] is None
    # the versions panel: llama-3-8b's bar at the running rollout's first step, the rollouts table
    assert result["versions"] == {"enabled": True, "models": 1, "rollouts": 2}, result["rolloutRows"]
    assert result["versionsOff"] is None
    (bar,) = result["versionBars"]
    assert bar["model"] == "llama-3-8b (overridden)" and "v2: weight 90" in bar["title"], bar
    assert [s["text"] for s in bar["segments"]] == ["v2 90.0%", "v3 10.0%"], bar
    v2, v3 = bar["segments"]
    assert v2["color"] != v3["color"] and bar["width"] > 300
    assert v2["width"] == pytest.approx(0.9 * bar["width"], abs=2)
    assert v3["width"] == pytest.approx(0.1 * bar["width"], abs=2)
    running, aborted = result["rolloutRows"]
    assert " llama-3-8b v2 → v3 running 10% (1/3) hold 2026-01-01 02:02:00 – " in running, running
    assert " llama-3-8b v2 → v3 aborted 0% (1/3) abort 2026-01-01 02:00:00 2026-01-01 02:01:00 aborted by an operator" \
        in aborted, aborted
    assert shot.stat().st_size > 20_000
    if os.environ.get("INFERLB_UPDATE_DOCS_SCREENSHOT") == "1" and backend == "sqlite":
        shutil.copyfile(shot, ROOT / "docs" / "dashboard.png")


async def test_dashboard_signs_in_with_the_admin_key_when_auth_is_on(node: str, tmp_path: Path) -> None:
    """Auth on: the page's data calls get 401, it shows its sign-in form, and once the admin key
    is typed in every data call carries it and every chart draws."""
    admin = "admin-" + "d" * 32
    db = f"sqlite:///{tmp_path / 'auth.db'}"
    upgrade(db)
    engine = make_engine(db)
    try:
        seed.seed(engine)
    finally:
        engine.dispose()
    settings = settings_for(tmp_path, seed.fleet(), database_url=db,
                            admission=AdmissionSettings(auth=True, admin_key=admin, redis_url=None))
    async with running_gateway(settings) as (base, _app):
        url = f"{base}/dashboard?since={_iso(seed.START)}&until={_iso(seed.END)}&bucket=5m&refresh=0"
        ARTIFACTS.mkdir(exist_ok=True)
        result = await _drive(node, url, ARTIFACTS / "dashboard-auth.png", admin)

    assert result["status"] == 200 and result["askedForKey"] is True and result["keyStored"] is True, result
    assert result["bearer"] and set(result["bearer"]) == {f"Bearer {admin}"}, result["bearer"]
    # Chromium logs the refused fetch of the first, unauthenticated load: one (the page probes with
    # one call before the rest, since failures are rate-limited per address); nothing else may fail.
    refused = [e for e in result["consoleErrors"] if "status of 401" in e]
    assert len(refused) == 1 and len(result["consoleErrors"]) == 1, result["consoleErrors"]
    assert result["pageErrors"] == [] and result["external"] == []
    for chart in CHARTS:
        assert result["charts"][chart]["points"] >= 10, (chart, result["charts"])
    assert "REQUESTS 1,440" in " ".join(result["tiles"]).upper()
    # no autoscale: section in this fleet: the panel says autoscaling is off, and draws nothing
    assert result["autoscale"] == {"enabled": False, "models": 0, "events": 0}
    assert result["autoscaleOff"] and result["autoscaleOff"].startswith("autoscaling is off"), result["autoscaleOff"]
    assert not any(k.startswith(("chart-autoscale", "chart-replicas")) for k in result["charts"])
    # no model has versions: the versions panel says so, with no bar and no table
    assert result["versions"] == {"enabled": False, "models": 0, "rollouts": 0}
    assert result["versionsOff"] and result["versionsOff"].startswith("no model has versions"), result["versionsOff"]
    assert result["versionBars"] == [] and result["rolloutRows"] == []
