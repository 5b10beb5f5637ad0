"""Tier outcomes read back from the audit trail (tiers/audit.py) and the learned models warmed from
them (TierRouter.warm_start): only the aliases asked for, the newest ``limit`` in time order, the
labels as at run time (an error or an SLO miss is a failure), only the cheaper tiers, nothing
read when no alias learns."""

from __future__ import annotations

import random
from pathlib import Path

from inferlb.config.settings import fleet_from_mapping
from inferlb.store.db import make_engine, upgrade
from inferlb.store.records import RequestRecord
from inferlb.store.rows import upsert_records
from inferlb.tiers.audit import tier_rows, warm_from_audit
from inferlb.tiers.router import TierRouter
from inferlb.types import ManualClock


def fleet(learned: bool) -> object:
    return fleet_from_mapping({
        "models": [{"name": "auto", "tiers": {"models": [{"model": "s", "max_score": 0.3}, {"model": "l"}],
                                              "learned": {"enabled": learned, "min_samples": 50}}},
                   {"name": "s"}, {"name": "l"}],
        "nodes": [{"name": "n", "url": "http://127.0.0.1:1", "models": ["s", "l"]}],
        "slos": [{"model": "auto", "e2e_max_s": 2.0}],
    })


def records(n: int) -> list[RequestRecord]:
    rng = random.Random(1)
    out = []
    for i in range(n):
        hard = rng.random() < 0.5
        tier = "l" if i % 10 == 0 else "s"
        feats = {"prompt_tokens": 0.9 if hard else 0.1, "code": 1.0 if hard else 0.0}
        out.append(RequestRecord(
            request_id=f"r{i:04d}", received_at=1000.0 + i, endpoint="chat", model_requested="auto",
            model_served=tier, status="upstream_error" if hard and i % 3 else "ok",
            last_byte_at=1000.0 + i + (3.0 if hard else 0.5),   # a hard one that is ok still misses the 2 s
            tags={"tier": {"alias": "auto", "model": tier, "index": 0 if tier == "s" else 1, "features": feats}}))
    out.append(RequestRecord(request_id="other", received_at=999.0, endpoint="chat", model_requested="s",
                             status="ok", tags={}))
    return out


def test_rows_of_the_aliases_newest_limit_in_time_order_and_a_warm_start(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    engine = make_engine(url)
    with engine.begin() as conn:
        upsert_records(conn, records(600))
    rows = tier_rows(engine, ["auto"], limit=100)
    assert [r["request_id"] for r in rows] == [f"r{i:04d}" for i in range(500, 600)]
    assert rows[0]["received_at"] == 1500.0 and rows[0]["tags"]["tier"]["alias"] == "auto"
    assert tier_rows(engine, []) == [] and len(tier_rows(engine, ["auto", "s"], limit=10_000)) == 601
    router = TierRouter(ManualClock())
    assert warm_from_audit(router, fleet(False), engine) == 0 and not router.models   # nobody learns: nothing read
    used = warm_from_audit(router, fleet(True), engine)
    assert used == 540                                   # the 60 outcomes of the strongest tier are not used
    m = router.models[("auto", "s")]
    assert m.trained + m.tested == 540 and m.ready
    assert m.predict({"prompt_tokens": 0.1}) > 0.75 > 0.25 > m.predict({"prompt_tokens": 0.9, "code": 1.0})
    assert ("auto", "l") not in router.models and not router.stats   # counts describe live traffic only
