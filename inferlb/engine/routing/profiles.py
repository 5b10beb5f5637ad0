"""Routing profiles: named filter → scorer → picker pipelines, and the :class:`Router` that runs one.

Built-in profiles:

- ``token-aware`` (default): healthy, serves-model, has-capacity; outstanding-tokens ×1.0,
  queue-depth ×0.5, kv-cache ×0.5, decode-speed ×1.0 (long requests to nodes that decode fast
  under their current load; see docs/benchmarks.md for what it changed); max-score.
- ``least-connections``: healthy, serves-model; least-requests; max-score (random ties).
- ``round-robin``: healthy, serves-model; round-robin.
- ``power-of-two``: healthy, serves-model, has-capacity; outstanding-tokens; power-of-two.
- ``weighted``: healthy, serves-model; static-weight; weighted-random.

A profile may be customised in the fleet file (``routing.filters/scorers/picker/params``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .registry import make_plugin
from .types import Decision, Elimination, Filter, NodeView, Picker, RouteRequest, Scorer

__all__ = ["PROFILES", "ProfileSpec", "Router", "build_router"]


@dataclass(frozen=True)
class ProfileSpec:
    filters: tuple[str, ...]
    scorers: dict[str, float] = field(default_factory=dict)
    picker: str = "max-score"


PROFILES: dict[str, ProfileSpec] = {
    "token-aware": ProfileSpec(("healthy", "serves-model", "has-capacity"),
                               {"outstanding-tokens": 1.0, "queue-depth": 0.5, "kv-cache": 0.5,
                                "decode-speed": 1.0}),
    "least-connections": ProfileSpec(("healthy", "serves-model"), {"least-requests": 1.0}),
    "round-robin": ProfileSpec(("healthy", "serves-model"), {}, "round-robin"),
    "power-of-two": ProfileSpec(("healthy", "serves-model", "has-capacity"),
                                {"outstanding-tokens": 1.0}, "power-of-two"),
    "weighted": ProfileSpec(("healthy", "serves-model"), {"static-weight": 1.0}, "weighted-random"),
}


class Router:
    """Runs one profile. ``decide`` is pure apart from the picker's own state and ``rng``."""

    def __init__(self, name: str, filters: list[Filter], scorers: list[tuple[Scorer, float]],
                 picker: Picker, rng: random.Random) -> None:
        self.name = name
        self.filters = filters
        self.scorers = scorers
        self.picker = picker
        self.rng = rng

    def decide(self, req: RouteRequest, nodes: list[NodeView]) -> Decision:
        """Filter, score, rank. Nodes in ``req.exclude`` are eliminated first ("already tried")."""
        d = Decision(self.name, [n.name for n in nodes], picker=self.picker.type_name)
        live = []
        for n in nodes:
            if n.name in req.exclude:
                d.eliminated.append(Elimination(n.name, "retry", "already tried for this request"))
            else:
                live.append(n)
        for f in self.filters:
            if not live:
                break
            live, out = f.apply(req, live)
            d.eliminated.extend(out)
        if not live:
            return d
        total_w = sum(w for _, w in self.scorers) or 1.0
        scored: list[tuple[NodeView, float]] = []
        for n in live:
            parts = {s.type_name: s.score(req, n) for s, _ in self.scorers}
            total = sum(parts[s.type_name] * w for s, w in self.scorers) / total_w if self.scorers else 0.0
            parts["total"] = total
            d.scores[n.name] = parts
            scored.append((n, total))
        d.ranked = self.picker.rank(scored, self.rng)
        return d


def build_router(profile: str, *, filters: list[str] | None = None, scorers: dict[str, float] | None = None,
                 picker: str | None = None, params: dict[str, dict[str, Any]] | None = None,
                 seed: int | None = None) -> Router:
    """Build a router from a profile name plus overrides; plugin errors raise ConfigError."""
    base = PROFILES.get(profile)
    if base is None and filters is None:
        raise ConfigError(f"unknown routing profile {profile!r} (known: {', '.join(sorted(PROFILES))})",
                          path="routing.profile")
    spec = base or ProfileSpec(())
    params = params or {}
    fs: list[Filter] = [make_plugin(n, params.get(n)) for n in (filters if filters is not None else spec.filters)]
    sc: list[tuple[Scorer, float]] = []
    for n, w in (scorers if scorers is not None else spec.scorers).items():
        if w < 0:
            raise ConfigError(f"scorer weight must be ≥ 0, got {w}", path=f"routing.scorers.{n}")
        sc.append((make_plugin(n, params.get(n)), w))
    pk: Picker = make_plugin(picker or spec.picker, params.get(picker or spec.picker))
    return Router(profile, fs, sc, pk, random.Random(seed))
