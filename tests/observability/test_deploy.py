"""deploy/: the Grafana dashboard and the Prometheus examples use only metric names the gateway
exposes, and the dashboard is import-ready JSON. When ``promtool`` is installed, the scrape config,
the alert rules and every dashboard query are checked by it too."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferlb.fleet.state import Fleet
from inferlb.observability.hub import Observability
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.types import ManualClock
from tests.support import ROOT, fleet_for

DEPLOY = ROOT / "deploy"
_NAME = re.compile(r"\binferlb_[a-z_]+")


def _exposed() -> set[str]:
    """Every sample name the gateway's registry produces (with one request observed)."""
    cfg = fleet_for({"n0": "http://127.0.0.1:1"})
    obs = Observability(cfg, clock=ManualClock())
    obs.bind(Fleet(cfg, ManualClock()), backlog=lambda: {"pending": 0}, ready=lambda: True)
    assert obs.metrics is not None
    obs.metrics.observe(RequestRecord(request_id="x", received_at=1.0, endpoint="chat", model_requested="m",
                                      status="ok", stream=True, first_byte_at=1.1, last_byte_at=2.0,
                                      completion_tokens=5, prompt_tokens=3, cost_est=0.1,
                                      attempts=[AttemptRecord(1, "n0", "m", 1.0, 1.05, "retryable"),
                                                AttemptRecord(2, "n0", "m", 1.06, 2.0, "ok")]))
    obs.metrics.observe(RequestRecord(request_id="y", received_at=1.0, endpoint="chat", model_requested="m",
                                      status="rejected", http_status=429))
    obs.metrics.observe_engine("compiled", 0.001)
    return {s.name for fam in obs.registry.collect() for s in fam.samples}


def _panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dash["panels"] if p["type"] != "row"]


def test_grafana_dashboard_is_import_ready_and_uses_our_metrics() -> None:
    dash = json.loads((DEPLOY / "grafana" / "inferlb.json").read_text())
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36 and dash["id"] is None
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    exposed = _exposed()
    used: set[str] = set()
    for p in _panels(dash):
        assert p["datasource"]["uid"] == "${datasource}" and p["gridPos"]["w"] > 0
        for t in p["targets"]:
            names = set(_NAME.findall(t["expr"]))
            assert names <= exposed, (p["title"], names - exposed)
            used |= names
    # every family of the list has a panel
    for family in ("inferlb_requests_total", "inferlb_request_duration_seconds_bucket",
                   "inferlb_time_to_first_token_seconds_bucket", "inferlb_time_per_output_token_seconds_bucket",
                   "inferlb_prompt_tokens_total", "inferlb_completion_tokens_total", "inferlb_node_inflight_requests",
                   "inferlb_node_inflight_tokens", "inferlb_queue_depth", "inferlb_node_state",
                   "inferlb_node_ejections_total", "inferlb_retries_total", "inferlb_shed_requests_total",
                   "inferlb_audit_pending_records", "inferlb_audit_spool_bytes", "inferlb_engine_seconds_bucket",
                   "inferlb_request_cost_total"):
        assert family in used, family


def test_prometheus_examples_use_our_metrics() -> None:
    scrape = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["metrics_path"] == "/metrics"
    rules = yaml.safe_load((DEPLOY / "prometheus" / "inferlb-alerts.yml").read_text())
    exposed = _exposed()
    for rule in rules["groups"][0]["rules"]:
        assert set(_NAME.findall(rule["expr"])) <= exposed, rule["alert"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus) is not installed")
def test_promtool_accepts_config_rules_and_every_dashboard_query(tmp_path: Path) -> None:
    prom = DEPLOY / "prometheus"
    for args in (["check", "config", str(prom / "prometheus.yml")],
                 ["check", "rules", str(prom / "inferlb-alerts.yml")]):
        proc = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    # Each dashboard query as a recording rule: promtool parses the PromQL (variables substituted).
    dash = json.loads((DEPLOY / "grafana" / "inferlb.json").read_text())
    exprs = [t["expr"] for p in _panels(dash) for t in p["targets"]]
    subst = [e.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$model", ".*")
             .replace("$node", ".*") for e in exprs]
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e}
                                                        for i, e in enumerate(subst)]}]}
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
