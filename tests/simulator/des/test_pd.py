"""The DES of prefill/decode disaggregation (simulator/des/pd.py): virtual time, deterministic."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import pytest

from inferlb.simulator.des.pd import PdSimulation
from inferlb.simulator.disagg import KVTransferSpec
from inferlb.simulator.presets import SIM_MODEL, preset_spec

ROLES = {"n0": "prefill", "n1": "prefill", "n2": "decode", "n3": "decode"}


@dataclass(frozen=True)
class Req:
    t: float
    prompt_tokens: int
    output_tokens: int
    max_tokens: int | None = None


def _specs(**over: object) -> list:  # type: ignore[type-arg]
    return [preset_spec(n, "h100", [SIM_MODEL], **over) for n in ROLES]


def _mixed(n: int = 600, rate: float = 24.0, seed: int = 3) -> list[Req]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        long = rng.random() < 0.2
        out.append(Req(t, 12000 if long else 300, 64 if long else 200))
    return out


def _p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def test_one_request_pays_prefill_there_and_the_transfer_here() -> None:
    kv = KVTransferSpec(bytes_per_token=1_000_000, link_bytes_per_s=1e9, latency_s=0.01)   # 1 ms per token
    specs = _specs(kv_transfer=kv)
    [pd] = PdSimulation(specs, roles=ROLES).run([Req(0.0, 1000, 10)])
    [co] = PdSimulation(specs).run([Req(0.0, 1000, 10)])
    assert pd.status == co.status == "ok" and pd.mode == "disaggregated"
    assert ROLES[pd.prefill_node or ""] == "prefill" and ROLES[pd.decode_node or ""] == "decode"
    assert pd.transfer_s == pytest.approx(0.01 + 1000 * 0.001)
    assert pd.ttft_s is not None and co.ttft_s is not None
    # The pair's TTFT: a one-token prefill, the transfer, then a one-token prefill on the decode node.
    assert pd.ttft_s > co.ttft_s + pd.transfer_s - 0.001
    assert pd.tpot_s == pytest.approx(co.tpot_s, rel=0.05)


def test_disaggregation_stops_long_prefills_stalling_decodes_and_is_deterministic() -> None:
    reqs = _mixed()
    co = PdSimulation(_specs(), seed=1).run(reqs)
    pd = PdSimulation(_specs(), roles=ROLES, seed=1).run(reqs)
    assert all(r.status == "ok" for r in co + pd)
    chat_tpot = lambda rows: [r.tpot_s for r in rows if r.prompt_tokens == 300 and r.tpot_s is not None]  # noqa: E731
    assert _p99(chat_tpot(pd)) < 0.8 * _p99(chat_tpot(co))
    # ...at a price in time to first token: two prefill nodes queue every prompt (the trade).
    assert _p99([r.ttft_s for r in pd if r.ttft_s]) > _p99([r.ttft_s for r in co if r.ttft_s])
    assert {r.prefill_node for r in pd if r.mode == "disaggregated"} == {"n0", "n1"}
    assert {r.decode_node for r in pd} == {"n2", "n3"}
    again = PdSimulation(_specs(), roles=ROLES, seed=1).run(reqs)
    assert [(r.ttft_s, r.e2e_s, r.prefill_node) for r in again] == [(r.ttft_s, r.e2e_s, r.prefill_node) for r in pd]


def test_short_prompts_skip_the_prefill_leg() -> None:
    rows = PdSimulation(_specs(), roles=ROLES, min_prompt_tokens=1000).run([Req(0.0, 300, 5), Req(0.1, 2000, 5)])
    assert [r.mode for r in rows] == ["colocated", "disaggregated"]
    assert rows[0].prefill_node is None and rows[0].transfer_s == 0.0


def test_fixed_speed_nodes_work_too() -> None:
    specs = [replace(s, batching=None) for s in _specs()]
    rows = PdSimulation(specs, roles=ROLES).run([Req(0.0, 500, 4)])
    assert rows[0].status == "ok" and rows[0].ttft_s is not None
