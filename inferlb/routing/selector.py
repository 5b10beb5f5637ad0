"""Hardware placement: :class:`NodeSelector` (node labels a model requires) and the
``node-selector`` filter that applies it.

A selector is a mapping of label → requirement, reusable wherever something must be placed on
nodes (a model's and a model version's ``node_selector``, a version's ``selector``; a tenant later,
by the same type):

- ``gpu: h100`` (or ``== h100``): the label equals the text;
- ``gpu: "!= t4"``: the label is missing or differs;
- ``gpu_memory_gib: ">= 40"`` (also ``>``, ``<=``, ``<``): the label is a number and compares so;
- ``gpu_memory_gib: 80`` (a YAML number): the label is numerically equal.

Parsed and validated once, at load (a comparison with a non-number is a
:class:`~pydantic.ValidationError` naming the label); matching is pure and runs per request only
for models that have a selector. :func:`all_of` joins a model's and its version's into the one
the request carries (``RouteRequest.selector``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, RootModel, model_validator

from inferlb.routing.types import Elimination, NodeView, RouteRequest

__all__ = ["AllOf", "NodeSelector", "NodeSelectorFilter", "Term", "all_of", "label_number"]

_OPS = (">=", "<=", "!=", "==", ">", "<")   # two-character operators first
_NUMERIC = frozenset({">=", "<=", ">", "<"})


def label_number(value: str) -> float | None:
    """A label's value as a finite number, None when it is not one."""
    try:
        x = float(value)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


@dataclass(frozen=True, slots=True)
class Term:
    """One requirement: ``label op value`` (``number`` set when the comparison is numeric)."""

    label: str
    op: str
    value: str
    number: float | None

    def holds(self, labels: dict[str, str]) -> bool:
        have = labels.get(self.label)
        if self.op == "!=":
            if have is None:
                return True
            if self.number is not None and (x := label_number(have)) is not None:
                return x != self.number
            return have != self.value
        if have is None:
            return False
        if self.number is None:
            return have == self.value
        x = label_number(have)
        if x is None:
            return False
        op = self.op
        return (x >= self.number if op == ">=" else x <= self.number if op == "<=" else
                x > self.number if op == ">" else x < self.number if op == "<" else x == self.number)

    def __str__(self) -> str:
        return f"{self.label}{self.op}{self.value}"


def _term(label: str, raw: Any) -> Term:
    if not label or not isinstance(label, str):
        raise ValueError("a label name must be a non-empty string")
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError(f"{label}: the requirement must be a text or a number, got {type(raw).__name__}")
    if isinstance(raw, int | float):
        if not math.isfinite(float(raw)):
            raise ValueError(f"{label}: the requirement must be a finite number")
        return Term(label, "==", f"{raw:g}", float(raw))
    text = raw.strip()
    op = next((o for o in _OPS if text.startswith(o)), "==")
    value = text[len(op):].strip() if text.startswith(op) else text
    if not value:
        raise ValueError(f"{label}: {raw!r} has no value after {op!r}")
    number = label_number(value)
    if op in _NUMERIC and number is None:
        raise ValueError(f"{label}: {raw!r} compares with {op!r}, which needs a number, not {value!r}")
    if op in ("==", "!=") and number is None:
        return Term(label, op, value, None)
    return Term(label, op, value, number)


class NodeSelector(RootModel[dict[str, Any]]):
    """Node labels required, as ``{label: requirement}`` (see the module docstring); all must hold."""

    _terms: tuple[Term, ...] = PrivateAttr(default=())

    @model_validator(mode="after")
    def _parse(self) -> NodeSelector:
        if not self.root:
            raise ValueError("a node selector needs at least one label requirement")
        self._terms = tuple(_term(k, v) for k, v in self.root.items())
        return self

    @property
    def terms(self) -> tuple[Term, ...]:
        return self._terms

    def matches(self, labels: tuple[tuple[str, str], ...] | dict[str, str]) -> bool:
        have = labels if isinstance(labels, dict) else dict(labels)
        return all(t.holds(have) for t in self._terms)

    def describe(self) -> str:
        return ", ".join(str(t) for t in self._terms)

    def missing(self, labels: dict[str, str]) -> list[str]:
        """The requirements ``labels`` do not meet, as text (for error messages and the audit)."""
        out = []
        for t in self._terms:
            if not t.holds(labels):
                have = labels.get(t.label)
                out.append(f"{t} (has {t.label}={have})" if have is not None else f"{t} (no {t.label})")
        return out


@dataclass(frozen=True, slots=True)
class AllOf:
    """Every one of ``parts`` must hold (a model's selector and its version's)."""

    parts: tuple[NodeSelector, ...]

    def matches(self, labels: tuple[tuple[str, str], ...] | dict[str, str]) -> bool:
        have = labels if isinstance(labels, dict) else dict(labels)
        return all(p.matches(have) for p in self.parts)

    def describe(self) -> str:
        return ", ".join(p.describe() for p in self.parts)

    def missing(self, labels: dict[str, str]) -> list[str]:
        return [m for p in self.parts for m in p.missing(labels)]


def all_of(*selectors: NodeSelector | None) -> NodeSelector | AllOf | None:
    """The selectors given (None ones dropped) as one: None, the only one, or :class:`AllOf`."""
    parts = tuple(s for s in selectors if s is not None)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else AllOf(parts)


class _NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NodeSelectorFilter:
    """Drops nodes whose labels do not meet the request's ``selector`` (the model's
    ``node_selector``); keeps all when the request has none. Reads ``labels``."""

    type_name = "node-selector"
    Params = _NoParams

    def __init__(self, params: _NoParams | None = None) -> None:
        pass

    def apply(self, req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[Elimination]]:
        sel = req.selector
        if sel is None:
            return nodes, []
        kept: list[NodeView] = []
        out: list[Elimination] = []
        for n in nodes:
            if sel.matches(n.labels):
                kept.append(n)
            else:
                out.append(Elimination(n.name, self.type_name, f"labels do not meet {sel.describe()}"))
        return kept, out
