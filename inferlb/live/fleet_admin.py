"""The fleet as operators change it live: the file merged with the node overrides, applied to the
running :class:`~inferlb.fleet.state.Fleet` without losing what the gateway learned.

Pure parts (no I/O): :func:`merge_overrides` (base fleet + overrides → an :class:`Effective`
config, validated like the file, or ConfigError naming the key path) and the node operations
(:func:`add_node`, :func:`set_drained`, :func:`patch_node`, :func:`remove_node`: overrides → new
overrides, or a ClientError; nothing is written). Live parts, on the event loop, synchronous:
:func:`apply_fleet` reconciles the running fleet with an effective config, :func:`settle` finishes
drains and removals once no request is in flight.

How a node's state moves (every change is a :class:`~inferlb.node_types.NodeEvent`):

* a node that persists keeps everything it has (state, in-flight counts, learned speeds,
  ejection history); a changed weight, capacity, labels or price takes effect on the next routing
  snapshot; a changed URL or kind is a new server: ``loading`` until probed again;
* a new node starts ``loading`` and gets no traffic until the health process
  (processes/node_health.bpmn) has seen ``health.probe.healthy_threshold`` good probes; then it
  enters slow start like any node coming back (a node without probes starts in slow start at once);
* an operator's drain: ``draining`` (held: the health sweeps leave it alone, routing skips it, the
  requests in flight finish) → ``drained`` once none is in flight; undrain: ``healthy`` in slow start;
* a removed node (from the file or by an operator) is ``retired``: ``draining`` while requests are
  in flight, then gone (event to ``removed``). Requests running on it finish normally.

Discovered nodes (discovery, source ``discovery``) join the merge as rows of their own:
the same states as an operator's node; the file's or an operator's node of the same name wins (the
discovered one is left out); operators may drain them, but patching or removing one is refused
(409 ``discovered_node``): the orchestrator owns them.

Model versions (config/versions.py) that list their nodes by name live in the fleet file, which a
live change cannot edit. So :func:`remove_node` refuses (409 ``node_in_version``, ``?force=true``
or not: the result would name a node that no longer exists) a node that such a list names, and
says which key names it (``models[llama-8b].versions[v2].nodes``); and
:func:`unversioned_warnings` tells an operator who adds a node serving a versioned model that no
version takes it in: routing only picks nodes of the request's version (tasks/routing.py), so the
node gets none of that model's traffic until a version lists it or its selector matches.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from inferlb.config.netpolicy import redact_url
from inferlb.config.settings import FleetConfig, NodeConfig, fleet_from_mapping
from inferlb.config.versions import version_nodes
from inferlb.cost import Share, node_prices
from inferlb.errors import ConfigError, Conflict, InvalidRequest, NotFound
from inferlb.fleet.node import NodeState
from inferlb.fleet.state import Fleet
from inferlb.health.monitor import check_health_config
from inferlb.node_types import NodeEvent
from inferlb.store.overrides import NodeOverride

__all__ = ["PATCHABLE", "Effective", "add_node", "apply_fleet", "config_version", "merge_overrides", "naming_versions",
           "patch_node", "remove_node", "set_drained", "settle", "unversioned_warnings"]

# What PATCH /admin/nodes/{name} may change (the rest of a node is its identity: name, URL, kind, models).
PATCHABLE = ("weight", "labels", "capacity_tokens", "max_concurrency", "price_per_hour", "api_key_env")

log = logging.getLogger("inferlb.fleet")


def _no_literal_key(spec: Mapping[str, Any]) -> None:
    """A node added or changed live never carries its key: it would be stored in the overrides
    table in plain text and reach every replica. It names an environment variable instead."""
    if "api_key" in spec:
        raise InvalidRequest("A literal api_key is not accepted here (it would be stored in the database in plain "
                             "text): set the key in an environment variable on every gateway replica and send "
                             "its name as api_key_env", param="api_key", code="literal_api_key")


def _key_env_set(node: NodeConfig) -> None:
    if node.missing_key_env is not None:
        raise InvalidRequest(f"api_key_env: environment variable {node.missing_key_env} is not set (or empty) on "
                             f"this gateway replica; set it on every replica first", param="api_key_env",
                             code="api_key_env_missing")


@dataclass(frozen=True)
class Effective:
    """The fleet config in force: the base file with the overrides merged in."""

    cfg: FleetConfig
    drained: frozenset[str]
    sources: Mapping[str, str]          # node name -> "file" | "admin" | "discovery"
    version: str                        # config_version(cfg)


def config_version(cfg: FleetConfig) -> str:
    """The config's content hash (SHA-256 of its canonical JSON, 12 hex digits)."""
    doc = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(doc.encode()).hexdigest()[:12]


