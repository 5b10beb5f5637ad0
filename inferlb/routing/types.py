"""Routing vocabulary: what the decision core reads and returns. No I/O, no project imports.

The core sees the fleet only through :class:`NodeView` snapshots and a :class:`RouteRequest`;
it returns a :class:`Decision` whose ``to_json()`` goes into the audit record verbatim.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar, Protocol, TypeVar

__all__ = ["Decision", "Elimination", "Filter", "LabelSelector", "NodeList", "NodeView", "Picker", "RouteRequest",
           "Scorer"]

# Bounds of Decision.to_json (the routing part of one audit record), whatever the fleet's size.
JSON_NAMES = 16        # candidate names listed
JSON_ELIMINATED = 6    # eliminations listed one by one (all are counted by filter)
JSON_RANKED = 8        # ranked names listed
JSON_SCORED = 4        # nodes whose per-scorer scores are listed (the best ranked)


_T = TypeVar("_T")


def _quick_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass a cheaper ``__init__``: the same signature, defaults and
    result as the generated one (the same class, the same slot values).

    The generated one goes through ``object.__setattr__`` per field; a slot's own descriptor
    (``member.__set__``) costs about half that, but is still a call through a tuple of arguments
    per field (~650 instructions each: ~14,000 for NodeView's 19 fields and its memo slot, more
    than the rest of a DES view's rebuild; a DES run builds ~2 node views and one request per
    routed request, the gateway one view per changed node). So the instance is filled as an
    instance of a private *twin* class: the same base and the same ``__slots__`` (so the same
    layout, which is what lets CPython assign ``__class__`` between the two), without the frozen
    ``__setattr__``, where each field is one plain slot store; then it is given its own class
    back. Nothing else sees it in between (it is not yet returned to anyone). An instance of a
    subclass (whose layout may differ) is filled through the descriptors instead. Written as
    source, as :mod:`dataclasses` writes its own, so the call binds arguments natively.

    Also ``cls.build``: the same parameters, the same new instance, for a caller that passes
    keywords (the DES's node views and requests): a class call hands ``__init__`` its keywords
    as a dict (built, then taken apart: about half a NodeView's construction), a function call
    binds them natively; and ``build`` fills a new instance of the twin directly (one class
    assignment, not two). The class declares ``build: ClassVar[type[Self]]`` so that a type
    checker checks its calls as the class's own."""
    names = [f.name for f in fields(cls)]   # type: ignore[arg-type]
    env: dict[str, Any] = {f"_set_{n}": cls.__dict__[n].__set__ for n in names}
    params = []
    for f in fields(cls):   # type: ignore[arg-type]
        if f.default is MISSING:
            params.append(f.name)
        else:
            env[f"_default_{f.name}"] = f.default
            params.append(f"{f.name}=_default_{f.name}")
    # The slots of a base that are not fields (_RouteMemo's): None, so that they can be read.
    extra = [n for b in cls.__mro__[1:] for n in b.__dict__.get("__slots__", ()) if n not in names]
    for n in extra:
        env[f"_set_{n}"] = getattr(cls, n).__set__
    slow = "".join(f"        _set_{n}(self, {n})\n" for n in names)
    slow += "".join(f"        _set_{n}(self, None)\n" for n in extra)
    fast = "".join(f"    self.{n} = {n}\n" for n in names) + "".join(f"    self.{n} = None\n" for n in extra)
    assert len(cls.__bases__) == 1 and "__dict__" not in cls.__dict__   # slotted: one layout
    env["_cls"] = cls
    env["_twin"] = type(f"_{cls.__name__}Filling", cls.__bases__, {"__slots__": cls.__dict__["__slots__"]})
    env["_set_class"] = object.__dict__["__class__"].__set__   # the frozen __setattr__ refuses even __class__
    code: dict[str, Any] = {}
    exec(f"def __init__(self, {', '.join(params)}):\n"    # our own source: field names
         f"    if self.__class__ is not _cls:\n{slow}        return\n"
         f"    _set_class(self, _twin)\n{fast}"
         f"    self.__class__ = _cls\n"
         f"def build({', '.join(params)}):\n"
         f"    self = _twin()\n{fast}"
         f"    self.__class__ = _cls\n"
         f"    return self\n", env, code)
    build = code["build"]
    build.__qualname__ = f"{cls.__qualname__}.build"
    build.__doc__ = f"``{cls.__name__}(...)``, cheaper to call with keywords (types._quick_init)."
    cls.build = staticmethod(build)   # type: ignore[attr-defined]
    init = code["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)   # as the generated one (string types)
    cls.__init__ = init   # type: ignore[method-assign]
    return cls


def _quick_eq(*first: str) -> Callable[[type[_T]], type[_T]]:
    """Give a dataclass an ``__eq__`` that compares the fields ``first`` (the ones most likely to
    differ) before the rest: the same result as the generated one, which builds the tuple of every
    field of both sides (each compared by identity, then ``==``, in order), but cheaper for two
    views of a node whose in-flight counts changed, the pair that the filter memo
    (routing/memo.py) and ``Fleet`` compare most. Written as source, as :mod:`dataclasses` does."""

    def wrap(cls: type[_T]) -> type[_T]:
        names = [f.name for f in fields(cls)]   # type: ignore[arg-type]
        head = ", ".join(f"self.{n}" for n in first)
        head_o = ", ".join(f"other.{n}" for n in first)
        every = ", ".join(f"self.{n}" for n in names)
        every_o = ", ".join(f"other.{n}" for n in names)
        code: dict[str, Any] = {}
        exec(f"def __eq__(self, other):\n"            # our own source: field names
             f"    if other.__class__ is self.__class__:\n"
             f"        if ({head},) != ({head_o},):\n"
             f"            return False\n"
             f"        return ({every},) == ({every_o},)\n"
             f"    return NotImplemented\n", {}, code)
        eq = code["__eq__"]
        eq.__qualname__ = f"{cls.__qualname__}.__eq__"
        cls.__eq__ = eq   # type: ignore[method-assign]
        return cls

    return wrap


class _RouteMemo:
    """NodeView's slots that are not fields, routing's memos of what it computes from a view
    alone, kept with the view since a view never changes (None until computed; set only through
    each slot's own setter, the view being frozen): ``_terms`` (plugins.view_terms) and ``_ctx``,
    the view's own columns of a learned decision's audit context (explain.py ``_ctx``). Not
    dataclass fields: not ``__init__`` parameters, not compared, hashed, shown or pickled
    (``__init__``, ``__setstate__`` and so ``dataclasses.replace`` and ``copy`` start them at None)."""

    __slots__ = ("_ctx", "_terms")
    _ctx: tuple[Any, ...] | None
    _terms: tuple[Any, ...] | None


@_quick_eq("inflight_tokens", "inflight_requests")
@_quick_init
@dataclass(frozen=True, slots=True)
class NodeView(_RouteMemo):
    """A node as routing sees it at one instant.

    ``inflight_*`` are the gateway's own counts; ``waiting`` and ``kv_usage`` come from scraped
    node metrics (None when unknown); ``healthy`` is False while ejected or cooling down.
    ``labels``: the node's labels from the fleet file (sorted pairs; the ``node-selector`` filter
    reads them); ``rtt_ms``: the gateway's EWMA of the node's readiness-probe time (None until a
    probe answered; the ``rtt`` scorer reads it).
    ``lora_running`` / ``lora_waiting`` / ``max_lora``: the LoRA adapters of the requests the node
    is running / has queued and its adapter slots, from vLLM's ``vllm:lora_requests_info`` (empty
    and None when the node does not report it); ``lora_failed``: adapters that failed to load on
    this node and are cooling down (the ``lora-available`` filter and ``lora-affinity`` scorer,
    routing/lora.py, read them).
    """

    name: str
    models: frozenset[str]
    capacity_tokens: int
    max_concurrency: int
    weight: float = 1.0
    inflight_requests: int = 0
    inflight_tokens: int = 0
    waiting: int | None = None
    kv_usage: float | None = None
    healthy: bool = True
    unhealthy_reason: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    tokens_per_s: float | None = None          # learned decode speed (EWMA)
    ttft_s: float | None = None                # recent streamed time to first token (EWMA, seconds)
    rtt_ms: float | None = None                # probe round trip (EWMA), health/isolation.py
    lora_running: frozenset[str] = frozenset()   # vllm:lora_requests_info running_lora_adapters
    lora_waiting: frozenset[str] = frozenset()   # ... waiting_lora_adapters
    max_lora: int | None = None                  # ... max_lora (None: not reported)
    lora_failed: frozenset[str] = frozenset()    # adapters that failed to load here (cooling down)
    # NodeView(...) for keyword callers, cheaper (set by _quick_init; a type checker checks its
    # calls as the class's own)
    build: ClassVar[type[NodeView]]


_dataclass_setstate = NodeView.__setstate__   # type: ignore[attr-defined]


def _setstate(self: NodeView, state: Any) -> None:
    """The dataclass's ``__setstate__`` (pickle, ``copy``), then the memos as ``__init__`` leaves them."""
    _dataclass_setstate(self, state)
    set_terms(self, None)
    set_ctx(self, None)


# The memo slots' own setters (routing/plugins.py view_terms, routing/explain.py _ctx): the view
# is frozen to everyone else.
set_terms: Callable[[NodeView, tuple[Any, ...] | None], None] = _RouteMemo.__dict__["_terms"].__set__
set_ctx: Callable[[NodeView, tuple[Any, ...] | None], None] = _RouteMemo.__dict__["_ctx"].__set__
NodeView.__setstate__ = _setstate   # type: ignore[attr-defined]


class NodeList(list[NodeView]):
    """A list of node views that also carries ``by_model``: model → the views of the nodes
    configured to serve it (same objects, same order). A router may read a model's pool from it
    instead of scanning every node; a plain list works everywhere a NodeList does.

    ``exact``: the maker's promise that every view in ``by_model[m]`` has ``m`` in its
    ``models`` (so the ``serves-model`` filter would drop none of a model's pool, and a router
    may skip it there). False unless said: the gateway's views narrow ``models`` in panic mode.

    ``fixed``: the maker's promise that neither this list nor any list of ``by_model`` is ever
    changed once handed out (the gateway's ``Fleet.views()``: copy on write), so a router's
    decision may keep them as they are instead of copying them. False unless said: the
    discrete-event simulation patches its views in place.

    ``delta``: for some models ``m``, ``(earlier, positions)``: ``earlier`` is the ``by_model[m]``
    list of an earlier NodeList of the same maker, of the same length, and every position where
    ``by_model[m]`` holds another object than ``earlier`` is in ``positions`` (which may hold
    more). Read only when ``fixed`` (neither list ever changes): a router's filter memo then
    finds the changed views without comparing the lists (routing/memo.py). None: no such
    promise (a model without an entry has none either)."""

    __slots__ = ("by_model", "delta", "exact", "fixed")

    def __init__(self, views: list[NodeView], by_model: dict[str, list[NodeView]], exact: bool = False,
                 fixed: bool = False,
                 delta: dict[str, tuple[list[NodeView], tuple[int, ...]]] | None = None) -> None:
        super().__init__(views)
        self.by_model = by_model
        self.exact = exact
        self.fixed = fixed
        self.delta = delta


class LabelSelector(Protocol):
    """Node labels a request requires (see :mod:`.selector`): ``matches`` a node's labels."""

    def matches(self, labels: tuple[tuple[str, str], ...]) -> bool: ...

    def describe(self) -> str: ...


@_quick_init
@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What is being routed: model, token estimate, priority, nodes to avoid; whether the answer
    is streamed and how many seconds are left before its deadline (None: no deadline).

    ``prefix``: chained hashes of the prompt's leading text blocks (:mod:`.prefix`), computed only
    when the router asks for them (``Router.prefix_blocks``); ``session``: a stable 64-bit hash of
    the client's session (``x-session-id`` header, else the body's ``user``), None without one;
    ``selector``: the node labels the model requires (None: any node); ``only``: the nodes of the
    request's model version: when set, no other node is considered (the router's built-in
    ``model-version`` filter, applied to the pool before sampling); ``adapter``: the LoRA adapter
    the request names on the node (config/lora.py; None: the model is no adapter).

    ``kv_hits``: per candidate node, how many of the prompt's leading token blocks its engine holds
    by its KV events (:mod:`.kvindex`), of ``kv_blocks`` full blocks; None when no event-fed index
    applies, and then ``kv_fallback`` says why (no index for the model, no tokenizer, a stale
    stream), None when the model has no KV events at all.
    """

    model: str
    prompt_tokens: int
    output_tokens: int
    priority: str | None = None
    exclude: frozenset[str] = frozenset()
    stream: bool = False
    deadline_s: float | None = None
    prefix: tuple[int, ...] = ()
    session: int | None = None
    selector: LabelSelector | None = None
    only: frozenset[str] | None = None
    adapter: str | None = None
    kv_hits: tuple[tuple[str, int], ...] | None = None
    kv_blocks: int = 0
    kv_fallback: str | None = None
    build: ClassVar[type[RouteRequest]]   # RouteRequest(...) for keyword callers, cheaper (_quick_init)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


_SCALES = tuple(10.0 ** k for k in range(10))   # exact doubles
# 1.5 · 2⁵²: for |y| < 2⁵¹, ``(y + _NEAREST) - _NEAREST`` is the integer nearest to ``y`` (ties
# to even, as ``round(y)``), as a float: the sum lies in [2⁵², 2⁵³), where doubles are the
# integers, so it is rounded there once, and the difference is exact. No call, unlike ``round(y)``.
_NEAREST = 6755399441055744.0


def _round_to(x: float, nd: int) -> float:
    """``round(x, nd)`` for ``0 ≤ nd ≤ 9``, the same float (sign of zero included), cheaper for most values.

    ``round(x, nd)`` converts through a correctly rounded decimal string, which costs more than the
    rest of a decision's audit copy. ``10^nd`` is an exact double; for a finite ``x`` with
    ``|x · 10^nd| < 2⁴⁰`` the product ``y = fl(x · 10^nd)`` is within 2⁻¹³ of the exact one, so
    when ``y`` is within 0.49 of an integer ``r`` (far from a tie) the exact product rounds to
    ``r`` too, and ``r / 10^nd`` (one correctly rounded division of exact operands) is the double
    nearest to the decimal ``r·10^-nd``: what ``round`` returns. ``r`` is found without a call
    (:data:`_NEAREST`; the same integer ``round(y)`` gives). Near a tie, for a zero result (its
    sign) and for anything else, ``round`` itself answers
    (tests/routing/test_routing_differential.py holds them equal)."""
    s = _SCALES[nd]
    y = x * s
    if -1099511627776.0 < y < 1099511627776.0:
        r = (y + 6755399441055744.0) - 6755399441055744.0
        if r and -0.49 < y - r < 0.49:
            return r / s
    return round(x, nd)


def _round_row4(keys: tuple[str, ...], row: Iterable[float]) -> dict[str, float]:
    """``{key: round(x, 4)}`` over ``zip(keys, row)`` (strict): the audit copy's score rows. The
    loop body is :func:`_round_to` at 4 places written out, since a call per score cost about as
    much as the score (tests/routing/test_routing_differential.py holds it equal to ``round``)."""
    vals = row if isinstance(row, (list, tuple)) else list(row)
    if len(vals) != len(keys):
        raise ValueError(f"{len(keys)} score keys for a row of {len(vals)}")
    out: dict[str, float] = {}
    # An index loop: zip(strict=True) parses its keyword on every call, a cost per score row.
    for j in range(len(keys)):
        k = keys[j]
        x = vals[j]
        y = x * 10000.0
        if -1099511627776.0 < y < 1099511627776.0:
            r = (y + 6755399441055744.0) - 6755399441055744.0   # round(y), as a float (_NEAREST)
            if r and -0.49 < y - r < 0.49:
                out[k] = r / 10000.0
                continue
        out[k] = round(x, 4)
    return out


def _json_rows4(keys: tuple[str, ...], cols: list[list[float]], totals: list[float],
                at: list[tuple[str, int]]) -> dict[str, dict[str, float]]:
    """The audit copy's score rows of a few nodes, read from the columns: ``{name: _round_row4(keys,
    (c[i] for c in cols, then totals[i]))}`` for each ``(name, i)`` of ``at``, the same dicts in
    the same order, in one call (a call and a list per row cost about as much as its scores)."""
    if len(keys) != len(cols) + 1:
        raise ValueError(f"{len(keys)} score keys for {len(cols)} score columns and the total")
    out: dict[str, dict[str, float]] = {}
    kc = list(zip(keys[:-1], cols, strict=True))
    last = keys[-1]
    for name, i in at:
        row: dict[str, float] = {}
        for k, c in kc:
            x = c[i]
            y = x * 10000.0
            if -1099511627776.0 < y < 1099511627776.0:
                r = (y + 6755399441055744.0) - 6755399441055744.0   # round(y), as a float (_NEAREST)
                if r and -0.49 < y - r < 0.49:
                    row[k] = r / 10000.0
                    continue
            row[k] = round(x, 4)
        x = totals[i]
        y = x * 10000.0
        if -1099511627776.0 < y < 1099511627776.0 and (r := (y + 6755399441055744.0) - 6755399441055744.0) \
                and -0.49 < y - r < 0.49:
            row[last] = r / 10000.0
        else:
            row[last] = round(x, 4)
        out[name] = row
    return out


class Elimination:
    """Why ``node`` was not a candidate: the filter (``by``) and the reason, in words.

    Immutable by contract, compared and hashed by ``(node, by, reason)``. A filter on the hot path
    may build one with :meth:`later`: the reason is then formatted only when read (the audit copy
    reads the first few; a count by filter needs none)."""

    __slots__ = ("_args", "_fmt", "_reason", "by", "node")

    def __init__(self, node: str, by: str, reason: str) -> None:
        self.node = node
        self.by = by
        self._reason: str | None = reason
        self._fmt: Callable[..., str] | None = None
        self._args: tuple[Any, ...] = ()

    @classmethod
    def later(cls, node: str, by: str, fmt: Callable[..., str], *args: Any) -> Elimination:
        """An elimination whose reason is ``fmt(*args)``, formatted when first read."""
        e = cls.__new__(cls)
        e.node = node
        e.by = by
        e._reason = None
        e._fmt = fmt
        e._args = args
        return e

    @property
    def reason(self) -> str:
        r = self._reason
        if r is None:
            assert self._fmt is not None
            r = self._reason = self._fmt(*self._args)
            self._fmt, self._args = None, ()
        return r

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Elimination)
        return (self.node, self.by, self.reason) == (other.node, other.by, other.reason)

    def __hash__(self) -> int:
        return hash((self.node, self.by, self.reason))

    def __repr__(self) -> str:
        return f"Elimination(node={self.node!r}, by={self.by!r}, reason={self.reason!r})"


# (live views, per-scorer columns or a function computing them, totals; None: no scorer)
_ScoreSource = tuple[list["NodeView"], list[list[float]] | Callable[[], list[list[float]]], list[float] | None]


class Decision:
    """Candidates, eliminations with reasons, per-scorer scores, the ranked pick.

    ``candidates``: the nodes the filters saw (the sample when the router sampled);
    ``offered``: how many nodes routing was offered; ``sampled``: the sample size, None when every
    node was considered; ``counts``: eliminations by filter, nodes skipped for another model
    without being looked at included.

    The router fills ``candidates`` and ``score_rows`` lazily (from the views and score columns it
    already holds, :meth:`_lazy`): they are built when first read, so a caller that reads only the
    pick (the discrete-event simulation) never pays for them. Reading and setting them works as
    for plain attributes.
    """

    __slots__ = ("_cand", "_cand_src", "_keyed", "_live_ranked", "_ranked", "_rows", "_rows_src", "counts",
                 "eliminated", "learned", "offered", "pick_detail", "picker", "profile", "sampled", "score_keys")

    def __init__(self, profile: str, candidates: list[str], eliminated: list[Elimination] | None = None,
                 score_keys: tuple[str, ...] = (), score_rows: dict[str, tuple[float, ...]] | None = None,
                 ranked: list[str] | None = None, picker: str = "", offered: int = 0, sampled: int | None = None,
                 counts: dict[str, int] | None = None, learned: Any = None,
                 pick_detail: dict[str, Any] | None = None) -> None:
        self.profile = profile
        self._cand: list[str] | None = candidates
        self._cand_src: list[NodeView] | None = None
        self.eliminated: list[Elimination] = [] if eliminated is None else eliminated
        self.score_keys = score_keys                                    # scorer type names, then "total"
        self._rows: dict[str, tuple[float, ...]] | None = {} if score_rows is None else score_rows
        self._rows_src: _ScoreSource | None = None
        self._live_ranked: list[str] | None = None
        self._ranked: list[str] | None = [] if ranked is None else ranked
        self._keyed: list[tuple[float, float, str]] | None = None   # see _sampled
        self.picker = picker
        self.offered = offered
        self.sampled = sampled
        self.counts: dict[str, int] = {} if counts is None else counts
        # Set by a profile that learns (routing/learned.py): predictions, propensity, exploration,
        # predictor version or why it fell back; its ``to_json()`` is bounded (routing/explain.py).
        self.learned = learned
        self.pick_detail = pick_detail   # why the picker ranked as it did (small JSON; None: by score)

    @classmethod
    def _lazy(cls, profile: str, nodes: list[NodeView], picker: str, offered: int, sampled: int | None,
              counts: dict[str, int]) -> Decision:
        """A decision whose candidate names are ``nodes``' (read when first needed). ``nodes`` must
        not change afterwards (the router passes lists of its own)."""
        d = cls.__new__(cls)
        d.profile = profile
        d._cand = None
        d._cand_src = nodes
        d.eliminated = []
        d.score_keys = ()
        d._rows = {}
        d._rows_src = None
        d._live_ranked = None
        d._ranked = []
        d._keyed = None
        d.picker = picker
        d.offered = offered
        d.sampled = sampled
        d.counts = counts
        d.learned = None
        d.pick_detail = None
        return d

    @classmethod
    def _sampled(cls, profile: str, nodes: list[NodeView], picker: str, offered: int, counts: dict[str, int],
                 keys: tuple[str, ...], cols: Callable[[], list[list[float]]], totals: list[float],
                 keyed: list[tuple[float, float, str]]) -> Decision:
        """``_lazy(profile, nodes, picker, offered, len(nodes), counts)`` then ``_set_scores(keys,
        nodes, cols, totals)``, in one call: a decision over the sample ``nodes`` in which every
        node was kept and scored (the router's one-pass path). ``keyed``: the ranking as
        max-score's sort keys, ``(-total, draw, name)`` (the list becomes the decision's): sorted
        here, and :attr:`ranked` is their names in that order, built when first read
        (:attr:`pick`, the first name, needs no list of them)."""
        d = cls.__new__(cls)
        d.profile = profile
        d._cand = None
        d._cand_src = nodes
        d.eliminated = []
        d.score_keys = keys
        d._rows = None
        d._rows_src = (nodes, cols, totals)
        d._live_ranked = None
        keyed.sort()
        d._ranked = None
        d._keyed = keyed
        d.picker = picker
        d.offered = offered
        d.sampled = len(nodes)
        d.counts = counts
        d.learned = None
        d.pick_detail = None
        return d

    @property
    def candidates(self) -> list[str]:
        c = self._cand
        if c is None:
            src = self._cand_src
            c = self._cand = [n.name for n in src] if src is not None else []
            self._cand_src = None
        return c

    @candidates.setter
    def candidates(self, value: list[str]) -> None:
        self._cand, self._cand_src = value, None

    @property
    def score_rows(self) -> dict[str, tuple[float, ...]]:
        """Node → its scores, in ``score_keys`` order (the weighted total last)."""
        rows = self._rows
        if rows is None:
            assert self._rows_src is not None
            live, cols, totals = self._score_source(self._rows_src)
            if totals is None:     # no scorer (_set_zero_scores)
                rows = self._rows = {n.name: (0.0,) for n in live}
            else:
                rows = self._rows = {n.name: row for n, row in zip(live, zip(*cols, totals, strict=True),
                                                                    strict=True)}
            self._rows_src = None
        return rows

    @score_rows.setter
    def score_rows(self, value: dict[str, tuple[float, ...]]) -> None:
        self._rows, self._rows_src = value, None

    def _set_scores(self, keys: tuple[str, ...], live: list[NodeView],
                    cols: list[list[float]] | Callable[[], list[list[float]]], totals: list[float]) -> None:
        """Per-scorer columns over ``live`` and the totals; :attr:`score_rows` is built from them
        when read. ``cols`` may be a function that computes them (called once, when first
        read: the totals were computed without them). None of the lists may change afterwards."""
        self.score_keys = keys
        self._rows, self._rows_src = None, (live, cols, totals)

    def _score_source(self, src: _ScoreSource) -> tuple[list[NodeView], list[list[float]], list[float] | None]:
        """``src`` with its columns computed (and kept) when they were left to a function."""
        live, cols, totals = src
        if callable(cols):
            cols = cols()
            self._rows_src = (live, cols, totals)
        return live, cols, totals

    def _set_zero_scores(self, keys: tuple[str, ...], live: list[NodeView], ranked: list[str] | None = None) -> None:
        """No scorer: every node in ``live`` scored, each row ``(0.0,)`` (the total alone).
        ``ranked``: the ranking when it is known to name only nodes of ``live`` (a picker's
        ``rank_views`` contract), set as :attr:`ranked`; the audit copy then needs no look-up.
        None of the lists may change afterwards."""
        self.score_keys = keys
        self._rows, self._rows_src = None, (live, [], None)
        if ranked is not None:
            self.ranked = self._live_ranked = ranked

    @property
    def scores(self) -> dict[str, dict[str, float]]:
        """Per scored node: each scorer's score and the weighted ``total`` (built when read)."""
        keys = self.score_keys
        return {n: dict(zip(keys, row, strict=True)) for n, row in self.score_rows.items()}

    def view_of(self, name: str) -> NodeView | None:
        """The view of node ``name`` among the scored nodes (the decision's, as the router
        handed them over), else among its candidates when they are still views; None when the
        decision holds no view of it (then it never held views, or ``name`` was not scored)."""
        src = self._rows_src
        if src is not None:
            for n in src[0]:
                if n.name == name:
                    return n
        cand = self._cand_src
        if cand is not None:
            for n in cand:
                if n.name == name:
                    return n
        return None

    @property
    def ranked(self) -> list[str]:
        """The node names, best first (the pick, then the fallbacks)."""
        r = self._ranked
        if r is None:
            keyed = self._keyed
            assert keyed is not None
            r = self._ranked = [name for _, _, name in keyed]
            self._keyed = None
        return r

    @ranked.setter
    def ranked(self, value: list[str]) -> None:
        self._ranked, self._keyed = value, None

    @property
    def pick(self) -> str | None:
        r = self._ranked
        if r is None:
            keyed = self._keyed
            assert keyed is not None
            return keyed[0][2] if keyed else None
        return r[0] if r else None

    def _fields(self) -> tuple[Any, ...]:
        return (self.profile, self.candidates, self.eliminated, self.score_keys, self.score_rows, self.ranked,
                self.picker, self.offered, self.sampled, self.counts, self.learned, self.pick_detail)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Decision)
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]   # mutable, like the dataclass it was

    def __repr__(self) -> str:
        names = ("profile", "candidates", "eliminated", "score_keys", "score_rows", "ranked", "picker", "offered",
                 "sampled", "counts", "learned", "pick_detail")
        return "Decision(" + ", ".join(f"{k}={v!r}" for k, v in zip(names, self._fields(), strict=True)) + ")"

    def to_json(self) -> dict[str, Any]:
        """The audit record's routing part, bounded whatever the fleet's size (≈ 2 KB at most with
        node names of ~12 characters): the first :data:`JSON_NAMES` candidates, the first
        :data:`JSON_ELIMINATED` eliminations with their reasons and the count of all of them by
        filter, the first :data:`JSON_RANKED` ranked nodes, and the per-scorer scores of the best
        :data:`JSON_SCORED` (rounded to 4 places). ``*_total`` fields give the full lengths of the cut lists.
        ``pick_detail`` is there only when the picker explained its ranking (the ``affinity``
        picker: which key, which node HRW chose, which nodes were over the load bound)."""
        counts = dict(self.counts)
        if not counts:
            for e in self.eliminated:
                counts[e.by] = counts.get(e.by, 0) + 1
        ranked = self.ranked
        top = ranked[:JSON_SCORED]
        keys = self.score_keys
        scores: dict[str, dict[str, float]] = {}
        if top:
            src = self._rows_src
            if src is not None and src[2] is None and len(top) * 2 < len(src[0]):
                # No scorer: every live node's row is (0.0,); only which of the best few are live
                # (all of them when the ranking is still the one known to name live nodes only).
                if ranked is self._live_ranked:
                    scores = {n: {k: 0.0 for k in keys} for n in top}
                else:
                    live_names = {n.name for n in src[0]}
                    for n in top:
                        if n in live_names:
                            scores[n] = {k: 0.0 for k in keys}
            elif src is not None and len(top) * 2 < len(src[0]):
                # Only the best few rows: read them from the columns, not the whole table.
                live, cols, totals = self._score_source(src)
                assert totals is not None
                # Each name's last place among the live nodes (as a name → row table would hold
                # it): a reversed list of names searched, cheaper than that table for a few names.
                rev = [n.name for n in reversed(live)]
                last = len(rev) - 1
                at: list[tuple[str, int]] = []
                for n in top:
                    # One search per name (``in`` then ``index`` searched twice).
                    try:
                        at.append((n, last - rev.index(n)))
                    except ValueError:
                        continue
                scores = _json_rows4(keys, cols, totals, at)
            else:
                rows = self.score_rows
                for n in top:
                    r = rows.get(n)
                    if r is not None:
                        scores[n] = _round_row4(keys, r)
        cand_src = self._cand_src
        if cand_src is not None:
            cand_total = len(cand_src)
            cand = [n.name for n in cand_src[:JSON_NAMES]]
        else:
            cand_total = len(self.candidates)
            cand = self.candidates[:JSON_NAMES]
        elim = self.eliminated
        out = {
            "profile": self.profile,
            "offered": self.offered or cand_total,
            "sampled": self.sampled,
            "candidates": cand,
            "candidates_total": cand_total,
            "eliminated": [{"node": e.node, "by": e.by, "reason": e.reason} for e in elim[:JSON_ELIMINATED]],
            "eliminated_counts": counts,
            "scores": scores,
            "ranked": ranked[:JSON_RANKED],
            "ranked_total": len(ranked),
            "picker": self.picker,
            "pick": ranked[0] if ranked else None,
        }
        if self.learned is not None:
            out["learned"] = self.learned.to_json()
        if self.pick_detail is not None:
            out["pick_detail"] = self.pick_detail
        return out


