"""Small discrete-event runs and a digest of everything they produce, for test_golden.py.

Each case is a fleet, a workload, a routing profile and a seed; :func:`digest` runs it and hashes
every result row (``repr`` of each :class:`~inferlb.simulator.des.results.DesOutcome`: the floats
to the last bit), the event count, the end time and the node table. ``python -m
tests.simulator.des.golden_runs`` prints the digests as JSON (how golden.json was made, from the
tree before a change that must keep the simulation).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from inferlb.bench.loadgen.workload import load_workload, plan
from inferlb.simulator.des.sim import Simulation
from inferlb.simulator.presets import preset_spec
from inferlb.simulator.spec import NodeSpec

__all__ = ["CASES", "Case", "digest"]

_CYCLE = ("h100", "a100", "l4")


@dataclass(frozen=True)
class Case:
    """One run: ``nodes`` preset nodes (h100 / a100 / l4 in turn, ``kv_scale`` of their KV cache,
    ``on_kv_full``), ``requests`` of ``workload`` at ``rate`` req/s, routed by ``profile``."""

    name: str
    nodes: int
    workload: str
    rate: float
    requests: int
    profile: str
    seed: int
    kv_scale: float = 1.0
    on_kv_full: str = "preempt"


CASES = (
    Case("token-aware-1000-chat", 1000, "chat", 3000.0, 4000, "token-aware", 1),
    Case("token-aware-40-heavy-tail", 40, "heavy-tail", 300.0, 3000, "token-aware", 7),
    Case("token-aware-12-bursty-small-kv", 12, "bursty", 120.0, 2500, "token-aware", 3, kv_scale=1 / 16),
    Case("token-aware-20-chat-oom", 20, "chat", 200.0, 2500, "token-aware", 10, kv_scale=1 / 16, on_kv_full="oom"),
    Case("round-robin-30-long-streams", 30, "long-streams", 150.0, 2500, "round-robin", 12),
    Case("least-connections-12-chat-preempt", 12, "chat", 160.0, 2500, "least-connections", 16, kv_scale=1 / 8),
    Case("power-of-two-200-heavy-tail-mixed", 200, "heavy-tail-mixed", 800.0, 3000, "power-of-two", 9),
    Case("learned-30-chat", 30, "chat", 300.0, 2000, "learned", 4),
    Case("prefix-affinity-60-heavy-tail", 60, "heavy-tail", 400.0, 2000, "prefix-affinity", 5),
)


def _fleet(c: Case) -> list[NodeSpec]:
    out = []
    for i in range(c.nodes):
        preset = _CYCLE[i % 3]
        base = preset_spec("x", preset).batching
        assert base is not None
        out.append(preset_spec(f"{preset}-{i:04d}", preset, kv_tokens=max(base.block_tokens * 64,
                                                                          int(base.kv_tokens * c.kv_scale)),
                               on_kv_full=c.on_kv_full))
    return out


def digest(c: Case) -> dict[str, Any]:
    """Run ``c`` and return its event count, end time, outcome counts and the sha256 of its rows
    and node table."""
    w = load_workload(c.workload)
    reqs = plan(w, seed=c.seed, rate=c.rate, duration_s=c.requests / c.rate * 1.2 + 1, max_requests=c.requests)
    sim = Simulation(_fleet(c), profile=c.profile, seed=c.seed, timeout_s=w.timeout_s)
    res = sim.run(reqs)
    h = hashlib.sha256()
    for row in res.rows():
        h.update(repr(tuple(row)).encode())
        h.update(b"\n")
    for n in res.nodes:
        h.update(repr((n.name, n.added_at, n.ready_at, n.removed_at, n.requests, n.busy_s, n.preemptions)).encode())
        h.update(b"\n")
    return {"events": sim.events, "end_s": repr(res.end_s), "outcomes": res.counts(),
            "preemptions": sum(n.preemptions for n in res.nodes), "sha256": h.hexdigest()}


if __name__ == "__main__":
    print(json.dumps({c.name: digest(c) for c in CASES}, indent=1, sort_keys=True))
