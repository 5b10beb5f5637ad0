"""Learned state shared by a cluster: the workers of ``serve --workers N`` on one host (through the
supervisor's local coordinator) and the replicas on one Redis. Three parts are shared this way: the
learned latency predictor (:class:`PredictorShare`, here), the output-length predictor
(learned/share_length.py) and the reward bandit (learned/share_reward.py).

Mechanism (chosen over "every process trains on every answer", which costs each process the
training of the whole cluster's traffic and lets models that started apart stay apart): **one
trainer, snapshots for the others.** The trainer is the replica the cluster's election
(cluster/election.py, on the database) makes leader. :class:`StateShare` is the mechanism, one
per part (its ``kind``: ``learned``, ``length``, ``reward``), and knows nothing of what it shares:
a small adapter (:class:`Shared`) takes the local outbox of observations, absorbs a follower's,
trains, gives its state and installs a snapshot. It adds no loop of its own: the predictor's is
turned by the feedback loop (learned/loop.py, every ``train_interval_s``), the others by
:class:`SharesLoop` (app.py starts it only in a cluster).

* **A follower** sends the observations its requests queued (the adapter's outbox: bounded, filled
  by one append on the request path) to the trainer instead of learning them: one ``RPUSH`` of a
  batch to ``<prefix>cluster:<kind>:obs`` per turn that has any (none while idle), the list trimmed
  to :data:`MAX_BATCHES` (a cluster without a trainer for long drops the oldest), and a
  ``<kind>-obs`` message on the cluster channel. It installs the newest snapshot when a ``<kind>``
  message announces one (:meth:`StateShare.notify`), at its next turn; it keeps answering with the
  last one installed whatever happens to the trainer.
* **The trainer** drains the list (``LRANGE`` + ``DEL`` in one transaction) when a message says it
  holds something, and at least every ``drain_every_s`` (a message missed while the listener
  reconnected), absorbs the batches and trains them with its own outbox; then, when it learned
  anything (the adapter's :meth:`Shared.mark` changed) and at most every ``publish_every_s``,
  publishes a snapshot (the adapter's state) under a sequence number that one Lua script
  increments, stores (``<prefix>cluster:<kind>:snapshot``) and announces in the same step. Only
  the predictor's trainer retrains from the audit trail and saves to the database (learned/loop.py
  asks :meth:`StateShare.leads`).
* **A replica that starts** takes the stored snapshot (for the predictor: newer than the database's
  row, which the trainer saves less often) when it fits its settings; one that does not fit (other
  params: the operator changed them on some replicas; :class:`IncompatibleState`) is ignored,
  logged once per sequence. A batch sent under other settings (the adapter's :meth:`Shared.fit`)
  is skipped by the trainer.
* **A trainer that dies**: the election makes another replica leader within its lease
  (``INFERLB_CLUSTER_LEADER_LEASE_S``); the new trainer first installs the newest snapshot,
  then drains and trains on from there. Lost: what the old one learned after its last snapshot
  (at most ``publish_every_s`` of observations) and the batches it had drained but not trained.
* **Redis away**: a follower that cannot send learns its own observations, as a lone gateway does
  (logged once); when Redis is back the trainer's next snapshot replaces that state.

Memory is bounded everywhere: the outbox (the adapter's), :data:`MAX_BATCH` observations a batch,
:data:`MAX_BATCHES` batches in Redis, one snapshot. A predictor of the operator's own
(``type: module:attr``) has no saved state: it is not shared, each process learns alone.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from inferlb.background import Periodic
from inferlb.routing.lifecycle import PredictorLifecycle
from inferlb.routing.predictor import Observed
from inferlb.routing.predictor_state import IncompatibleState, restore, state_of
from inferlb.types import Clock

__all__ = ["MAX_BATCH", "MAX_BATCHES", "PUBLISH_LUA", "PredictorShare", "PredictorState", "Shared", "SharesLoop",
           "StateShare", "num"]

log = logging.getLogger(__name__)

#: batches kept for the trainer (one per follower turn with observations): beyond, the oldest are dropped
MAX_BATCHES = 64
#: observations per batch (learned/loop.py trains at most this many per turn)
MAX_BATCH = 2000

#: KEYS[1] the snapshot, KEYS[2] its sequence; ARGV[1] the state JSON, ARGV[2] the channel,
#: ARGV[3] the replica id as JSON, ARGV[4] the message type (the share's kind). Returns the new
#: sequence number.
PUBLISH_LUA = """
local seq = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], seq .. '|' .. ARGV[1])
redis.call('PUBLISH', ARGV[2], '{"t":"' .. ARGV[4] .. '","from":' .. ARGV[3] .. ',"seq":' .. seq .. '}')
return seq
"""


def num(x: Any) -> float | None:
    """``x`` as a finite float, else None (a follower's JSON is checked, never trusted)."""
    return float(x) if isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) else None