class Filter(Protocol):
    """Keeps the nodes that may serve; returns (kept, eliminated-with-reason)."""

    type_name: str

    def apply(self, req: RouteRequest, nodes: list[NodeView]) -> tuple[list[NodeView], list[Elimination]]: ...


class Scorer(Protocol):
    """A score in [0, 1] per node; higher is better. The profile weights scorers.

    A scorer may also define ``score_all(req, nodes) -> list[float]`` (one score per node, in
    order); the router then calls it once per decision instead of ``score`` per node. It must
    agree with ``score`` except where it documents what it reads from the other candidates. The
    list it returns is handed over: the decision keeps it (its score rows are built from it when
    read), so the scorer must not change it afterwards.
    """

    type_name: str

    def score(self, req: RouteRequest, node: NodeView) -> float: ...


class Picker(Protocol):
    """Ranks scored nodes; the first is used, the rest are fallbacks. Randomness from ``rng``.

    A picker that needs the request may also define ``rank_for(req, scored, rng) -> ranked``
    (the router then calls it instead of ``rank``), or ``rank_detail(req, scored, rng) -> (ranked,
    detail)`` (called before either; ``detail``, a small JSON dict or None, is kept as
    :attr:`Decision.pick_detail`). A picker may define ``preselect(req, pool, k)
    -> list[NodeView] | None``: the k candidates to consider on a sampled fleet instead of a random
    draw (None: draw at random); it must be deterministic for a request, pool and k. A picker
    that ranks from the views alone, never reading the scores (``round-robin``), may define
    ``rank_views(nodes, rng) -> ranked`` (names of ``nodes`` only): the router then calls it
    instead of ``rank`` and builds no (node, score) pairs. Such a picker may also define
    ``rank_names(names, rng) -> ranked``, the same from the candidates' names in order (the router
    calls it when its filter memo holds them, routing/memo.py; the list is never changed after).
    """

    type_name: str

    def rank(self, scored: list[tuple[NodeView, float]], rng: Any) -> list[str]: ...
