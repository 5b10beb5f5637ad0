"""The ``versions:`` of a model in the fleet file, and their cross-checks.

A model with versions::

    models:
      - name: llama-8b
        versions:
          - {name: v1, weight: 100, selector: {track: stable}}
          - {name: v2, weight: 0, nodes: [gpu-7], upstream_name: llama-8b-v2,
             node_selector: {gpu_memory_gib: ">= 80"}}

Each version names the nodes that serve it (``nodes``) or a label ``selector`` (every requirement
must hold), or neither (every node that serves the model). ``selector`` takes the node-selector
syntax (routing/selector.py: ``track: stable``, ``gpu_memory_gib: ">= 80"``, ``!= t4``).
``node_selector`` is the version's hardware requirement, joined with the model's ``node_selector``:
the ``node-selector`` filter applies both to the version's nodes per request, so a node that does
not meet it is eliminated with the reason in the audit record (``selector`` decides which nodes
run the version; ``node_selector`` what they must have). The fleet loader checks that some node of
the version meets both, and that every label they compare as a number is a number there.
``upstream_name`` is the model name its nodes know it by (default: the model's ``upstream_name``,
else its name): two versions may share nodes and differ only by it (two LoRA adapters, two tags of
one server).

:func:`version_problems` returns the first problem as ``(key path, message)``, so the fleet loader
(``config/settings.py``) raises one ConfigError naming file, key path and problem. It does not
import the settings module (which imports this one): it reads models and nodes by attribute.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from inferlb.routing.selector import NodeSelector

__all__ = ["VERSION_NAME", "VersionConfig", "version_nodes", "version_problems"]

# Version names reach metric labels, audit rows and an HTTP header: short, no spaces or slashes.
VERSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")


class VersionConfig(BaseModel):
    """One version of a model: its share of traffic and the nodes that serve it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    weight: float = Field(1.0, ge=0)
    nodes: list[str] | None = None                 # node names, or
    selector: NodeSelector | None = None           # node labels that must all match (which nodes run it)
    upstream_name: str | None = None               # the name the nodes know this version by
    node_selector: NodeSelector | None = None      # what its nodes must have (joined with the model's)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not VERSION_NAME.fullmatch(v):
            raise ValueError(f"version name {v!r}: 1-64 characters of letters, digits and _ . : - "
                             "(starting with a letter or digit)")
        return v

    @field_validator("weight")
    @classmethod
    def _weight(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("weight must be a finite number >= 0")
        return v


def version_nodes(version: VersionConfig, model: str, nodes: Sequence[Any]) -> list[str]:
    """The names of the nodes that serve ``version`` of ``model``, in fleet order: those named
    (that serve the model), those whose labels match the selector, or every node of the model."""
    serving = [n for n in nodes if model in n.models]
    if version.nodes is not None:
        wanted = set(version.nodes)
        return [n.name for n in serving if n.name in wanted]
    if version.selector is not None:
        sel = version.selector
        return [n.name for n in serving if sel.matches(n.labels)]
    return [n.name for n in serving]


def version_problems(models: Sequence[Any], nodes: Sequence[Any]) -> tuple[str, str] | None:
    """The first problem with the models' versions as ``(key path, message)``, or None.

    Checked: unique names per model; ``nodes`` and ``selector`` not both given; every named node
    exists and serves the model; a selector matches at least one node of the model; the weights
    of a model's versions add up to a positive number.
    """
    by_name = {n.name: n for n in nodes}
    for i, m in enumerate(models):
        versions: list[VersionConfig] = list(getattr(m, "versions", None) or [])
        if not versions:
            continue
        seen: dict[str, int] = {}
        for j, v in enumerate(versions):
            path = f"models[{i}].versions[{j}]"
            if v.name in seen:
                return f"{path}.name", f"duplicate version name {v.name!r} (also models[{i}].versions[{seen[v.name]}])"
            seen[v.name] = j
            if v.nodes is not None and v.selector is not None:
                return path, "give either nodes or selector, not both"
            if v.nodes is not None:
                if not v.nodes:
                    return f"{path}.nodes", "an empty node list serves nothing (omit it for every node of the model)"
                for k, name in enumerate(v.nodes):
                    node = by_name.get(name)
                    if node is None:
                        return f"{path}.nodes[{k}]", f"unknown node {name!r}"
                    if m.name not in node.models:
                        return f"{path}.nodes[{k}]", f"node {name!r} does not serve model {m.name!r}"
            elif not version_nodes(v, m.name, nodes):
                what = f"selector {v.selector.describe()}" if v.selector is not None else "the model"
                return path, f"no node of model {m.name!r} matches {what}"
        total = sum(v.weight for v in versions)
        if not total > 0:
            return f"models[{i}].versions", f"the weights of model {m.name!r}'s versions add up to {total:g}: " \
                                           "they must add up to a positive number"
    return None