class Shared(Protocol):
    """What a :class:`StateShare` shares (an adapter over one learned part). Every method runs on
    the event loop, in a share's turn, never on the request path."""

    #: the Redis keys' and the channel messages' name (``cluster:<kind>:…``, ``{"t": kind}``)
    kind: str
    #: what the log lines start with (``"learned routing"``)
    what: str
    #: what an observation is called in :meth:`StateShare.status` (``answers``: ``answers_sent``)
    noun: str

    def take(self, limit: int) -> list[Any]:
        """Pop at most ``limit`` observations of the local outbox, oldest first."""

    def put_back(self, items: list[Any]) -> None:
        """Return ``items`` (what :meth:`take` gave) to the front of the outbox: sending failed."""

    def encode(self, item: Any) -> Any:
        """One observation as JSON-able data, for a follower's batch."""

    def absorb(self, item: Any) -> bool:
        """One observation of a follower's batch (JSON, checked here); False when it is unusable."""

    def train(self) -> int:
        """Learn what is queued here (the outbox, what was absorbed); returns how many."""

    def mark(self) -> Any:
        """A value that changes when the state learned something; None: nothing worth publishing."""

    def fit(self) -> str | None:
        """The settings a follower's observations must have been made under (None: not checked)."""

    def state(self) -> dict[str, Any] | None:
        """The snapshot to publish (JSON-able); None: nothing can be shared."""

    def install(self, snap: dict[str, Any], *, force: bool) -> bool:
        """Run ``snap`` (another replica's :meth:`state`); False when what runs here is kept
        (``force``: a new trainer or a replica that starts, which may hold a newer state of its
        own). Raises :class:`IncompatibleState` when it does not fit these settings, and
        ``ValueError`` / ``TypeError`` / ``KeyError`` when it is unreadable."""

    def describe(self) -> str:
        """What runs here, for the start-up log line (``"predictor v3 (120 answers learned)"``)."""


