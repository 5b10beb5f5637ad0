"""A runtime with a real Fleet and AdmissionController on a ManualClock, and request helpers."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from inferlb.admission.keys import ApiKey
from inferlb.app import request_end
from inferlb.config.settings import Settings, fleet_from_mapping
from inferlb.engine.scope import RequestScope, Runtime, build_runtime
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.types import ManualClock


@dataclass
class Rig:
    rt: Runtime
    clock: ManualClock
    records: list[RequestRecord] = field(default_factory=list)

    @property
    def ctl(self) -> Any:
        return self.rt.admission

    def scope(self, rid: str, *, deadline_s: float = 600.0) -> RequestScope:
        rec = RequestRecord(request_id=rid, received_at=self.clock.time(), endpoint="chat", model_requested="m")
        return RequestScope(rt=self.rt, record=rec, received_mono=self.clock.monotonic(),
                            deadline_at=self.clock.monotonic() + deadline_s, model="m", models_tried=["m"])

    def admit(self, rid: str, *, prio: str = "standard", key: str | None = None, deadline_s: float = 600.0,
              prompt: int = 10, output: int = 20) -> tuple[RequestScope, dict[str, Any]]:
        s = self.scope(rid, deadline_s=deadline_s)
        ev = {"model": "m", "priority": prio, "prompt_tokens_est": prompt, "output_budget": output}
        return s, self.ctl.admit(s, ev, {"key_id": key})

    def again(self, s: RequestScope, prio: str = "standard") -> dict[str, Any]:
        ev = {"model": "m", "priority": prio, "prompt_tokens_est": 10, "output_budget": 20}
        out: dict[str, Any] = self.ctl.admit(s, ev, None)
        return out

    def end(self, s: RequestScope, status: str = "ok", *, prompt: int | None = None, completion: int | None = None,
            cost: float | None = None, attempted: bool = True) -> None:
        rec = s.record
        rec.status = status
        rec.prompt_tokens, rec.completion_tokens, rec.cost_est = prompt, completion, cost
        if attempted:
            rec.attempts.append(AttemptRecord(number=1, node="n0", model="m", started_at=self.clock.time()))
        self.rt.on_request_end(rec)

    def add_key(self, **kw: Any) -> ApiKey:
        key = ApiKey(id=kw.pop("id", "key_1"), tenant=kw.pop("tenant", "acme"), key_hash=kw.pop("key_hash", "h"),
                     hint="sk-gw-…", **kw)
        self.ctl.keys.put(key)
        return key


def make_rig(admission: dict[str, Any] | None = None, *, nodes: int = 2, conc: int = 2, **settings: Any) -> Rig:
    clock = ManualClock()
    cfg = fleet_from_mapping({
        "models": [{"name": "m"}],
        "nodes": [{"name": f"n{i}", "url": f"http://127.0.0.1:{i + 1}", "models": ["m"], "max_concurrency": conc}
                  for i in range(nodes)],
        "admission": admission or {},
    })
    records: list[RequestRecord] = []
    rt = build_runtime(Settings(**settings), cfg, clock=clock, seed=1, end=partial(request_end, audit=records.append))
    return Rig(rt, clock, records)