def merge_overrides(base: FleetConfig, overrides: Sequence[NodeOverride], *, source: str = "node overrides",
                    discovered: Sequence[NodeOverride] = ()) -> Effective:
    """``base`` with ``overrides`` applied, validated like a fleet file (ConfigError with ``source``
    and the key path otherwise). A file override of a node the file no longer has is ignored; a
    node both in the file and added by an operator is an error (which one should win is the
    operator's call). ``discovered``: rows of source ``discovery`` (whole node specs, ``drained``
    when their pod stops serving); one whose name is taken is left out."""
    by_name = {o.name: o for o in overrides}
    nodes: list[dict[str, Any]] = []
    sources: dict[str, str] = {}
    hidden: set[str] = set()
    for i, n in enumerate(base.nodes):
        o = by_name.get(n.name)
        if o is not None and o.source == "admin":
            raise ConfigError(f"node {n.name!r} is in the fleet file and was also added by an operator; remove "
                              f"one of them (inferlb fleet remove {n.name} --force)", source=source,
                              path=f"nodes[{i}].name")
        if o is not None and o.removed:
            hidden.add(n.name)
            continue
        spec = n.model_dump()
        if o is not None:
            spec.update(o.spec)
        nodes.append(spec)
        sources[n.name] = "file"
    for o in overrides:
        if o.source == "admin" and not o.removed:
            nodes.append(dict(o.spec))
            sources[o.name] = "admin"
    for o in discovered:
        why = base.url_problem(str(o.spec.get("url", "")))
        if why is not None:   # one endpoint the policy refuses must not block the rest of the fleet
            log.warning("discovered node %s left out: %s", o.name, why)
            continue
        if o.name not in sources and o.name not in hidden:
            nodes.append(dict(o.spec))
            sources[o.name] = "discovery"
    raw = base.model_dump()
    raw["nodes"] = nodes
    if hidden:   # per-node health settings of a removed node would name an unknown node
        raw["health"]["nodes"] = {k: v for k, v in raw["health"]["nodes"].items() if k not in hidden}
    cfg = fleet_from_mapping(raw, source=source, listeners=base.listeners)
    try:
        check_health_config(cfg)
    except ConfigError as exc:
        raise ConfigError(exc.message, source=source, path=exc.path) from exc
    drained = frozenset(o.name for o in [*overrides, *discovered]
                        if o.drained and o.name in sources and (o.source != "discovery" or
                                                                sources[o.name] == "discovery"))
    return Effective(cfg, drained, sources, config_version(cfg))


# ---------------------------------------------------------------------- node operations (pure)

def _replace(rows: Sequence[NodeOverride], new: NodeOverride | None, name: str) -> list[NodeOverride]:
    out = [o for o in rows if o.name != name]
    if new is not None:
        out.append(new)
    return sorted(out, key=lambda o: o.name)


def _find(eff: Effective, name: str) -> NodeConfig:
    for n in eff.cfg.nodes:
        if n.name == name:
            return n
    raise NotFound(f"No node named {name!r} in the fleet", param="name", code="node_not_found")


