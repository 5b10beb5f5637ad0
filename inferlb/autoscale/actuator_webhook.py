"""``webhook``: POSTs the plan as JSON, for KServe, Ray Serve or a custom controller to apply.

The body is ``{"kind": "inferlb.scaling_plan", "version": 1, "plan": Plan.to_json(), "changes":
[{"model", "gpu", "from", "to"}]}`` (every pool's desired replicas are in ``plan.pools``). A 2xx
answer means the receiver took the whole plan; it may answer ``{"replicas": {"MODEL/GPU": n}}``
to report what is in place, which becomes :meth:`current` (otherwise what it last accepted is).
Anything else (non-2xx, timeout, connection refused) fails every changed pool of the round, with
the status and the first 300 bytes of the answer; the next round posts the plan again.
Draining on scale-down is the receiver's job (it owns the replicas). The URL may carry the
receiver's credentials (``https://user:pw@…``, ``?token=…``): results (the scaling events, the
autoscale report) show it redacted (``redact_url``), error text included.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from inferlb.autoscale.actuator import PoolResult, guard_min
from inferlb.autoscale.planner import Plan
from inferlb.config.autoscale import AutoscaleConfig
from inferlb.config.netpolicy import redact_url

__all__ = ["WebhookActuator"]


class WebhookActuator:
    name = "webhook"

    def __init__(self, cfg: AutoscaleConfig, url: str | None = None) -> None:
        self.url = url or cfg.actuator.url or ""
        self.shown = redact_url(self.url)   # what results say: no password, no query token
        self.pools = {(p.model, p.gpu): p for p in cfg.pools}
        self.replicas: dict[tuple[str, str], int] = {k: p.min for k, p in self.pools.items()}
        self.timeout = aiohttp.ClientTimeout(total=cfg.actuator.timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout, trust_env=False)
        return self._session

    async def current(self) -> dict[tuple[str, str], int]:
        return dict(self.replicas)

    async def apply(self, plan: Plan) -> list[PoolResult]:
        changes = plan.changes
        if not changes:
            return []
        wanted = {d.key: guard_min(d, self.pools) for d in plan.pools}
        body = {"kind": "inferlb.scaling_plan", "version": 1, "plan": plan.to_json(),
                "changes": [{"model": d.model, "gpu": d.gpu, "from": d.current, "to": wanted[d.key]}
                            for d in changes]}
        error: str | None = None
        answer: Any = None
        try:
            async with self._client().post(self.url, json=body) as resp:
                text = await resp.text()
                if 200 <= resp.status < 300:
                    try:
                        answer = await resp.json(content_type=None) if text.strip() else None
                    except ValueError:
                        answer = None
                else:
                    error = f"webhook answered {resp.status}: {text[:300]}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            # aiohttp's message may quote the URL whole (InvalidURL, a redirect's error)
            error = f"webhook unreachable: {type(exc).__name__}: {str(exc).replace(self.url, self.shown)}"[:500]
        if error is not None:
            return [PoolResult(d.model, d.gpu, d.current, wanted[d.key], None, False, error, self.shown)
                    for d in changes]
        reported = answer.get("replicas") if isinstance(answer, dict) else None
        for key, n in wanted.items():
            got = reported.get(f"{key[0]}/{key[1]}") if isinstance(reported, dict) else None
            self.replicas[key] = int(got) if isinstance(got, int) and not isinstance(got, bool) else n
        return [PoolResult(d.model, d.gpu, d.current, wanted[d.key], self.replicas[d.key],
                           self.replicas[d.key] == wanted[d.key],
                           None if self.replicas[d.key] == wanted[d.key] else
                           f"the receiver reports {self.replicas[d.key]} in place", self.shown)
                for d in changes]

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
