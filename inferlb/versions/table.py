"""The runtime version table: each model's versions, their nodes and their current weights.

Contract:

* Built from the fleet config (:meth:`VersionTable.from_fleet`); the weights are the file's until
  a rollout sets its own (:meth:`VersionTable.set_weights`, an *override*), and go back to the
  file's when the override is cleared (:meth:`VersionTable.clear_weights`).
* Every change builds a new immutable :class:`ModelVersions` and swaps it in with one dict
  assignment: a request reads one consistent snapshot, never half of an update.
* :meth:`VersionTable.swap_config` rebuilds the table from a new fleet config (a fleet reload):
  node sets and file weights are the new ones; overrides of versions that still exist stay.
* Models without ``versions:`` have no entry: requests for them carry the model's static
  ``version`` label (or none) and route over every node of the model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferlb.config.versions import VersionConfig, version_nodes
from inferlb.routing.selector import all_of
from inferlb.routing.types import LabelSelector
from inferlb.versions.assign import choose, sticky_key

__all__ = ["ModelVersions", "Version", "VersionTable"]


@dataclass(frozen=True, slots=True)
class Version:
    """One version as routing and dispatch use it. ``selector``: the node labels a request for it
    requires, the model's ``node_selector`` and the version's joined (None: any node)."""

    model: str
    name: str
    weight: float
    nodes: frozenset[str]
    upstream_name: str | None = None
    selector: LabelSelector | None = None


@dataclass(frozen=True, slots=True)
class ModelVersions:
    """A model's versions in configured order, with the weights in force."""

    model: str
    versions: tuple[Version, ...]
    overridden: bool = False

    def get(self, name: str) -> Version | None:
        for v in self.versions:
            if v.name == name:
                return v
        return None

    @property
    def names(self) -> list[str]:
        return [v.name for v in self.versions]

    def assign(self, key: bytes) -> Version:
        """The version ``key`` is assigned to (see :mod:`.assign`)."""
        name = choose([(v.name, v.weight) for v in self.versions], key)
        v = self.get(name) if name is not None else None
        return v if v is not None else self.versions[0]

    def alternatives(self, name: str) -> list[Version]:
        """The other versions that take traffic, heaviest first: where a request goes when no node
        of its version can serve it."""
        return sorted((v for v in self.versions if v.name != name and v.weight > 0), key=lambda v: -v.weight)

    def shares(self) -> dict[str, float]:
        total = sum(v.weight for v in self.versions) or 1.0
        return {v.name: v.weight / total for v in self.versions}


def _build(model: Any, nodes: Sequence[Any], weights: Mapping[str, float] | None) -> ModelVersions:
    cfgs: list[VersionConfig] = list(model.versions)
    out = []
    for vc in cfgs:
        w = vc.weight if weights is None else weights.get(vc.name, 0.0)
        out.append(Version(model=model.name, name=vc.name, weight=float(w),
                           nodes=frozenset(version_nodes(vc, model.name, nodes)),
                           upstream_name=vc.upstream_name or model.upstream_name,
                           selector=all_of(getattr(model, "node_selector", None), vc.node_selector)))
    return ModelVersions(model.name, tuple(out), overridden=weights is not None)


class VersionTable:
    """Each versioned model's :class:`ModelVersions`; see the module docstring."""

    def __init__(self, models: Sequence[Any], nodes: Sequence[Any]) -> None:
        self._cfg_models = {m.name: m for m in models if getattr(m, "versions", None)}
        self._nodes = list(nodes)
        self._overrides: dict[str, dict[str, float]] = {}
        self._table: dict[str, ModelVersions] = {}
        self._rebuild()

    @classmethod
    def from_fleet(cls, cfg: Any) -> VersionTable:
        return cls(cfg.models, cfg.nodes)

    def _rebuild(self) -> None:
        self._table = {name: _build(m, self._nodes, self._overrides.get(name))
                       for name, m in self._cfg_models.items()}

    def swap_config(self, cfg: Any) -> None:
        """A new fleet config: new node sets and file weights; overrides of versions that still
        exist are kept (a model that lost its versions loses its override)."""
        self._cfg_models = {m.name: m for m in cfg.models if getattr(m, "versions", None)}
        self._nodes = list(cfg.nodes)
        kept: dict[str, dict[str, float]] = {}
        for model, weights in self._overrides.items():
            m = self._cfg_models.get(model)
            if m is None:
                continue
            names = {v.name for v in m.versions}
            w = {k: x for k, x in weights.items() if k in names}
            if sum(w.values()) > 0:
                kept[model] = w
        self._overrides = kept
        self._rebuild()

    # -- reading -----------------------------------------------------------------------------------

    def get(self, model: str) -> ModelVersions | None:
        return self._table.get(model)

    def models(self) -> list[str]:
        return list(self._table)

    def file_weights(self, model: str) -> dict[str, float]:
        m = self._cfg_models.get(model)
        return {v.name: v.weight for v in m.versions} if m is not None else {}

    def assign(self, model: str, tenant: str | None, user: str | None, request_id: str) -> Version | None:
        """The version of ``model`` a request gets: sticky on (model, tenant, user) when the request
        names a user or session, else drawn per request (keyed by its id). None: not versioned."""
        mv = self._table.get(model)
        if mv is None:
            return None
        return mv.assign(sticky_key(model, tenant, user if user else "\x01request:" + request_id))

    def describe(self) -> list[dict[str, Any]]:
        """Each versioned model: versions, weights in force, traffic shares, nodes (JSON)."""
        out = []
        for name, mv in self._table.items():
            shares = mv.shares()
            out.append({"model": name, "overridden": mv.overridden, "file_weights": self.file_weights(name),
                        "versions": [{"name": v.name, "weight": v.weight, "share": round(shares[v.name], 6),
                                      "nodes": sorted(v.nodes), "upstream_name": v.upstream_name}
                                     for v in mv.versions]})
        return out

    # -- changing ----------------------------------------------------------------------------------

    def set_weights(self, model: str, weights: Mapping[str, float]) -> None:
        """Override ``model``'s weights (versions not named keep their current weight). ValueError
        for an unversioned model, an unknown version, a negative or non-finite weight, or weights
        that would add up to 0; nothing changes then."""
        mv = self._table.get(model)
        if mv is None:
            raise ValueError(f"model {model!r} has no versions")
        new = {v.name: v.weight for v in mv.versions}
        for name, w in weights.items():
            if name not in new:
                raise ValueError(f"model {model!r} has no version {name!r} (versions: {', '.join(new)})")
            if not math.isfinite(w) or w < 0:
                raise ValueError(f"weight of {name!r} must be a finite number >= 0, got {w}")
            new[name] = float(w)
        if not sum(new.values()) > 0:
            raise ValueError(f"the weights of model {model!r} would add up to 0")
        self._overrides[model] = new
        self._table = {**self._table, model: _build(self._cfg_models[model], self._nodes, new)}

    def clear_weights(self, model: str) -> None:
        """Back to the file's weights for ``model``."""
        if self._overrides.pop(model, None) is not None:
            self._table = {**self._table, model: _build(self._cfg_models[model], self._nodes, None)}
