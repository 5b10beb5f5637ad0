"""One learned latency predictor for a cluster: the workers of ``serve --workers N`` on one host
(through the supervisor's local coordinator) and the replicas on one Redis.

Mechanism (chosen over "every process trains on every answer", which costs each process the
training of the whole cluster's traffic and lets models that started apart stay apart): **one
trainer, snapshots for the others.** The trainer is the replica the cluster's election
(cluster/election.py, on the database) makes leader; :class:`PredictorShare` is driven by the
feedback loop's turn (learned/loop.py, every ``train_interval_s``), so it adds no loop of its own:

* **A follower** sends the answers its requests queued for training (the lifecycle's
  ``pending``) to the trainer instead of learning them: one ``RPUSH`` of a batch per turn that has
  any (none while idle), the list trimmed to :data:`MAX_BATCHES` (a cluster without a trainer for
  long drops the oldest), and a ``learned-obs`` message on the cluster channel. It installs the
  newest snapshot when a ``learned`` message announces one (:meth:`notify`), at its next turn.
* **The trainer** drains the list (``LRANGE`` + ``DEL`` in one transaction) when a message says
  it holds something, and at least every ``drain_every_s`` (a message missed while the listener
  reconnected), adds the batches to its own queue and trains as one process does; then, when the
  model learned anything and at most every ``publish_every_s``, publishes a snapshot: the
  predictor's state (routing/predictor_state.py) with the lifecycle's state, under a sequence
  number that one Lua script increments, stores (``<prefix>cluster:learned:snapshot``) and
  announces in the same step. Only the trainer retrains from the audit trail and saves to the
  database (learned/loop.py asks :meth:`leads`).
* **A replica that starts** takes the stored snapshot (newer than the database's row, which the
  trainer saves less often) when it fits its settings; one that does not fit (other predictor
  params: the operator changed them on some replicas) is ignored, logged once per sequence.
* **A trainer that dies**: the election makes another replica leader within its lease
  (``INFERLB_CLUSTER_LEADER_LEASE_S``); the new trainer first installs the newest snapshot,
  then drains and trains on from there. Lost: what the old one learned after its last snapshot
  (at most ``publish_every_s`` of answers) and the batches it had drained but not trained.
* **Redis away**: a follower that cannot send learns its own answers, as a lone gateway does
  (logged once); when Redis is back the trainer's next snapshot replaces that model.

A predictor of the operator's own (``type: module:attr``) has no saved state: it is not shared,
each process learns alone. The reward bandit and the output-length predictor are not shared.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any

from inferlb.routing.lifecycle import PredictorLifecycle
from inferlb.routing.predictor import Observed
from inferlb.routing.predictor_state import IncompatibleState, restore, state_of
from inferlb.types import Clock

__all__ = ["MAX_BATCHES", "PUBLISH_LUA", "PredictorShare"]

log = logging.getLogger(__name__)

#: batches kept for the trainer (one per follower turn with answers): beyond, the oldest are dropped
MAX_BATCHES = 64
_MAX_BATCH = 2000     # answers per batch (learned/loop.py trains at most this many per turn)

#: KEYS[1] the snapshot, KEYS[2] its sequence; ARGV[1] the state JSON, ARGV[2] the channel,
#: ARGV[3] the replica id as JSON. Returns the new sequence number.
PUBLISH_LUA = """
local seq = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], seq .. '|' .. ARGV[1])
redis.call('PUBLISH', ARGV[2], '{"t":"learned","from":' .. ARGV[3] .. ',"seq":' .. seq .. '}')
return seq
"""


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


class PredictorShare:
    """See the module docstring. ``redis`` is the cluster's asyncio client, ``key`` makes a key
    from its parts (the cluster's prefix), ``leader`` the election's predicate."""

    def __init__(self, lifecycle: PredictorLifecycle, *, redis: Any, key: Callable[..., str], channel: str,
                 me: str, leader: Callable[[], bool], clock: Clock, publish_every_s: float = 1.0,
                 drain_every_s: float = 5.0) -> None:
        self.lc = lifecycle
        self.redis = redis
        self.channel = channel
        self.me = me
        self.leader = leader
        self.clock = clock
        self.publish_every_s = publish_every_s
        self.drain_every_s = drain_every_s
        self._snap_key, self._seq_key, self._obs_key = key("learned", "snapshot"), key("learned", "seq"), \
            key("learned", "obs")
        self._publish = redis.register_script(PUBLISH_LUA)
        self.installed_seq = 0          # the newest snapshot this replica runs (or published)
        self._announced = 0             # the newest a message announced
        self._waiting = False           # a follower said the list holds answers
        self._last_drain = -math.inf
        self._last_publish = -math.inf
        self._published_at: tuple[int, int] | None = None   # (version, seen) of the last snapshot sent
        self._led = False
        self._ignored_seq = 0
        self._down = False
        # what operators see (learned loop status)
        self.sent = self.received = self.installs = self.publishes = self.errors = 0

    # ------------------------------------------------------------------ messages (on the loop)

    def notify(self, msg: dict[str, Any]) -> None:
        """The cluster listener's handler for ``learned`` (a snapshot) and ``learned-obs``."""
        if msg.get("t") == "learned-obs":
            self._waiting = True
        else:
            seq = msg.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool):
                self._announced = max(self._announced, seq)

    def leads(self) -> bool:
        return bool(self.leader())

    # ------------------------------------------------------------------ one turn of the loop

    async def start(self) -> None:
        """Take the stored snapshot (module docstring) before the first turn."""
        await self._install(force=True)
        if self.installs:
            log.info("learned routing: started from the cluster's predictor v%d (%d answers learned, snapshot %d)",
                     self.lc.version, self.lc.learned, self.installed_seq)

    async def turn(self) -> int:
        """This replica's part of one training turn; returns the answers trained here."""
        leads = self.leads()
        if (leads and not self._led) or self._announced > self.installed_seq:
            await self._install(force=leads and not self._led)   # a new trainer starts from the newest
        self._led = leads
        if not leads:
            return await self._send()
        now = self.clock.monotonic()
        if self._waiting or now - self._last_drain >= self.drain_every_s:
            await self._drain(now)
        n = self.lc.train_pending(limit=_MAX_BATCH)
        await self._maybe_publish(now)
        return n

    async def _send(self) -> int:
        pending = self.lc.pending
        if not pending:
            return 0
        batch = [pending.popleft() for _ in range(min(len(pending), _MAX_BATCH))]
        payload = json.dumps({"from": self.me, "obs": [[[float(v) for v in row], obs.ttft_s, obs.tpot_s]
                                                       for row, obs in batch]})
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.rpush(self._obs_key, payload)
                pipe.ltrim(self._obs_key, -MAX_BATCHES, -1)
                pipe.publish(self.channel, json.dumps({"t": "learned-obs", "from": self.me}))
                await pipe.execute()
        except Exception as exc:    # Redis away (or a bad reply): learn them here, as one gateway does
            pending.extendleft(reversed(batch))
            self._failed("sending answers to the trainer", exc)
            return self.lc.train_pending(limit=_MAX_BATCH)
        self._up()
        self.sent += len(batch)
        return 0

    async def _drain(self, now: float) -> None:
        self._waiting = False
        self._last_drain = now
        try:
            async with self.redis.pipeline(transaction=True) as pipe:
                pipe.lrange(self._obs_key, 0, -1)
                pipe.delete(self._obs_key)
                batches, _ = await pipe.execute()
        except Exception as exc:
            self._failed("reading the followers' answers", exc)
            return
        self._up()
        for raw in batches:
            try:
                msg = json.loads(raw)
                rows = msg["obs"]
            except (TypeError, ValueError, KeyError):
                continue
            for item in rows if isinstance(rows, list) else ():
                if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], list)):
                    continue
                obs = Observed(_num(item[1]), _num(item[2]))
                if obs.ttft_s is None and obs.tpot_s is None:
                    continue
                self.lc.observe(item[0], obs)
                self.received += 1

    async def _maybe_publish(self, now: float) -> None:
        model = self.lc.model
        # (version, seen) first: an idle trainer's turns must not copy the model's matrices
        mark = (int(getattr(model, "version", 0) or 0), int(getattr(model, "seen", 0) or 0))
        if model is None or mark == self._published_at or not mark[1]:
            return
        if now - self._last_publish < self.publish_every_s:
            return
        state = state_of(model)
        if state is None:
            return
        body = json.dumps({"predictor": state, "state": self.lc.state, "reason": self.lc.reason})
        try:
            seq = int(await self._publish(keys=[self._snap_key, self._seq_key],
                                          args=[body, self.channel, json.dumps(self.me)]))
        except Exception as exc:
            self._failed("publishing the predictor", exc)
            return
        self._up()
        self._last_publish = now
        self._published_at = mark
        self.installed_seq = max(self.installed_seq, seq)
        self.publishes += 1

    async def _install(self, *, force: bool) -> None:
        """Install the stored snapshot when it is newer than the one running here (``force``: when
        it is another replica's, whatever the sequence: a new trainer or a replica that starts)."""
        try:
            raw = await self.redis.get(self._snap_key)
        except Exception as exc:
            self._failed("reading the shared predictor", exc)
            return
        self._up()
        if raw is None:
            return
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        head, _, body = text.partition("|")
        try:
            seq = int(head)
            snap = json.loads(body)
            model = restore(snap["predictor"], self.lc.p)
        except IncompatibleState as exc:
            if seq != self._ignored_seq:
                self._ignored_seq = seq
                log.warning("learned routing: the cluster's predictor (snapshot %d) does not fit this replica's "
                            "settings (%s); this replica keeps its own", seq, exc)
            self.installed_seq = max(self.installed_seq, seq)
            return
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("learned routing: the cluster's predictor snapshot is unreadable (%s)", exc)
            return
        if seq <= self.installed_seq and not force:
            return
        mine = state_of(self.lc.model)
        if force and mine is not None and (int(mine["version"]), int(mine["seen"])) > (model.version, model.seen):
            self.installed_seq = max(self.installed_seq, seq)   # what runs here is newer (restored)
            return
        self.lc.follow(model, str(snap.get("state")), str(snap.get("reason") or "the cluster's trainer"))
        self.installed_seq = max(self.installed_seq, seq)
        self._published_at = (model.version, model.seen)
        self.installs += 1

    # ------------------------------------------------------------------ Redis away

    def _failed(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        if not self._down:
            self._down = True
            log.warning("learned routing: %s failed (%s: %s); this replica learns its own answers until the "
                        "cluster's Redis answers", what, type(exc).__name__, exc)

    def _up(self) -> None:
        if self._down:
            self._down = False
            log.info("learned routing: the cluster's Redis answers again; sharing the predictor")

    def status(self) -> dict[str, Any]:
        return {"mode": "trainer" if self.leads() else "follower", "snapshot": self.installed_seq,
                "answers_sent": self.sent, "answers_received": self.received, "installs": self.installs,
                "publishes": self.publishes, "errors": self.errors}
