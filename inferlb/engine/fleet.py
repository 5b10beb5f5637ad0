"""Nodes and their live state as the gateway sees it.

The gateway (one event loop) mutates :class:`NodeState` counters on dispatch start/end and on
outcomes; routing reads immutable :class:`~inferlb.engine.routing.NodeView` snapshots built by
:meth:`Fleet.views`. Passive health in this first version: consecutive gateway-side failures eject
a node (Envoy's ``consecutive_5xx`` = 5, ``base_ejection_time`` 30 s growing per ejection, capped
at 300 s, at most 50 % of a model's nodes ejected at once), and a 429 cools a node down for its
Retry-After (extended, never shortened). Time comes from the injected clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from .routing.types import NodeView
from .settings import FleetConfig, ModelConfig, NodeConfig
from .types import Clock

__all__ = ["EjectionPolicy", "Fleet", "NodeState"]


@dataclass(frozen=True)
class EjectionPolicy:
    consecutive_failures: int = 5
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 50.0


@dataclass
class NodeState:
    cfg: NodeConfig
    inflight_requests: int = 0
    inflight_tokens: int = 0
    consecutive_failures: int = 0
    ejections: int = 0
    ejected_until: float = 0.0
    cooldown_until: float = 0.0
    tokens_per_s: float | None = None
    requests_total: int = 0
    failures_total: int = 0

    def unhealthy_reason(self, now: float) -> str | None:
        if now < self.ejected_until:
            return f"ejected for {self.ejected_until - now:.1f}s more after {self.ejections} ejection(s)"
        if now < self.cooldown_until:
            return f"cooling down for {self.cooldown_until - now:.1f}s more (429 Retry-After)"
        return None


class Fleet:
    """The configured fleet plus the gateway's live view of each node."""

    def __init__(self, cfg: FleetConfig, clock: Clock, policy: EjectionPolicy | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.policy = policy or EjectionPolicy()
        self.nodes: dict[str, NodeState] = {n.name: NodeState(n) for n in cfg.nodes}
        self.models: dict[str, ModelConfig] = {m.name: m for m in cfg.models}
        self._model_sets = {n.name: frozenset(n.models) for n in cfg.nodes}

    def views(self) -> list[NodeView]:
        now = self.clock.monotonic()
        out = []
        for name, st in self.nodes.items():
            reason = st.unhealthy_reason(now)
            out.append(NodeView(
                name=name, models=self._model_sets[name], capacity_tokens=st.cfg.capacity_tokens,
                max_concurrency=st.cfg.max_concurrency, weight=st.cfg.weight,
                inflight_requests=st.inflight_requests, inflight_tokens=st.inflight_tokens,
                healthy=reason is None, unhealthy_reason=reason, tokens_per_s=st.tokens_per_s,
            ))
        return out

    def acquire(self, node: str, tokens: int) -> None:
        st = self.nodes[node]
        st.inflight_requests += 1
        st.inflight_tokens += tokens
        st.requests_total += 1

    def release(self, node: str, tokens: int) -> None:
        st = self.nodes[node]
        st.inflight_requests = max(0, st.inflight_requests - 1)
        st.inflight_tokens = max(0, st.inflight_tokens - tokens)

    def report_success(self, node: str, *, completion_tokens: int = 0, decode_s: float = 0.0) -> None:
        st = self.nodes[node]
        st.consecutive_failures = 0
        if completion_tokens > 1 and decode_s > 0:
            speed = completion_tokens / decode_s
            st.tokens_per_s = speed if st.tokens_per_s is None else 0.8 * st.tokens_per_s + 0.2 * speed

    def report_failure(self, node: str) -> bool:
        """Count a gateway-side failure; returns True when this failure ejected the node."""
        st = self.nodes[node]
        st.failures_total += 1
        st.consecutive_failures += 1
        if st.consecutive_failures < self.policy.consecutive_failures:
            return False
        now = self.clock.monotonic()
        if now < st.ejected_until or not self._may_eject(node, now):
            return False
        st.ejections += 1
        st.consecutive_failures = 0
        st.ejected_until = now + min(self.policy.max_ejection_s, self.policy.base_ejection_s * st.ejections)
        return True

    def _may_eject(self, node: str, now: float) -> bool:
        models = self._model_sets[node]
        peers = [s for n, s in self.nodes.items() if self._model_sets[n] & models]
        ejected = sum(1 for s in peers if now < s.ejected_until)
        # Envoy: always at least one host may be ejected, whatever the percentage.
        return ejected == 0 or (ejected + 1) * 100.0 <= self.policy.max_ejection_percent * len(peers)

    def cool_down(self, node: str, seconds: float) -> None:
        """Skip ``node`` for ``seconds`` (429 Retry-After); extends, never shortens."""
        st = self.nodes[node]
        st.cooldown_until = max(st.cooldown_until, self.clock.monotonic() + seconds)

    def inflight_total(self) -> int:
        return sum(s.inflight_requests for s in self.nodes.values())
