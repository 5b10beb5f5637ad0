"""``inferlb report capacity`` and ``inferlb demo --autoscale`` (the CLI side of autoscale).

``report capacity``: the capacity report (:mod:`inferlb.autoscale.report`) of the audit
database, with the fleet file's nodes, GPU labels, prices and SLOs: the advice in words, then one
line per model and GPU type (``--format json`` prints the whole report).

``demo --autoscale``: the demo fleet plus an ``autoscale:`` section whose ``local`` actuator starts
emulated nodes (the ``l4`` preset) that stay "loading" for their cold start, then join the
gateway's routing through its health probes (:class:`SimLauncher`). Rounds run every 10 s over
10 s steps with a 10-minute season: the first season forecasts reactively (said in
``scaling_events`` and ``GET /admin/autoscale``); with a periodic load the seasonal forecaster
starts nodes ahead of the next ramp.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from inferlb.autoscale.actuator_local import LaunchedNode
from inferlb.config.settings import FleetConfig, fleet_from_mapping

__all__ = ["SimLauncher", "capacity_command", "demo_autoscale_fleet", "format_capacity"]


class SimLauncher:
    """Starts emulated GPU nodes (``inferlb/simulator``) with a real cold start: ``startup_s``."""

    def __init__(self, *, default_output_tokens: int = 32) -> None:
        self.nodes: dict[str, Any] = {}
        self.default_output_tokens = default_output_tokens

    async def start(self, name: str, model: str, gpu: str, cold_start_s: float) -> LaunchedNode:
        from inferlb.simulator.node import EmulatedNode
        from inferlb.simulator.presets import PRESETS, preset_spec

        preset = gpu if gpu in PRESETS else "l4"
        node = EmulatedNode(preset_spec(name, preset, [model], startup_s=cold_start_s,
                                        default_output_tokens=self.default_output_tokens))
        await node.start("127.0.0.1", 0)
        self.nodes[name] = node
        return LaunchedNode(node.url, capacity_tokens=PRESETS[preset].kv_tokens, max_concurrency=64)

    async def stop(self, name: str) -> None:
        node = self.nodes.pop(name, None)
        if node is not None:
            await node.stop()


def demo_autoscale_fleet(base: FleetConfig) -> FleetConfig:
    """``base`` (the demo fleet) with its nodes labelled by GPU type and an autoscale section."""
    raw = base.model_dump(mode="json", exclude_none=True)
    gpus = ("h100", "a100", "l4")
    for node, gpu in zip(raw["nodes"], gpus, strict=False):
        node.setdefault("labels", {})["gpu"] = gpu
    raw["autoscale"] = {
        "interval_s": 10, "step_s": 10, "season_s": 600, "history_s": 3600, "forecaster": "seasonal-naive",
        "target_utilisation": 0.6, "scale_down_stabilisation_s": 60,
        "pools": [{"model": "demo-llm", "gpu": "l4", "min": 1, "max": 5, "cold_start_s": 15,
                   "price_per_hour": 0.6, "tokens_per_s": 300}],
        "actuator": {"kind": "local", "drain_timeout_s": 30},
    }
    return fleet_from_mapping(raw, source="demo --autoscale")


def format_capacity(report: dict[str, Any]) -> str:
    lines = ["Advice:"]
    for a in [*report["advice"], *report["vertical"]]:
        lines.append(f"  - {a['text']}")
    if len(lines) == 1:
        lines.append("  (none: every pool is within its utilisation band and held its SLO)")
    lines.append("")
    head = ("model", "gpu", "nodes", "tokens", "slo", "util", "cap tok/s", "source", "per Mtok @cap", "per Mtok seen")
    lines.append("  ".join(f"{h:>12}" for h in head))
    for r in report["data"]:
        vals = (r["model"], r["gpu"], r["nodes"], r["tokens"],
                "-" if r["slo_attainment"] is None else f"{r['slo_attainment'] * 100:.1f}%",
                "-" if r["token_utilisation"] is None else f"{r['token_utilisation'] * 100:.1f}%",
                "-" if r["capacity_tokens_s"] is None else f"{r['capacity_tokens_s']:.4g}", r["capacity_source"],
                "-" if r["cost_per_mtok_at_capacity"] is None else f"{r['cost_per_mtok_at_capacity']:.4g}",
                "-" if r["cost_per_mtok_observed"] is None else f"{r['cost_per_mtok_observed']:.4g}")
        lines.append("  ".join(f"{v!s:>12}" for v in vals))
    return "\n".join(lines)


def capacity_command(args: argparse.Namespace, database_url: str, fleet: FleetConfig | None) -> int:
    import sys

    from inferlb.autoscale.report import capacity_report
    from inferlb.store.db import make_engine
    from inferlb.store.report_params import parse_time

    if fleet is None:
        print("inferlb: error: report capacity needs --config FLEET (nodes, GPU labels, prices, SLOs)",
              file=sys.stderr)
        return 2
    engine = make_engine(database_url)
    try:
        report = capacity_report(engine, fleet, since=parse_time(args.since, param="since"),
                                 until=parse_time(args.until, param="until"), bucket=args.bucket)
    finally:
        engine.dispose()
    print(json.dumps(report, indent=2) if args.format == "json" else format_capacity(report))
    return 0
