"""The filter stage of an unsampled decision, kept from one decision to the next.

A profile that considers every node (``round-robin``: it must visit each in turn) runs its
filters over the whole pool on every decision, though between two decisions a gateway's pool
differs in a node or two: ``Fleet.views()`` rebuilds only the views of nodes whose state changed
and hands the others back as the same objects. :class:`FilterMemo` keeps the previous pool, its
survivors and its eliminations; the next decision finds the positions whose view is another
object (by halves, with list comparisons: identity first, in C; see :func:`_diff`), runs the
filters on those views alone, and patches
the kept lists where a node's verdict is the same as before (kept again, or eliminated again by
the same filter). Anything else (a verdict that changed, another model or length, more than
:data:`MAX_CHANGED` changed views, a pool where nothing is the same) runs the filters as usual.

Valid only for filters that judge each node by its own view and the request alone, so that the
verdict on a node does not depend on the other nodes (``healthy``, ``serves-model``: see
:data:`PER_VIEW_FILTERS`); ``has-capacity`` looks at every candidate and is not one of them.
The result is the one the filters would give: the same views kept in the same order (the
current views' objects, or for a view rebuilt equal in every field, the earlier equal one), the
same eliminations in the same order (filter by filter, in pool order), the same counts by filter
(in order of first appearance).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from inferlb.routing.plugins import Healthy, ServesModel, healthy_and_serving
from inferlb.routing.selector import NodeSelectorFilter
from inferlb.routing.types import Elimination, NodeView, RouteRequest

__all__ = ["MAX_CHANGED", "MIN_POOL", "PER_VIEW_FILTERS", "FilterMemo", "per_view"]

# The built-in filters whose verdict on a node reads only that node's view and the request.
PER_VIEW_FILTERS: tuple[type, ...] = (Healthy, ServesModel, NodeSelectorFilter)

# Above this many changed views a fresh pass is cheaper than patching them one by one.
MAX_CHANGED = 32
# Below this pool size the filters' own pass costs less than the look-up.
MIN_POOL = 64

_Apply = Callable[[RouteRequest, list[NodeView]], tuple[list[NodeView], list[Elimination]]]


def per_view(apply: _Apply) -> bool:
    """Whether ``apply`` (a filter's bound ``apply``, or :func:`~.plugins.healthy_and_serving`)
    judges each node by its own view alone."""
    return apply is healthy_and_serving or type(getattr(apply, "__self__", None)) in PER_VIEW_FILTERS


class FilterMemo:
    """One router's memo (not thread-safe, as the router is not). See the module docstring."""

    __slots__ = ("_counts", "_elim", "_indexed", "_key", "_kpos", "_live", "_names", "_pool")

    def __init__(self) -> None:
        self._key: tuple[Any, ...] | None = None
        self._pool: list[NodeView] = []
        # The kept views and eliminations handed out: never changed in place once handed out (a
        # patch copies them first), so a decision may keep them.
        self._live: list[NodeView] = []
        self._elim: list[Elimination] = []
        self._counts: dict[str, int] = {}
        self._kpos: list[int] | None = None    # per pool position: index in _live, or -1 - index in _elim
        self._indexed = False                  # _kpos computed for the present _pool
        self._names: list[str] | None = None

    def filter(self, req: RouteRequest, pool: list[NodeView], applies: Sequence[_Apply], key: tuple[Any, ...],
               hint: tuple[list[NodeView], tuple[int, ...]] | None = None
               ) -> tuple[list[NodeView], list[Elimination], dict[str, int]]:
        """``applies`` run over ``pool`` (see the module docstring): the kept views, the
        eliminations (the caller's own list) and the count by filter. ``pool`` must be the
        caller's own copy, never changed afterwards (the memo keeps it); the kept views and the
        counts are the memo's, shared with later decisions: not to be changed. ``key``: what
        else the verdicts depend on (the model, the selector ...).

        ``hint``: the pool maker's ``(earlier, positions)`` (``NodeList.delta``: every position
        where ``pool`` holds another view than the list ``earlier``, both lists never changed).
        When ``earlier`` is the memo's last pool, only those positions are compared, not the
        lists; the same changed positions are found (those whose view is another object and
        not equal), in order, so the result is the one the comparison by halves gives. The
        very pool as last time has no changed position."""
        prev = self._pool
        n = len(pool)
        # The probes: a pool with nothing in common with the last (a fresh snapshot) skips the diff.
        if key == self._key and n == len(prev) and n and (
                pool[0] is prev[0] or pool[n // 2] is prev[n // 2] or pool[-1] is prev[-1]):
            if not self._indexed:   # where each verdict is: only once a pool comes back (not per fresh pass)
                self._kpos, self._indexed = _positions(prev, self._live, self._elim), True
            if self._kpos is not None:
                changed: list[int]
                if pool is prev:
                    changed, same = [], True
                elif hint is not None and hint[0] is prev:
                    changed = sorted({i for i in hint[1] if pool[i] is not prev[i] and pool[i] != prev[i]})
                    same = len(changed) <= MAX_CHANGED
                else:
                    changed = []
                    same = _diff(pool, prev, 0, n, changed)
                if same and (not changed or self._patch(req, pool, prev, changed, applies)):
                    self._pool = pool
                    return self._live, list(self._elim), self._counts
        return self._fresh(req, pool, applies, key)

    def names(self) -> list[str]:
        """The kept views' names, in order: the same list object until the kept nodes change
        (a picker may compare it by identity), never changed in place."""
        names = self._names
        if names is None:
            names = self._names = [v.name for v in self._live]
        return names

    def _patch(self, req: RouteRequest, pool: list[NodeView], prev: list[NodeView], changed: list[int],
               applies: Sequence[_Apply]) -> bool:
        """Patch the kept lists (copies of them) for the views at positions ``changed``; False
        (the memo then half patched: the caller starts afresh) when a verdict is not the same."""
        kpos = self._kpos
        assert kpos is not None
        live: list[NodeView] | None = None
        elim: list[Elimination] | None = None
        for i in changed:
            new, old = pool[i], prev[i]
            if new.name != old.name:
                return False
            kept: list[NodeView] = [new]
            out: list[Elimination] = []
            for apply in applies:
                kept, more = apply(req, kept)
                out.extend(more)
                if not kept:
                    break
            where = kpos[i]
            if where >= 0:
                if out or not kept:
                    return False
                if live is None:
                    live = self._live = list(self._live)
                live[where] = new
            else:
                j = -1 - where
                if kept or len(out) != 1 or out[0].by != self._elim[j].by:
                    return False
                if elim is None:
                    elim = self._elim = list(self._elim)
                elim[j] = out[0]
        return True

    def _fresh(self, req: RouteRequest, pool: list[NodeView], applies: Sequence[_Apply], key: tuple[Any, ...]
               ) -> tuple[list[NodeView], list[Elimination], dict[str, int]]:
        live = pool
        elim: list[Elimination] = []
        for apply in applies:
            if not live:
                break
            live, out = apply(req, live)
            if out:
                elim.extend(out)
        counts: dict[str, int] = {}
        for e in elim:
            by = e.by
            counts[by] = counts.get(by, 0) + 1
        self._key, self._pool, self._live, self._elim, self._counts = key, pool, live, elim, counts
        self._names, self._kpos, self._indexed = None, None, False
        return live, list(elim), counts


def _diff(pool: list[NodeView], prev: list[NodeView], lo: int, hi: int, out: list[int]) -> bool:
    """Append to ``out`` the positions in [lo, hi) whose view in ``pool`` is not the one in
    ``prev``; False as soon as more than :data:`MAX_CHANGED` are found.

    By halves: a list comparison tests each pair by identity first, in C, and stops at the first
    pair that differs, so the halves without a change cost a pointer test per node; where a view
    was rebuilt, the comparison calls its ``__eq__`` once per level. A rebuilt view equal to the
    one before in every field counts as unchanged (the memo keeps the earlier, equal, object):
    the filters would give it the same verdict."""
    if pool[lo:hi] == prev[lo:hi]:
        return True
    if hi - lo <= 8:
        for i in range(lo, hi):
            if pool[i] is not prev[i] and pool[i] != prev[i]:
                out.append(i)
        return len(out) <= MAX_CHANGED
    mid = (lo + hi) // 2
    return _diff(pool, prev, lo, mid, out) and _diff(pool, prev, mid, hi, out)


def _positions(pool: list[NodeView], live: list[NodeView], elim: list[Elimination]) -> list[int] | None:
    """Per pool position, where its verdict is: ``i`` ≥ 0 in ``live``, ``-1 - j`` in ``elim``; None
    when that cannot be told apart (a view twice in the pool, a name eliminated twice)."""
    at = {id(v): i for i, v in enumerate(live)}
    by_name = {e.node: j for j, e in enumerate(elim)}
    if len(at) != len(live) or len(by_name) != len(elim) or len(live) + len(elim) != len(pool):
        return None
    out: list[int] = []
    for v in pool:
        i = at.get(id(v))
        if i is None:
            j = by_name.get(v.name)
            if j is None:
                return None
            out.append(-1 - j)
        else:
            out.append(i)
    return out
