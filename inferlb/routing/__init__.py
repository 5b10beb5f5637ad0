"""I/O-free routing core: filter → scorer → picker plugins over node snapshots."""

from inferlb.routing.profiles import PROFILES, Router, build_router
from inferlb.routing.types import Decision, Elimination, NodeView, RouteRequest

__all__ = ["PROFILES", "Decision", "Elimination", "NodeView", "RouteRequest", "Router", "build_router"]