def add_node(eff: Effective, rows: Sequence[NodeOverride], spec: Mapping[str, Any], *, key_id: str | None,
             at: float) -> tuple[str, list[NodeOverride]]:
    """A new node from ``spec`` (a node entry of the fleet file): (its name, the new overrides).
    400 for an invalid spec (its field as ``param``), a name already in use, a literal ``api_key``
    or an ``api_key_env`` not set on this replica."""
    _no_literal_key(spec)
    try:
        node = NodeConfig.model_validate(dict(spec))
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        msg = "unknown field" if first["type"] == "extra_forbidden" else str(first["msg"])
        raise InvalidRequest(f"invalid node: {param + ': ' if param else ''}{msg}", param=param,
                             code="invalid_node") from None
    why = eff.cfg.url_problem(node.url)
    if why is not None:
        raise InvalidRequest(f"node URL {redact_url(node.url)!r} refused by the network policy: {why}", param="url",
                             code="node_url_refused")
    if any(n.name == node.name for n in eff.cfg.nodes) or any(o.name == node.name for o in rows):
        raise InvalidRequest(f"A node named {node.name!r} already exists", param="name", code="duplicate_node")
    _key_env_set(node)
    row = NodeOverride(node.name, "admin", node.model_dump(), key_id=key_id, updated_at=at)
    return node.name, _replace(rows, row, node.name)


def _not_discovered(eff: Effective, name: str, what: str) -> None:
    if eff.sources.get(name) == "discovery":
        raise Conflict(f"Node {name!r} was discovered (discovery): its orchestrator owns it, so it cannot be "
                       f"{what} here; change the workload or the discovery template instead (draining works)",
                       param="name", code="discovered_node")


def _row_for(eff: Effective, rows: Sequence[NodeOverride], name: str) -> NodeOverride:
    _find(eff, name)
    for o in rows:
        if o.name == name:
            return o
    return NodeOverride(name, "file")


def set_drained(eff: Effective, rows: Sequence[NodeOverride], name: str, drained: bool, *, key_id: str | None,
                at: float) -> list[NodeOverride]:
    """Drain (or undrain) ``name``; 404 for an unknown node."""
    o = _row_for(eff, rows, name)
    new = NodeOverride(name, o.source, o.spec, drained=drained, removed=False, key_id=key_id, updated_at=at)
    if new.source == "file" and not new.spec and not drained:
        return _replace(rows, None, name)     # nothing differs from the file any more
    return _replace(rows, new, name)


def patch_node(eff: Effective, rows: Sequence[NodeOverride], name: str, patch: Mapping[str, Any], *,
               key_id: str | None, at: float) -> list[NodeOverride]:
    """Change the :data:`PATCHABLE` fields of ``name``; 404 unknown node, 400 anything else in ``patch``
    or an invalid value (validated by merging: the caller's :func:`merge_overrides`)."""
    if not patch:
        raise InvalidRequest(f"Nothing to change: send one of {', '.join(PATCHABLE)}", code="empty_patch")
    _no_literal_key(patch)
    for key in patch:
        if key not in PATCHABLE:
            raise InvalidRequest(f"{key!r} cannot be changed on a live node (only {', '.join(PATCHABLE)}); "
                                 f"remove and add the node instead", param=key, code="not_patchable")
    _not_discovered(eff, name, "patched")
    o = _row_for(eff, rows, name)
    spec = {**o.spec, **patch}
    if "api_key_env" in patch:   # the variable replaces a literal key the file may have for this node
        spec["api_key"] = None
    try:
        node = NodeConfig.model_validate({**_find(eff, name).model_dump(), **spec})
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidRequest(f"invalid value: {param + ': ' if param else ''}{first['msg']}", param=param,
                             code="invalid_value") from None
    _key_env_set(node)
    return _replace(rows, NodeOverride(name, o.source, spec, drained=o.drained, key_id=key_id, updated_at=at), name)


