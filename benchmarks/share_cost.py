"""What sharing learned state costs a gateway process (learned/share.py and its adapters): per
observation on the request path, sent by a follower and received by the trainer, and per snapshot.

``python -m benchmarks.share_cost [--n 2000] [--rounds 5]``

In one process, CPU time (``time.process_time``), for each shared part: the latency predictor
(``learned``, the built-in predictor with its features), the output-length predictor (``length``)
and the reward bandit (``reward``). Redis is a stub that keeps what it is given (no Redis work is
counted: in a cluster that is the coordinator's or the Redis server's), so the figures are the
gateway's own: building and encoding a batch (JSON), decoding and absorbing one (the output-length
predictor and the bandit learn an observation as they absorb it; the latency predictor queues it
and trains it after), publishing and installing a snapshot. Each figure is the best of
``--rounds`` (the least disturbed by other work on the machine). Prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable
from typing import Any

from inferlb.learned.share import PredictorShare, StateShare
from inferlb.learned.share_length import LengthState
from inferlb.learned.share_reward import RewardState
from inferlb.routing.features import features
from inferlb.routing.length import LengthPredictor
from inferlb.routing.lifecycle import LifecycleParams, PredictorLifecycle
from inferlb.routing.predictor import Observed
from inferlb.routing.reward import RewardBandit, RewardParams
from inferlb.routing.types import NodeView, RouteRequest
from inferlb.types import ManualClock

__all__ = ["main"]


class _Pipe:
    def __init__(self, r: _Redis) -> None:
        self.r = r
        self.ops: list[tuple[str, ...]] = []

    async def __aenter__(self) -> _Pipe:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def rpush(self, key: str, v: str) -> None:
        self.ops.append(("rpush", key, v))

    def ltrim(self, *a: object) -> None:
        self.ops.append(("nop",))

    def publish(self, *a: object) -> None:
        self.ops.append(("nop",))

    def lrange(self, key: str, *a: object) -> None:
        self.ops.append(("lrange", key))

    def delete(self, key: str) -> None:
        self.ops.append(("delete", key))

    async def execute(self) -> list[Any]:
        out: list[Any] = []
        for op in self.ops:
            if op[0] == "rpush":
                self.r.lists.setdefault(op[1], []).append(op[2])
                out.append(1)
            elif op[0] == "lrange":
                out.append(list(self.r.lists.get(op[1], [])))
            elif op[0] == "delete":
                out.append(int(self.r.lists.pop(op[1], None) is not None))
            else:
                out.append(None)
        return out


class _Redis:
    """Keeps lists and the snapshot; the publish script stores and numbers it."""

    def __init__(self) -> None:
        self.lists: dict[str, list[str]] = {}
        self.kv: dict[str, str] = {}
        self.seq = 0

    def pipeline(self, transaction: bool = False) -> _Pipe:
        return _Pipe(self)

    def register_script(self, _lua: str) -> Callable[..., Any]:
        async def run(keys: list[str], args: list[str]) -> int:
            self.seq += 1
            self.kv[keys[0]] = f"{self.seq}|{args[0]}"
            return self.seq
        return run

    async def get(self, key: str) -> bytes | None:
        v = self.kv.get(key)
        return None if v is None else v.encode()


def _share(part_or_lc: Any, redis: _Redis, name: str, leads: list[str], clock: ManualClock) -> StateShare:
    kw: dict[str, Any] = dict(redis=redis, key=lambda *p: "b:cluster:" + ":".join(p), channel="b:cluster:events",
                              me=name, leader=lambda: leads[0] == name, clock=clock)
    if isinstance(part_or_lc, PredictorLifecycle):
        return PredictorShare(part_or_lc, **kw)
    return StateShare(part_or_lc, **kw)


def _node(rng: random.Random) -> NodeView:
    fast = rng.random() < 0.5
    inflight = rng.randrange(12)
    return NodeView(name=("fast" if fast else "slow") + str(rng.randrange(3)), models=frozenset({"m"}),
                    capacity_tokens=50_000, max_concurrency=64, inflight_requests=inflight,
                    inflight_tokens=inflight * 400, labels=(("gpu", "h100" if fast else "t4"),))


class Part:
    """One shared part's workload: ``observe(i)`` is what the request path does for request ``i``."""

    def __init__(self, kind: str, n: int) -> None:
        self.kind = kind
        rng = random.Random(7)
        if kind == "learned":
            self.lc = PredictorLifecycle(LifecycleParams(min_samples=20), clock=lambda: 1.0)
            rows = []
            for _ in range(n):
                req = RouteRequest("m", rng.randrange(50, 3000), rng.randrange(10, 500), stream=rng.random() < 0.5)
                node = _node(rng)
                k = 1.0 if node.name.startswith("fast") else 3.0
                rows.append((features(req, node), Observed(0.02 * k * (1 + node.inflight_requests), 0.01 * k)))
            self.rows = rows
        elif kind == "length":
            self.lp = LengthPredictor()
            self.part: Any = LengthState(self.lp)
            self.reqs = [(f"m{rng.randrange(4)}", rng.choice(["chat", "completions"]), f"t{rng.randrange(20)}",
                          rng.randrange(10, 5000), rng.randrange(1, 2000)) for _ in range(n)]
        else:
            self.bandit = RewardBandit(RewardParams(enabled=True))
            self.part = RewardState(lambda: self.bandit)
            self.costs = [rng.random() * 5 for _ in range(n)]
            self.rng = rng

    def subject(self) -> Any:
        return self.lc if self.kind == "learned" else self.part

    def observe_all(self) -> None:
        if self.kind == "learned":
            for row, obs in self.rows:
                self.lc.observe(row, obs)
        elif self.kind == "length":
            lp = self.lp
            for model, ep, tenant, prompt, tokens in self.reqs:
                est = lp.estimate(model, prompt_tokens=prompt, declared=None, default=256, tenant=tenant, endpoint=ep)
                lp.observe(model, prompt_tokens=prompt, tokens=tokens, tenant=tenant, endpoint=ep, estimate=est)
        else:
            b = self.bandit
            for c in self.costs:
                b.observe(b.choose(self.rng), c)


