"""EndpointSlices → nodes, and the diff that moves discovered nodes: pure (no I/O, no clock).

* :func:`endpoints_of`: one EndpointSlice (the API's JSON, camelCase) → its endpoints for the
  configured port: node name, URL, and whether it serves (``conditions.ready`` true — unset counts
  as true, as the API documents — and not ``terminating``). The first address is used, as
  kube-proxy does.
* :class:`SliceCache`: the slices last seen, by name: replaced whole by a list, changed by watch
  events (``ADDED`` / ``MODIFIED`` / ``DELETED``). Errors never reach it, so an API server that
  is away leaves the last known set in place.
* :func:`observed`: the cache → per node name, its node spec and whether it serves (a pod listed in
  two slices serves if either says so).
* :func:`plan`: the discovered rows in force + what is observed + which nodes are drained now →
  the new rows. A serving endpoint is a node (added, or undrained, or replaced when its address
  changed); one that stops serving or disappears is drained first, and its row goes only once the
  fleet reports it ``drained`` (no request in flight): the same drain → drained → remove an
  operator does (live/fleet_admin.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field
from typing import Any

from inferlb.config.discovery import KubernetesDiscoveryConfig
from inferlb.store.overrides import NodeOverride

__all__ = ["Change", "Endpoint", "Observed", "SliceCache", "endpoints_of", "node_name", "observed", "plan"]

SOURCE = "discovery"


@dataclass(frozen=True)
class Endpoint:
    name: str          # the node name
    url: str
    serving: bool      # ready and not terminating
    pod: str | None    # targetRef.name when the endpoint is a Pod
    zone: str | None = None


def node_name(cfg: KubernetesDiscoveryConfig, ep: Mapping[str, Any], address: str) -> str:
    """``name_prefix`` + the pod's name, or + the address (``10-0-0-7``) when no pod is named."""
    ref = ep.get("targetRef") or {}
    base = ref.get("name") if isinstance(ref, Mapping) and ref.get("name") else None
    if base is None:
        base = address.replace(".", "-").replace(":", "-").strip("-[]")
    return f"{cfg.name_prefix}{base}"


def _port(cfg: KubernetesDiscoveryConfig, ports: Iterable[Mapping[str, Any]]) -> int | None:
    ps = [p for p in ports if isinstance(p, Mapping) and isinstance(p.get("port"), int)]
    if cfg.port is not None:
        return next((int(p["port"]) for p in ps if p.get("name") == cfg.port), None)
    return int(ps[0]["port"]) if len(ps) == 1 else None


def endpoints_of(cfg: KubernetesDiscoveryConfig, slice_: Mapping[str, Any]) -> list[Endpoint]:
    """The endpoints of one slice that carry the configured port (none when it lacks that port)."""
    port = _port(cfg, slice_.get("ports") or [])
    if port is None:
        return []
    ipv6 = slice_.get("addressType") == "IPv6"
    out = []
    for ep in slice_.get("endpoints") or []:
        addresses = ep.get("addresses") or []
        if not addresses:
            continue
        address = str(addresses[0])
        host = f"[{address}]" if ipv6 else address
        cond = ep.get("conditions") or {}
        ready = cond.get("ready") is not False            # unset: ready (the API's documented default)
        terminating = cond.get("terminating") is True     # unset: not terminating
        ref = ep.get("targetRef") or {}
        out.append(Endpoint(node_name(cfg, ep, address), f"{cfg.scheme}://{host}:{port}", ready and not terminating,
                            ref.get("name") if isinstance(ref, Mapping) else None, ep.get("zone")))
    return out


@dataclass
class SliceCache:
    """The EndpointSlices last seen, by name, and the resourceVersion to watch from."""

    slices: dict[str, dict[str, Any]] = field(default_factory=dict)
    resource_version: str | None = None

    def replace(self, items: Iterable[Mapping[str, Any]], resource_version: str | None) -> None:
        """A full list: what it lacks is gone."""
        self.slices = {str(s["metadata"]["name"]): dict(s) for s in items}
        self.resource_version = resource_version

    def apply(self, kind: str, obj: Mapping[str, Any]) -> bool:
        """One watch event; True when the set of slices changed (a ``BOOKMARK`` only moves the version)."""
        meta = obj.get("metadata") or {}
        rv = meta.get("resourceVersion")
        if rv:
            self.resource_version = str(rv)
        name = meta.get("name")
        if kind == "BOOKMARK" or not name:
            return False
        if kind == "DELETED":
            return self.slices.pop(str(name), None) is not None
        if kind in ("ADDED", "MODIFIED"):
            self.slices[str(name)] = dict(obj)
            return True
        return False


@dataclass(frozen=True)
class Observed:
    spec: dict[str, Any]    # the whole node entry (template + name + url)
    serving: bool


def observed(cfg: KubernetesDiscoveryConfig, cache: SliceCache) -> dict[str, Observed]:
    """Every endpoint of the cached slices as a node spec; serving if any slice says so."""
    out: dict[str, Observed] = {}
    for name in sorted(cache.slices):
        for ep in endpoints_of(cfg, cache.slices[name]):
            prev = out.get(ep.name)
            if prev is not None and (prev.serving or not ep.serving):
                continue
            out[ep.name] = Observed({**cfg.node, "name": ep.name, "url": ep.url}, ep.serving)
    return out


@dataclass(frozen=True)
class Change:
    node: str
    action: str      # add | undrain | replace | drain | remove


def plan(current: Mapping[str, NodeOverride], seen: Mapping[str, Observed], drained_now: Set[str], *,
         at: float) -> tuple[dict[str, NodeOverride], list[Change]]:
    """The new discovered rows and what changed (module docstring). ``current``: the rows in force;
    ``drained_now``: nodes the fleet shows ``drained`` (held, nothing in flight)."""
    rows: dict[str, NodeOverride] = {}
    changes: list[Change] = []
    for name, obs in seen.items():
        row = current.get(name)
        if obs.serving:
            rows[name] = NodeOverride(name, SOURCE, obs.spec, drained=False, updated_at=at)
            if row is None:
                changes.append(Change(name, "add"))
            elif row.spec.get("url") != obs.spec.get("url"):
                changes.append(Change(name, "replace"))
            elif row.drained:
                changes.append(Change(name, "undrain"))
            else:
                rows[name] = row if row.spec == obs.spec else rows[name]
    for name, row in current.items():
        if name in rows:
            continue
        if row.drained and name in drained_now:
            changes.append(Change(name, "remove"))
            continue
        if not row.drained:
            changes.append(Change(name, "drain"))
            row = NodeOverride(name, SOURCE, row.spec, drained=True, updated_at=at)
        rows[name] = row
    return dict(sorted(rows.items())), changes