def naming_versions(cfg: FleetConfig, name: str) -> list[str]:
    """The keys of the versions whose ``nodes`` list names ``name``: ``models[M].versions[V].nodes``."""
    return [f"models[{m.name}].versions[{v.name}].nodes" for m in cfg.models for v in m.versions
            if v.nodes is not None and name in v.nodes]


def unversioned_warnings(cfg: FleetConfig, name: str) -> list[str]:
    """For node ``name`` of ``cfg``: one line per versioned model it serves whose versions all
    leave it out (each lists other nodes, or has a selector its labels do not match); empty when
    every such model takes it in (or none has versions)."""
    node = next((n for n in cfg.nodes if n.name == name), None)
    if node is None:
        return []
    out: list[str] = []
    for m in cfg.models:
        if m.name not in node.models or not m.versions:
            continue
        if any(name in version_nodes(v, m.name, cfg.nodes) for v in m.versions):
            continue
        how = "; ".join(f"models[{m.name}].versions[{v.name}]" + (f".nodes lists {', '.join(v.nodes)}"
                        if v.nodes is not None else f".selector is {v.selector.describe()}"
                        if v.selector is not None else "")
                        for v in m.versions)
        out.append(f"node {name!r} serves model {m.name!r}, whose versions all leave it out ({how}): it gets "
                   f"no traffic for {m.name!r} until a version lists it (or its selector matches its labels) "
                   f"in the fleet file and the file is reloaded")
    return out


def remove_node(eff: Effective, rows: Sequence[NodeOverride], name: str, *, drained_here: bool, force: bool,
                key_id: str | None, at: float) -> list[NodeOverride]:
    """Remove ``name``: 404 unknown; 409 when it is not drained (on this replica) unless ``force``,
    and always when it is the last node serving one of its models or a version lists it by name
    (``node_in_version``, naming the keys: module docstring)."""
    node = _find(eff, name)
    _not_discovered(eff, name, "removed")
    keys = naming_versions(eff.cfg, name)
    if keys:
        raise Conflict(f"Node {name!r} is named by {', '.join(keys)} in the fleet file: take it out of that list "
                       f"and reload first (POST /admin/reload), then remove it; or drain it "
                       f"(POST /admin/nodes/{name}/drain), which keeps it named but gives it no traffic",
                       param=keys[0], code="node_in_version")
    for model in node.models:
        if not any(model in n.models for n in eff.cfg.nodes if n.name != name):
            raise Conflict(f"{name!r} is the last node serving model {model!r}; add another node first",
                           param="name", code="last_node_of_model")
    if not drained_here and not force:
        raise Conflict(f"Node {name!r} is not drained: drain it first (POST /admin/nodes/{name}/drain) or "
                       f"remove it with ?force=true (requests in flight still finish)", param="name",
                       code="node_not_drained")
    o = _row_for(eff, rows, name)
    if o.source == "admin":
        return _replace(rows, None, name)
    return _replace(rows, NodeOverride(name, "file", {}, drained=True, removed=True, key_id=key_id, updated_at=at),
                    name)


# ---------------------------------------------------------------------- the running fleet

def _new_state(fleet: Fleet, n: NodeConfig, price: float) -> NodeState:
    now, wall = fleet.clock.monotonic(), fleet.clock.time()
    st = NodeState(n, since=now, since_wall=wall, price_per_hour=price, share=Share(wall), state="loading",
                   reason="added: waiting for good probes before it takes traffic")
    object.__setattr__(st, "_owner", fleet)
    return st


