"""The peer matrix's table: cells of ``bench compare`` reports grouped by load, seeds averaged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.peers_matrix import HEAD, main, table


def _run(label: str, share: float, p99: float, cpu: float | None) -> dict[str, Any]:
    return {"label": label, "good_share": share, "measured": 100, "errors": {"timeout": 2} if cpu is None else {},
            "ttft_s": {"p50": 0.1, "p99": 1.0}, "e2e_s": {"p50": 1.0, "p99": p99}, "goodput_rps": 10 * share,
            "router_cpu_ms_per_req": cpu, "cpu_core_share": {"system_busy": 0.5}}


def _report(path: Path, seed: int, load: float, runs: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"meta": {"seed": seed, "argv": ["compare", "--load", str(load)]}, "runs": runs}))
    return path


def test_table_groups_by_load_and_averages_seeds(tmp_path: Path) -> None:
    files = [_report(tmp_path / "a.json", 1, 0.85, [_run("inferlb:token-aware", 1.0, 10.0, 12.0),
                                                    _run("litellm:least-busy", 0.5, 50.0, None)]),
             _report(tmp_path / "b.json", 2, 0.85, [_run("inferlb:token-aware", 0.9, 14.0, 14.0)]),
             _report(tmp_path / "c.json", 1, 0.7, [_run("inferlb:token-aware", 1.0, 8.0, 11.0)])]
    md = table(files, None)
    blocks = md.split("**load ")
    assert blocks[1].startswith("70 %") and blocks[2].startswith("85 %")
    assert "| " + " | ".join(HEAD) + " |" in md
    rows = {line.split(" | ")[0].lstrip("| "): line for line in blocks[2].splitlines() if line.startswith("| ")}
    ours = rows["inferlb:token-aware"].split(" | ")
    assert ours[1] == "1,2" and ours[2] == "95.0 (90.0–100.0)" and ours[6] == "12.0 (10.0–14.0)"
    assert ours[9] == "13.00"
    peer = rows["litellm:least-busy"].split(" | ")
    assert peer[8] == "2/100" and peer[9] == "-"


def test_run_skips_cells_already_measured(tmp_path: Path) -> None:
    # Every cell's file exists: nothing is started, nothing failed.
    for name in ("s1-l0.70.json", "s1-l0.85.json"):
        (tmp_path / name).write_text("{}")
    assert main(["run", "--out", str(tmp_path), "--seeds", "1", "--loads", "0.70,0.85"]) == 0