class StateShare:
    """See the module docstring. ``redis`` is the cluster's asyncio client, ``key`` makes a key
    from its parts (the cluster's prefix, ``ClusterService.key``), ``channel`` the cluster's
    channel, ``me`` this replica's id, ``leader`` the election's predicate. The cluster listener
    hands this share's two message types (``kind`` and ``<kind>-obs``) to :meth:`notify`."""

    def __init__(self, part: Shared, *, redis: Any, key: Callable[..., str], channel: str, me: str,
                 leader: Callable[[], bool], clock: Clock, publish_every_s: float = 1.0,
                 drain_every_s: float = 5.0) -> None:
        self.part = part
        self.kind = part.kind
        self.redis = redis
        self.channel = channel
        self.me = me
        self.leader = leader
        self.clock = clock
        self.publish_every_s = publish_every_s
        self.drain_every_s = drain_every_s
        k = part.kind
        self._snap_key, self._seq_key, self._obs_key = key(k, "snapshot"), key(k, "seq"), key(k, "obs")
        self._publish = redis.register_script(PUBLISH_LUA)
        self.installed_seq = 0          # the newest snapshot this replica runs (or published)
        self._announced = 0             # the newest a message announced
        self._waiting = False           # a follower said the list holds observations
        self._last_drain = -math.inf
        self._last_publish = -math.inf
        self._published_at: Any = None  # the part's mark when the last snapshot was sent or installed
        self._led = False
        self._ignored_seq = 0
        self._down = False
        # what operators see (status)
        self.sent = self.received = self.installs = self.publishes = self.errors = 0

    @property
    def message_types(self) -> tuple[str, str]:
        """The cluster channel's message types this share takes: a snapshot, a follower's batch."""
        return self.kind, f"{self.kind}-obs"

    # ------------------------------------------------------------------ messages (on the loop)

    def notify(self, msg: dict[str, Any]) -> None:
        """The cluster listener's handler for ``<kind>`` (a snapshot) and ``<kind>-obs``."""
        if msg.get("t") == f"{self.kind}-obs":
            self._waiting = True
        else:
            seq = msg.get("seq")
            if isinstance(seq, int) and not isinstance(seq, bool):
                self._announced = max(self._announced, seq)

    def leads(self) -> bool:
        return bool(self.leader())

    # ------------------------------------------------------------------ one turn

    async def start(self) -> None:
        """Take the stored snapshot (module docstring) before the first turn."""
        await self._install(force=True)
        if self.installs:
            log.info("%s: started from the cluster's %s (snapshot %d)", self.part.what, self.part.describe(),
                     self.installed_seq)

    async def turn(self) -> int:
        """This replica's part of one turn; returns the observations trained here."""
        leads = self.leads()
        if (leads and not self._led) or self._announced > self.installed_seq:
            await self._install(force=leads and not self._led)   # a new trainer starts from the newest
        self._led = leads
        if not leads:
            return await self._send()
        now = self.clock.monotonic()
        if self._waiting or now - self._last_drain >= self.drain_every_s:
            await self._drain(now)
        n = self.part.train()
        await self._maybe_publish(now)
        return n

    async def _send(self) -> int:
        part = self.part
        batch = part.take(MAX_BATCH)
        if not batch:
            return 0
        body: dict[str, Any] = {"from": self.me, "obs": [part.encode(x) for x in batch]}
        fit = part.fit()
        if fit is not None:
            body["fit"] = fit
        payload = json.dumps(body)
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.rpush(self._obs_key, payload)
                pipe.ltrim(self._obs_key, -MAX_BATCHES, -1)
                pipe.publish(self.channel, json.dumps({"t": f"{self.kind}-obs", "from": self.me}))
                await pipe.execute()
        except Exception as exc:    # Redis away (or a bad reply): learn them here, as one gateway does
            part.put_back(batch)
            self._failed(f"sending {part.noun} to the trainer", exc)
            return part.train()
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
            self._failed(f"reading the followers' {self.part.noun}", exc)
            return
        self._up()
        fit = self.part.fit()
        for raw in batches:
            try:
                msg = json.loads(raw)
                rows = msg["obs"]
            except (TypeError, ValueError, KeyError):
                continue
            if fit is not None and msg.get("fit") != fit:
                continue   # made under other settings (the operator changed them on some replicas)
            for item in rows if isinstance(rows, list) else ():
                if self.part.absorb(item):
                    self.received += 1

    async def _maybe_publish(self, now: float) -> None:
        # the mark first: an idle trainer's turns must not copy its state
        mark = self.part.mark()
        if mark is None or mark == self._published_at:
            return
        if now - self._last_publish < self.publish_every_s:
            return
        state = self.part.state()
        if state is None:
            return
        try:
            seq = int(await self._publish(keys=[self._snap_key, self._seq_key],
                                          args=[json.dumps(state), self.channel, json.dumps(self.me), self.kind]))
        except Exception as exc:
            self._failed(f"publishing the {self.kind} snapshot", exc)
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
            self._failed(f"reading the shared {self.kind} snapshot", exc)
            return
        self._up()
        if raw is None:
            return
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        head, _, body = text.partition("|")
        try:
            seq = int(head)
        except ValueError as exc:
            log.warning("%s: the cluster's snapshot is unreadable (%s)", self.part.what, exc)
            return
        if seq <= self.installed_seq and not force:
            return
        try:
            snap = json.loads(body)
            if not isinstance(snap, dict):
                raise TypeError("not an object")
            installed = self.part.install(snap, force=force)
        except IncompatibleState as exc:
            if seq != self._ignored_seq:
                self._ignored_seq = seq
                log.warning("%s: the cluster's snapshot %d does not fit this replica's settings (%s); this "
                            "replica keeps its own", self.part.what, seq, exc)
            self.installed_seq = max(self.installed_seq, seq)
            return
        except (ValueError, TypeError, KeyError) as exc:
            log.warning("%s: the cluster's snapshot is unreadable (%s)", self.part.what, exc)
            return
        self.installed_seq = max(self.installed_seq, seq)
        if installed:
            self._published_at = self.part.mark()
            self.installs += 1

    # ------------------------------------------------------------------ Redis away

    def _failed(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        if not self._down:
            self._down = True
            log.warning("%s: %s failed (%s: %s); this replica learns its own %s until the cluster's Redis "
                        "answers", self.part.what, what, type(exc).__name__, exc, self.part.noun)

    def _up(self) -> None:
        if self._down:
            self._down = False
            log.info("%s: the cluster's Redis answers again; sharing the %s state", self.part.what, self.kind)

    def status(self) -> dict[str, Any]:
        n = self.part.noun
        return {"mode": "trainer" if self.leads() else "follower", "snapshot": self.installed_seq,
                f"{n}_sent": self.sent, f"{n}_received": self.received, "installs": self.installs,
                "publishes": self.publishes, "errors": self.errors}


# ---------------------------------------------------------------------- the latency predictor


class PredictorState:
    """The learned latency predictor as a :class:`Shared` part: the outbox is the lifecycle's
    ``pending`` queue (bounded by ``max_pending``), the state the predictor's saved state
    (routing/predictor_state.py) with the lifecycle's state and reason."""

    kind = "learned"
    what = "learned routing"
    noun = "answers"

    def __init__(self, lifecycle: PredictorLifecycle) -> None:
        self.lc = lifecycle

    def take(self, limit: int) -> list[Any]:
        pending = self.lc.pending
        return [pending.popleft() for _ in range(min(len(pending), limit))]

    def put_back(self, items: list[Any]) -> None:
        self.lc.pending.extendleft(reversed(items))

    def encode(self, item: Any) -> Any:
        row, obs = item
        return [[float(v) for v in row], obs.ttft_s, obs.tpot_s]

    def absorb(self, item: Any) -> bool:
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], list)):
            return False
        obs = Observed(num(item[1]), num(item[2]))
        if obs.ttft_s is None and obs.tpot_s is None:
            return False
        self.lc.observe(item[0], obs)
        return True

    def train(self) -> int:
        return self.lc.train_pending(limit=MAX_BATCH)

    def mark(self) -> Any:
        model = self.lc.model
        mark = (int(getattr(model, "version", 0) or 0), int(getattr(model, "seen", 0) or 0))
        return None if model is None or not mark[1] else mark

    def fit(self) -> str | None:
        return None

    def state(self) -> dict[str, Any] | None:
        state = state_of(self.lc.model)
        if state is None:
            return None
        return {"predictor": state, "state": self.lc.state, "reason": self.lc.reason}

    def install(self, snap: dict[str, Any], *, force: bool) -> bool:
        model = restore(snap["predictor"], self.lc.p)
        mine = state_of(self.lc.model)
        if force and mine is not None and (int(mine["version"]), int(mine["seen"])) > (model.version, model.seen):
            return False   # what runs here is newer (restored from the database)
        self.lc.follow(model, str(snap.get("state")), str(snap.get("reason") or "the cluster's trainer"))
        return True

    def describe(self) -> str:
        return f"predictor v{self.lc.version} ({self.lc.learned} answers learned)"


