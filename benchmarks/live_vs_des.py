"""Learned vs token-aware, in the DES and live on the real-time emulated fleet, cell by cell
(docs/benchmarks.md, "Live against the DES").

``python -m benchmarks.live_vs_des [--cells hetero4:0.85,uniform4:0.85] [--workload heavy-tail-mixed]
[--duration 90] [--seed 101] [--des-seeds 101,102,103] [--targets learned,token-aware] [--json OUT]``

Per cell (an emulator fleet preset and a load):

1. **Capacity**: each preset of the fleet alone in the DES, saturated (``benchmarks.matrix``'s
   calibration); the offered rate is load × their sum.
2. **DES**: the workload's plan at that rate for ``--duration`` virtual seconds, per seed of
   ``--des-seeds``, through each target profile (``learned`` with its feedback loop).
3. **Live**: ``inferlb bench compare --fleet F --rate R --duration D --seed S --targets …``: the
   same workload and rate sent in real time through a real gateway process to the emulated fleet
   (a fresh fleet per target).
4. The ordering of the targets by e2e p99 and by goodput in each, and whether it is the same.

The live run shares the machine with everything else on it: its latencies include the
emulator's and the gateway's own CPU contention, which the DES does not model.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.learned_goals import run_profile
from benchmarks.matrix import Family, calibrate
from inferlb.bench.loadgen.workload import load_workload
from inferlb.routing.length import LengthPredictor
from inferlb.simulator.presets import fleet_specs

__all__ = ["main"]


def _order(figs: dict[str, dict[str, float]], key: str, low_is_better: bool) -> list[str]:
    return sorted(figs, key=lambda p: figs[p][key] if low_is_better else -figs[p][key])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cells", default="hetero4:0.85,uniform4:0.85")
    ap.add_argument("--workload", default="heavy-tail-mixed")
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--seed", type=int, default=101)
    ap.add_argument("--des-seeds", default="101,102,103")
    ap.add_argument("--targets", default="learned,token-aware")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    w = load_workload(a.workload)
    fam = Family(w.name, w)
    targets = [t for t in a.targets.split(",") if t]
    cells = []
    for cell in a.cells.split(","):
        fleet, load = cell.split(":")
        specs = fleet_specs(fleet, [w.model])
        cap: dict[str, float] = {}
        for s in specs:
            if (s.preset or "?") not in cap:
                cap[s.preset or "?"] = calibrate(s.preset or "?", fam)
        rate = float(load) * sum(cap[s.preset or "?"] for s in specs)
        des: dict[str, dict[str, float]] = {}
        for p in targets:
            rows = []
            for seed in (int(x) for x in a.des_seeds.split(",")):
                reqs = fam.plan(seed=seed, rate=rate, duration_s=a.duration, max_requests=1_000_000)
                r = run_profile(p, specs, reqs, w, seed=seed, duration_s=a.duration, failure_cost_s=w.timeout_s,
                                lengths=LengthPredictor())   # as the live gateway by default
                rows.append(r.summary)
            des[p] = {"e2e_p99": sum(x["e2e_s"]["p99"] for x in rows) / len(rows),
                      "goodput": sum(x["goodput_rps"] for x in rows) / len(rows),
                      "ttft_p99": sum(x["ttft_s"]["p99"] for x in rows) / len(rows)}
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "live.json"
            cmd = [sys.executable, "-m", "inferlb.cli", "bench", "compare", "--fleet", fleet, "--workload", a.workload,
                   "--rate", f"{rate:.4f}", "--duration", str(a.duration), "--seed", str(a.seed),
                   "--targets", ",".join(targets), "--json", str(out), "--quiet", "--workdir", tmp]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy(), check=False)
            if proc.returncode != 0 or not out.exists():
                print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
                raise SystemExit(f"bench compare failed ({proc.returncode})")
            report = json.loads(out.read_text())
        live = {s["label"]: {"e2e_p99": s["e2e_s"]["p99"], "goodput": s["goodput_rps"],
                             "ttft_p99": s["ttft_s"]["p99"]} for s in report["runs"]}
        c: dict[str, Any] = {"fleet": fleet, "load": float(load), "rate": rate, "des": des, "live": live}
        for key, low in (("e2e_p99", True), ("goodput", False)):
            c[f"order_{key}"] = {"des": _order(des, key, low), "live": _order(live, key, low)}
            c[f"same_{key}"] = c[f"order_{key}"]["des"] == c[f"order_{key}"]["live"]
        cells.append(c)
        print(f"{fleet} load {float(load):.0%} ({rate:.2f} req/s, {a.duration:g} s):")
        for p in targets:
            d, lv = des[p], live.get(p, {})
            print(f"  {p:12} DES e2e p99 {d['e2e_p99']:.2f} s goodput {d['goodput']:.2f} | live e2e p99 "
                  f"{lv.get('e2e_p99', float('nan')):.2f} s goodput {lv.get('goodput', float('nan')):.2f}")
        for key in ("e2e_p99", "goodput"):
            o = c[f"order_{key}"]
            print(f"  best first by {key}: DES {', '.join(o['des'])}; live {', '.join(o['live'])}: "
                  f"{'same' if c[f'same_{key}'] else 'DIFFERENT'}", flush=True)
    if a.json is not None:
        a.json.write_text(json.dumps({"workload": a.workload, "duration": a.duration, "cells": cells}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