def apply_fleet(fleet: Fleet, eff: Effective, evidence: Mapping[str, Any] | None = None) -> list[str]:
    """Reconcile ``fleet`` with ``eff`` (module docstring); returns one line per change. Synchronous:
    nothing else runs on the event loop meanwhile, so routing sees the old fleet or the new one."""
    ev = dict(evidence or {})
    changes: list[str] = []
    fleet.cfg = eff.cfg
    fleet.health = eff.cfg.health
    prices = node_prices(eff.cfg.nodes, eff.cfg.observability.finops)
    wanted = {n.name for n in eff.cfg.nodes}
    for n in eff.cfg.nodes:
        st = fleet.nodes.get(n.name)
        fresh = st is None or st.retired or st.cfg.url != n.url or st.cfg.kind != n.kind
        touched = fresh or st is None or st.cfg != n
        if st is None:
            st = fleet.nodes[n.name] = _new_state(fleet, n, prices[n.name])
            fleet.add_event(NodeEvent(n.name, None, "loading", st.reason, round(fleet.clock.time(), 6),
                                      {**ev, "url": redact_url(n.url), "models": list(n.models)}))
            changes.append(f"added {n.name}")
        elif fresh:
            st.cfg, st.retired, st.held, st.slow_start_at = n, False, False, None
            st.probe_successes = st.probe_failures = 0
            st.samples, st.load = {}, None
            fleet.transition(st, "loading", "a new server at this name: waiting for good probes",
                             {**ev, "url": redact_url(n.url)})
            changes.append(f"replaced {n.name}")
        elif st.cfg != n:
            st.cfg = n
            changes.append(f"changed {n.name}")
        st.price_per_hour = prices[n.name]
        if n.missing_key_env is not None and touched:
            _report_missing_key(fleet, st, n.missing_key_env, ev)
        if fresh and not fleet.health.node(n.name).probe:
            fleet.to_healthy(st, "added; no probe configured for it", ev)
        if n.name in eff.drained and not st.held:
            st.held, st.slow_start_at = True, None
            fleet.transition(st, "draining", "drained by an operator: no new requests; those in flight finish", ev)
            changes.append(f"draining {n.name}")
        elif n.name not in eff.drained and st.held:
            st.held = False
            fleet.to_healthy(st, "undrained by an operator", ev)
            changes.append(f"undrained {n.name}")
    for name, st in list(fleet.nodes.items()):
        if name not in wanted and not st.retired:
            st.retired, st.held, st.slow_start_at = True, True, None
            fleet.transition(st, "draining", "removed from the fleet: no new requests; those in flight finish", ev)
            changes.append(f"removing {name}")
    fleet.reindex()
    settle(fleet)
    return changes


def _report_missing_key(fleet: Fleet, st: NodeState, var: str, ev: Mapping[str, Any]) -> None:
    """A node whose ``api_key_env`` this replica lacks (another replica had it when an operator
    added it): it is served without a key, which the node will likely refuse; say so in the node's
    events and the log (the variable's name only: there is no value)."""
    reason = (f"credential missing: environment variable {var} (api_key_env) is not set on this replica; requests "
              f"and probes go to it without a key until it is set and the replica restarted")
    fleet.add_event(NodeEvent(st.cfg.name, st.state, st.state, reason, round(fleet.clock.time(), 6),
                              {**ev, "api_key_env": var}))
    log.error("node %s: %s", st.cfg.name, reason)


def settle(fleet: Fleet) -> int:
    """Finish what waits for the requests in flight: a drained node with none left → ``drained``,
    a retired node with none left → gone. Returns how many nodes changed. Run on the overrides'
    poll (live/manager.py) and after every change."""
    changed = 0
    gone = False
    for name, st in list(fleet.nodes.items()):
        if st.inflight_requests > 0:
            continue
        if st.retired:
            del fleet.nodes[name]
            fleet.add_event(NodeEvent(name, st.state, "removed", "removed: no request in flight any more",
                                      round(fleet.clock.time(), 6), {}))
            gone = True
            changed += 1
        elif st.held and st.state == "draining":
            fleet.transition(st, "drained", "drained: no request in flight any more")
            changed += 1
    if gone:
        fleet.reindex()
    return changed