def _cpu(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.process_time()
    out = fn()
    return time.process_time() - t, out


def measure(kind: str, n: int) -> dict[str, float]:
    """One round: a follower serves ``n`` requests and sends them; the trainer receives and
    trains them, publishes; the follower installs."""
    redis, clock, leads = _Redis(), ManualClock(), ["a"]
    trainer, follower = Part(kind, n), Part(kind, n)
    a = _share(trainer.subject(), redis, "a", leads, clock)
    b = _share(follower.subject(), redis, "b", leads, clock)
    out: dict[str, float] = {}
    if kind != "learned":   # the request path: an append (with the share) against learning there
        alone = Part(kind, n)
        if kind == "length":
            alone.lp.outbox = None
        else:
            alone.bandit.outbox = None
        out["observe_alone_us"] = _cpu(alone.observe_all)[0] / n * 1e6
    out["observe_us"] = _cpu(follower.observe_all)[0] / n * 1e6
    run = asyncio.new_event_loop()
    try:
        out["send_us"] = _cpu(lambda: run.run_until_complete(b.turn()))[0] / n * 1e6
        assert b.sent == n, b.sent
        out["receive_us"] = _cpu(lambda: run.run_until_complete(a._drain(clock.monotonic())))[0] / n * 1e6
        assert a.received == n, a.received
        out["train_received_us"] = _cpu(a.part.train)[0] / n * 1e6
        trainer.observe_all()   # the trainer's own requests: trained from its outbox
        out["train_own_us"] = _cpu(a.part.train)[0] / n * 1e6
        a._last_drain = clock.monotonic()
        a.publish_every_s = 0.0
        t_pub, _ = _cpu(lambda: run.run_until_complete(a.turn()))
        assert a.publishes == 1, a.publishes
        out["publish_ms"] = t_pub * 1e3
        out["snapshot_kB"] = len(redis.kv[f"b:cluster:{a.kind}:snapshot"]) / 1000
        b.notify({"t": a.kind, "from": "a", "seq": a.installed_seq})
        t_inst, _ = _cpu(lambda: run.run_until_complete(b.turn()))
        assert b.installs == 1, b.installs
        out["install_ms"] = t_inst * 1e3
        clock.advance(1.0)
        out["idle_turn_us"] = min(_cpu(lambda: run.run_until_complete(b.turn()))[0] for _ in range(50)) * 1e6
    finally:
        run.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000, help="observations a round (one batch)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    cols = ["observe_alone_us", "observe_us", "send_us", "receive_us", "train_received_us", "train_own_us",
            "publish_ms",
            "install_ms", "snapshot_kB", "idle_turn_us"]
    print(f"# n={args.n} observations a round, best of {args.rounds} rounds, CPU (time.process_time)")
    print("| part | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for kind in ("learned", "length", "reward"):
        rounds = [measure(kind, args.n) for _ in range(args.rounds)]
        best = {k: min(r[k] for r in rounds) for k in rounds[0]}
        cells = [f"{best[c]:.2f}" if c in best else "–" for c in cols]
        print(f"| {kind} | " + " | ".join(cells) + " |")
    print(json.dumps({"n": args.n, "rounds": args.rounds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
