"""The filter memo (routing/memo.py) decides exactly as a fresh filter pass does.

A pool that changes a view or a few between decisions (as ``Fleet.views()`` hands it over: the
other views the same objects), sometimes many, sometimes none, sometimes a fresh snapshot, with
health, reasons, models and names changing; every decision of the routers that keep a memo is
compared, field by field and audit copy byte for byte, with the same router's without its memo,
and (for requests the old core knew: no model version) with the reference core's
(tests/routing/routing_reference.py).
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from inferlb.routing.memo import MIN_POOL
from inferlb.routing.profiles import PROFILES, build_router
from inferlb.routing.selector import NodeSelector
from inferlb.routing.types import NodeList, NodeView, RouteRequest
from tests.routing.routing_reference import ref_router
from tests.routing.test_routing_differential import as_nodelist, random_views, same

CASES = {
    "round-robin": (PROFILES["round-robin"].filters, {}, "round-robin"),
    "round-robin-scored": (("healthy", "serves-model"), {"outstanding-tokens": 1.0}, "round-robin"),
    "least-connections-all": (PROFILES["least-connections"].filters, {"least-requests": 1.0}, "max-score"),
    "serves-then-healthy": (("serves-model", "healthy"), {}, "round-robin"),
}


def _mutate(rng: random.Random, v: NodeView) -> NodeView:
    """Another view of the same node: load, health, reason, models or (rarely) its name changed."""
    kind = rng.random()
    if kind < 0.4:
        return dataclasses.replace(v, inflight_requests=rng.randint(0, 80), inflight_tokens=rng.randint(0, 9000))
    if kind < 0.6:
        healthy = not v.healthy
        return dataclasses.replace(v, healthy=healthy, unhealthy_reason=None if healthy else rng.choice(
            [None, "ejected: 5 failures", "cooling down after a 429 (Retry-After)"]))
    if kind < 0.7 and not v.healthy:
        return dataclasses.replace(v, unhealthy_reason=rng.choice(["ejected: 1", "ejected: 2", None]))
    if kind < 0.8:
        return dataclasses.replace(v, models=rng.choice([frozenset({"m0"}), frozenset({"m1"}),
                                                         frozenset({"m0", "m1"})]))
    if kind < 0.83:
        return dataclasses.replace(v, name=v.name + "x")
    if kind < 0.9:
        return dataclasses.replace(v, labels=rng.choice([(), (("zone", "a"),), (("zone", "b"),)]))
    return dataclasses.replace(v)   # an equal view, another object


@pytest.mark.parametrize("versions", [False, True])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_changing_pool_decides_as_a_fresh_pass(case: str, seed: int, versions: bool) -> None:
    """``versions``: some requests name a model version's nodes (``only``), which the reference
    core predates; those runs are compared with the router without its memo alone."""
    fs, sc, pk = CASES[case]
    new = build_router("custom", filters=list(fs), scorers=sc, picker=pk, seed=seed, sample=0)
    plain = build_router("custom", filters=list(fs), scorers=sc, picker=pk, seed=seed, sample=0)
    plain._memo = None
    ref = ref_router(fs, sc, pk, seed=seed, sample=0, name="custom")
    assert new._memo is not None
    rng = random.Random(seed)
    views = random_views(rng, 150)
    zone_a = NodeSelector({"zone": "a"})
    for step in range(400):
        roll = rng.random()
        if roll < 0.03:
            views = random_views(rng, 150)           # a fresh snapshot
        elif roll < 0.06:
            views = views[:-1]                       # a node gone
        elif roll < 0.15:
            pass                                     # nothing changed
        else:
            views = list(views)
            for _ in range(rng.choice([1, 1, 1, 2, 3, 10, 40])):
                i = rng.randrange(len(views))
                views[i] = _mutate(rng, views[i])
        kind = rng.choice(("list", "nodelist", "exact", "fixed"))   # fixed: the lists are never changed after
        nodes: list[NodeView] = as_nodelist(views, kind != "nodelist", kind == "fixed") \
            if kind != "list" else list(views)
        exclude = frozenset(rng.sample([v.name for v in views], 1)) if rng.random() < 0.05 else frozenset()
        only = frozenset(v.name for v in views[:100]) if versions and rng.random() < 0.1 else None
        req = RouteRequest(model=rng.choice(("m0", "m0", "m0", "m1")), prompt_tokens=100, output_tokens=64,
                           exclude=exclude, only=only, selector=zone_a if rng.random() < 0.1 else None)
        d = new.decide(req, nodes)
        same(d, plain.decide(req, nodes), json_first=step % 2 == 0)   # type: ignore[arg-type]
        if not versions:
            same(d, ref.decide(req, nodes))
    assert new.rng.random() == plain.rng.random()


def test_the_memo_hands_back_the_current_views() -> None:
    """A node whose view changed but not its verdict is a candidate through its *new* view."""
    rng = random.Random(4)
    views = [dataclasses.replace(v, healthy=True, models=frozenset({"m0"})) for v in random_views(rng, MIN_POOL * 2)]
    router = build_router("round-robin", seed=1)
    req = RouteRequest(model="m0", prompt_tokens=10, output_tokens=10)
    router.decide(req, NodeList(views, {"m0": list(views)}, exact=True))
    views[7] = dataclasses.replace(views[7], inflight_requests=99)
    d = router.decide(req, NodeList(views, {"m0": list(views)}, exact=True))
    assert d.view_of(views[7].name) is views[7]


@pytest.mark.parametrize("profile", ["round-robin", "least-connections"])
def test_a_decision_keeps_a_fixed_pool_and_copies_any_other(profile: str) -> None:
    """A pool its maker may change in place (the discrete-event simulation patches its views) is
    copied: the decision and the memo read what the pool held when it was decided. A NodeList
    whose maker promises never to change it (``fixed``, as ``Fleet.views()``) is kept as it is."""
    rng = random.Random(6)
    views = [dataclasses.replace(v, healthy=True, models=frozenset({"m0"})) for v in random_views(rng, MIN_POOL * 2)]
    req = RouteRequest(model="m0", prompt_tokens=10, output_tokens=10)
    router = build_router(profile, seed=1, sample=0)
    pool = list(views)
    mutable = NodeList(list(views), {"m0": pool}, exact=True)
    d = router.decide(req, mutable)
    before = d.to_json()
    pool[3] = dataclasses.replace(pool[3], healthy=False, unhealthy_reason="ejected")   # in place, after
    assert d.to_json() == before and d.view_of(views[3].name) is views[3]
    again = router.decide(req, mutable)    # the memo saw the change: node 3 is out now
    assert again.counts == {"healthy": 1} and views[3].name not in again.ranked
    fixed = NodeList(list(views), {"m0": list(views)}, exact=True, fixed=True)
    kept = build_router(profile, seed=1, sample=0).decide(req, fixed)
    assert kept._cand_src is fixed.by_model["m0"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_pool_that_names_its_changes_decides_as_a_fresh_pass(case: str) -> None:
    """``NodeList.delta`` (as ``Fleet.views()`` hands it over): the memo compares only the
    positions named, when their earlier list is its last pool. Exact hints, hints naming more
    positions than changed (some twice), hints against an older pool (not the memo's last: the
    lists are compared) and the very pool again all decide as the router without its memo."""
    fs, sc, pk = CASES[case]
    new = build_router("custom", filters=list(fs), scorers=sc, picker=pk, seed=2, sample=0)
    plain = build_router("custom", filters=list(fs), scorers=sc, picker=pk, seed=2, sample=0)
    plain._memo = None
    rng = random.Random(9)
    views = random_views(rng, 150)
    nodes = as_nodelist(views, True, True)
    older = nodes
    for step in range(300):
        roll = rng.random()
        prev = nodes
        if roll < 0.1:
            pass                                   # the very pool again
        else:
            pools = {m: list(p) for m, p in prev.by_model.items()}
            changed: dict[str, list[int]] = {m: [] for m in pools}
            top = list(prev)
            for _ in range(rng.choice([1, 1, 2, 3, 40])):
                i = rng.randrange(len(top))
                v = dataclasses.replace(top[i], inflight_requests=rng.randint(0, 80)) if rng.random() < 0.7 \
                    else _mutate(rng, top[i])
                if v.name != top[i].name or v.models != top[i].models:
                    continue                       # a pool's membership stays: only its views change
                for m, p in pools.items():
                    for j, w in enumerate(p):
                        if w is top[i]:
                            p[j] = v
                            changed[m].append(j)
                top[i] = v
            # An older pool, or a copy of this one (nothing differs from it): the memo's last pool
            # is not the hint's earlier list, so the hint says nothing about what changed since.
            base = older if roll > 0.9 else prev
            delta: dict[str, tuple[list[NodeView], tuple[int, ...]]] = {}
            for m, p in pools.items():
                if roll > 0.95:
                    delta[m] = (list(p), ())
                    continue
                pos = [j for j in range(len(p)) if p[j] is not base.by_model[m][j]]
                extra = [rng.randrange(len(p)) for _ in range(rng.choice([0, 0, 2]) if p else 0)]
                delta[m] = (base.by_model[m], tuple(pos + extra + pos[:1]))
            nodes = NodeList(top, pools, exact=True, fixed=True, delta=delta)
            older = prev
        req = RouteRequest(model=rng.choice(("m0", "m0", "m1")), prompt_tokens=100, output_tokens=64)
        same(new.decide(req, nodes), plain.decide(req, nodes), json_first=step % 2 == 0)  # type: ignore[arg-type]


def test_the_memo_trusts_a_pool_that_names_its_changes() -> None:
    """The hint is read, not checked against the lists: a maker that leaves a changed position
    out (breaking ``NodeList.delta``'s promise) gets the earlier verdict for that node."""
    rng = random.Random(5)
    views = [dataclasses.replace(v, healthy=True, models=frozenset({"m0"})) for v in random_views(rng, MIN_POOL * 2)]
    req = RouteRequest(model="m0", prompt_tokens=10, output_tokens=10)
    first = NodeList(views, {"m0": list(views)}, exact=True, fixed=True)
    sick = list(views)
    sick[3] = dataclasses.replace(sick[3], healthy=False, unhealthy_reason="ejected")
    told = NodeList(sick, {"m0": list(sick)}, exact=True, fixed=True, delta={"m0": (first.by_model["m0"], (3,))})
    untold = NodeList(sick, {"m0": list(sick)}, exact=True, fixed=True, delta={"m0": (first.by_model["m0"], ())})
    for nodes, out in ((told, {"healthy": 1}), (untold, {})):
        router = build_router("round-robin", seed=1)
        router.decide(req, first)
        assert router.decide(req, nodes).counts == out
