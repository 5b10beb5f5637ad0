"""The gateway's observer (autoscale/observe.py) on a real audit trail: the tokens the router sent
each pool become ``LoadHistory.routed``, and each pool is sized for its own share (issue 22, item 7);
the last round alone becomes ``LoadHistory.recent``, the burst path's input."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.engine import Engine

from inferlb.autoscale.capacity import Capacity
from inferlb.autoscale.forecast import make_forecaster
from inferlb.autoscale.observe import Observation, audit_observer
from inferlb.autoscale.policy import Autoscaler
from inferlb.config.autoscale import AutoscaleConfig
from tests.autoscale.conftest import T0, TOKENS, seasonal_records, seed


def test_a_pool_the_router_sends_a_small_share_is_sized_for_that_share(engine: Engine) -> None:
    # 2 h of traffic round-robin over 10 nodes: 1 h100 node gets 10 % of the tokens, 9 l4 nodes 90 %
    nodes = {"h100-0": "h100", **{f"l4-{i}": "l4" for i in range(9)}}
    records = seasonal_records(120, nodes, model="m")
    seed(engine, records)
    cfg = AutoscaleConfig.model_validate({
        "interval_s": 60, "step_s": 300, "season_s": 86_400, "history_s": 86_400, "target_utilisation": 0.5,
        "pools": [{"model": "m", "gpu": "h100", "min": 0, "max": 20, "cold_start_s": 60, "price_per_hour": 4.0},
                  {"model": "m", "gpu": "l4", "min": 0, "max": 40, "cold_start_s": 60, "price_per_hour": 0.8}]})
    observe = audit_observer(engine, cfg, node_gpu=lambda: nodes, slos=[])
    now = T0 + 7200

    async def once() -> Observation:
        return await observe(now)

    history, _ = asyncio.run(once())
    last_hour = [r for r in records if r.received_at >= now - 3600]
    sent = {gpu: sum(TOKENS for r in last_hour if nodes[str(r.node)] == gpu) / 3600 for gpu in ("h100", "l4")}
    assert history.routed[("m", "h100")] == pytest.approx(sent["h100"])
    assert history.routed[("m", "l4")] == pytest.approx(sent["l4"])
    share = sent["h100"] / (sent["h100"] + sent["l4"])
    assert 0.09 < share < 0.11
    last_minute = [r for r in records if r.received_at >= now - 60]
    assert history.recent["m"] == pytest.approx(len(last_minute) * TOKENS / 60)
    # sized per share: h100's demand is its 10 %, not the model's whole demand (nor cheapest-first)
    cap = {("m", "h100"): Capacity("m", "h100", 20.0, "prior", ""), ("m", "l4"): Capacity("m", "l4", 5.0, "prior", "")}
    scaler = Autoscaler(cfg, make_forecaster("reactive"))
    scaler.observe(history)
    scaler.forecast()
    p = scaler.plan(now=now, current={("m", "h100"): 1, ("m", "l4"): 9}, capacity=cap)
    by = {d.gpu: d for d in p.pools}
    assert by["h100"].share == pytest.approx(share) and by["l4"].share == pytest.approx(1 - share)
    demand = by["h100"].demand_tokens_s
    assert by["h100"].desired == -(-(demand / 0.5 * share) // 20.0) >= 1
    assert by["l4"].desired < 40            # cheapest-first would put all of it on l4, at its max
    assert by["l4"].desired == min(40, -(-(demand / 0.5 * (1 - share)) // 5.0))
