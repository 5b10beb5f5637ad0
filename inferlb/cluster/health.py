"""Node health as one state for every replica: ejections (outlier and hardware), their timers
and counts, and 429 cool-downs.

Contract:

* :meth:`SharedHealth.attach` hooks :attr:`Fleet.on_transition`. A local transition into
  ``ejected`` or ``cooldown``, and an ejection ended early (probes), become one *change* queued
  for the cluster service, which runs :data:`~.lua.HEALTH_LUA` (merge into the shared record,
  publish) and applies the merged record back here, so this replica's timer and count are the
  shared ones too.
* :meth:`SharedHealth.apply` takes a shared record (from the channel, or from a full read after
  the version moved) and makes the local state agree: a node still out in the record is ejected
  here for the *remaining* time (``ejected_until − now`` on the Redis clock, so replicas' clocks
  never meet), with the shared count and multiplier; a cool-down is extended to the shared one.
  Transitions made while applying are not sent back (no echo). Nodes already ``down``,
  ``loading`` or ``draining`` here keep that state (they take no traffic either).
* Restoring a node when its timer runs out stays local (every replica reaches the same timer).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from inferlb.fleet.node import NodeState
from inferlb.fleet.state import Fleet

__all__ = ["HealthChange", "SharedHealth"]

log = logging.getLogger("inferlb.cluster")

_TAKES_EJECTION = frozenset({"healthy", "cooldown", "half_open"})


@dataclass(frozen=True)
class HealthChange:
    """One local transition to share: ``kind`` is ejected | cooldown | clear."""

    node: str
    kind: str
    length_s: float
    hardware: bool
    reason: str
    evidence: dict[str, Any]


class SharedHealth:
    """See the module docstring."""

    def __init__(self, fleet: Fleet, replica_id: str) -> None:
        self.fleet = fleet
        self.replica_id = replica_id
        self.send: Callable[[HealthChange], None] | None = None
        self.applying = False
        self.applied = 0           # records that changed local state
        self.sent = 0
        # Nodes with a local change on its way to Redis: a record read meanwhile is older than it.
        self.pending: dict[str, int] = {}

    def attach(self, send: Callable[[HealthChange], None]) -> None:
        self.send = send
        self.fleet.on_transition = self._on_transition

    def detach(self) -> None:
        self.send = None
        if self.fleet.on_transition == self._on_transition:
            self.fleet.on_transition = None

    # ------------------------------------------------------------------ local → shared

    def _on_transition(self, st: NodeState, before: str | None) -> None:
        if self.applying or self.send is None:
            return
        now = self.fleet.clock.monotonic()
        name = st.cfg.name
        change: HealthChange | None = None
        if st.state == "ejected":
            change = HealthChange(name, "ejected", max(0.0, st.ejected_until - now), st.hardware_fault,
                                  st.reason, dict(st.evidence))
        elif st.state == "cooldown" and st.cooldown_until > now:
            change = HealthChange(name, "cooldown", st.cooldown_until - now, False, st.reason, dict(st.evidence))
        elif before == "ejected" and now < st.ejected_until:
            change = HealthChange(name, "clear", 0.0, False, st.reason, {})
        if change is not None:
            self.sent += 1
            self.pending[name] = self.pending.get(name, 0) + 1
            self.send(change)

    def sent_back(self, node: str) -> None:
        """The change to ``node`` reached Redis (or failed): records about it apply again."""
        left = self.pending.get(node, 0) - 1
        if left > 0:
            self.pending[node] = left
        else:
            self.pending.pop(node, None)

    # ------------------------------------------------------------------ shared → local

    def apply(self, node: str, rec: Mapping[str, Any], now_ms: float, *, own: bool = False) -> bool:
        """Make ``node``'s local state agree with the shared record ``rec`` read at ``now_ms``
        (Redis clock). ``own``: the answer to this replica's own change. Returns True when
        something changed here."""
        st = self.fleet.nodes.get(node)
        if st is None or (not own and node in self.pending):
            return False
        fleet = self.fleet
        mono = fleet.clock.monotonic()
        changed = False
        self.applying = True
        try:
            left_e = (float(rec.get("ejected_until") or 0) - now_ms) / 1000.0
            if left_e > 0:
                until = mono + left_e
                backoff = int(rec.get("backoff") or 0)
                ejections = int(rec.get("ejections") or 0)
                hardware = bool(rec.get("hardware"))
                if st.state == "ejected":
                    if abs(st.ejected_until - until) > 0.05 or st.backoff != backoff:
                        changed = True
                    st.ejected_until, st.backoff = until, backoff
                    st.ejections = max(st.ejections, ejections)
                    st.hardware_fault = st.hardware_fault or hardware
                elif st.state in _TAKES_EJECTION:
                    st.ejected_until, st.backoff, st.ejections = until, backoff, max(st.ejections, ejections)
                    st.hardware_fault = hardware
                    st.consecutive_failures = 0
                    st.slow_start_at = None
                    evidence = _evidence(rec.get("evidence"))
                    fleet.transition(st, "ejected", str(rec.get("reason") or "ejected by another replica"),
                                     {**evidence, "shared_from": rec.get("origin"), "ejection_s": round(left_e, 3),
                                      "ejections_in_a_row": backoff, "ejections_total": ejections})
                    changed = True
            elif st.state == "ejected" and st.ejected_until > mono + 0.05 and rec.get("cleared"):
                st.ejected_until = mono      # ended early elsewhere: the next sweep restores it here
                changed = True
            left_c = (float(rec.get("cooldown_until") or 0) - now_ms) / 1000.0
            if left_c > 0 and mono + left_c > st.cooldown_until + 0.05:
                fleet.cool_down(node, left_c)
                changed = True
        finally:
            self.applying = False
        if changed:
            self.applied += 1
        return changed


def _evidence(raw: Any) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    return dict(raw) if isinstance(raw, dict) else {}