class PredictorShare(StateShare):
    """The learned latency predictor's :class:`StateShare` (kind ``learned``: the messages
    ``learned`` and ``learned-obs``, the keys ``cluster:learned:*``); ``lc`` is its lifecycle."""

    def __init__(self, lifecycle: PredictorLifecycle, **kw: Any) -> None:
        super().__init__(PredictorState(lifecycle), **kw)
        self.lc = lifecycle


# ---------------------------------------------------------------------- the loop of the others


class SharesLoop:
    """One background loop (:class:`~inferlb.background.Periodic`, every ``interval_s``) that turns
    the shares of the parts the feedback loop does not (the output-length predictor, which exists
    without the learned profile, and the reward bandit). app.py starts it only in a cluster. A
    failing share's turn is logged by the runner; the next turn comes. :meth:`close` stops the loop
    and turns each share once more, so a follower that stops (a drain, a restart) sends what its
    outbox holds rather than take it away with it."""

    def __init__(self, shares: Sequence[StateShare], *, interval_s: float = 1.0) -> None:
        self.shares = list(shares)
        self._timer: Periodic[None] = Periodic("inferlb-learned-shares", self._turn, interval_s=interval_s,
                                               logger=log)

    async def start(self) -> None:
        if not self._timer.started:
            for s in self.shares:
                await s.start()
            self._timer.start()

    async def close(self) -> None:
        if not self._timer.started:
            return
        await self._timer.stop()
        for s in self.shares:
            try:
                await s.turn()
            except Exception as exc:   # at shutdown: one line, and the rest still closes
                log.warning("the last %s share turn failed: %s: %s", s.kind, type(exc).__name__, exc)

    async def _turn(self) -> None:
        for s in self.shares:
            await s.turn()
