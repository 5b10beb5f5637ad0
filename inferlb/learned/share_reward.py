"""The reward bandit (routing/reward.py) shared by a cluster: one trainer, snapshots for the others
(learned/share.py says how; this module is the adapter).

The bandit is the ``reward`` of the router in force (``state.gateway.rt.router.reward``; a reload
may replace the router, and the bandit with it when ``routing.reward`` changed), so
:class:`RewardState` asks ``bandit_of()`` for it at every turn. Its share is turned by
:class:`~inferlb.learned.share.SharesLoop` (app.py: only in a cluster, with the learned profile
wired). Contract:

* the bandit in force gets the share's **outbox** (a deque of :data:`MAX_OUTBOX` ``(arm, cost, x)``
  triples, ``x`` the answer's output tokens; the oldest dropped): a finished request's
  :meth:`RewardBandit.observe` is one append there, on every replica; the trainer **replays** its
  own and the followers' outcomes in the order they came (:meth:`RewardBandit.learn`: the discount
  makes the order matter a little, and the arrival order is the best the trainer knows). A bandit
  that replaced another starts with an empty outbox (the old one's costs were counted under other
  params); until the next turn gives it the outbox it learns its outcomes itself, which the next
  snapshot replaces;
* the snapshot is :meth:`RewardBandit.state` (each arm's ``n``, ``s``, ``ss``, ``observed`` and the
  covariate's sums); a follower's Thompson samples then come from the cluster's evidence, its
  ``pulls`` stay its own choices (so each process still pulls each arm ``min_pulls`` times first). A
  snapshot or batch made under other params (:meth:`RewardBandit.fit`: arms, objective, discount,
  prior, SLOs, failure cost, adjustment) is ignored;
* no bandit in force (a reload turned it off): the turn does nothing but what the mechanism does
  (a trainer's periodic look at the list, whose batches it then cannot use).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from inferlb.learned.share import num
from inferlb.routing.reward import RewardBandit

__all__ = ["MAX_OUTBOX", "RewardState"]

#: outcomes an outbox holds until the next turn (beyond, the oldest are dropped)
MAX_OUTBOX = 10_000


class RewardState:
    """The reward bandit in force as a :class:`~inferlb.learned.share.Shared` part (kind ``reward``:
    the keys ``cluster:reward:*``, the messages ``reward`` and ``reward-obs``)."""

    kind = "reward"
    what = "reward bandit"
    noun = "outcomes"

    def __init__(self, bandit_of: Callable[[], RewardBandit | None], *, max_outbox: int = MAX_OUTBOX) -> None:
        self.bandit_of = bandit_of
        self.outbox: deque[tuple[str, float, float]] = deque(maxlen=max_outbox)
        self._bandit: RewardBandit | None = None
        self.bandit()

    def bandit(self) -> RewardBandit | None:
        """The bandit in force, with the outbox (module docstring)."""
        b = self.bandit_of()
        if b is not self._bandit:
            if self._bandit is not None and self._bandit.outbox is self.outbox:
                self._bandit.outbox = None
            self.outbox.clear()
            self._bandit = b
        if b is not None:
            b.outbox = self.outbox
        return b

    def detach(self) -> None:
        """The bandit learns its outcomes itself again (what waited in the outbox is learned now)."""
        self.train()
        if self._bandit is not None:
            self._bandit.outbox = None

    def take(self, limit: int) -> list[Any]:
        self.bandit()
        box = self.outbox
        return [box.popleft() for _ in range(min(len(box), limit))]

    def put_back(self, items: list[Any]) -> None:
        self.outbox.extendleft(reversed(items))

    def encode(self, item: Any) -> Any:
        return [item[0], item[1], item[2]]

    def absorb(self, item: Any) -> bool:
        b = self._bandit
        if b is None or not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str)):
            return False
        cost, x = num(item[1]), num(item[2])
        return cost is not None and x is not None and b.learn(item[0], cost, x)

    def train(self) -> int:
        b = self.bandit()
        box = self.outbox
        n = 0
        while box:
            arm, cost, x = box.popleft()
            if b is not None and b.learn(arm, cost, x):
                n += 1
        return n

    def mark(self) -> Any:
        b = self._bandit
        return None if b is None else (id(b), b.learned()) if b.learned() else None

    def fit(self) -> str | None:
        b = self.bandit()
        return None if b is None else b.fit()

    def state(self) -> dict[str, Any] | None:
        b = self._bandit
        return None if b is None else b.state()

    def install(self, snap: dict[str, Any], *, force: bool) -> bool:
        b = self.bandit()
        if b is None:
            return False
        b.load(snap)
        return True

    def describe(self) -> str:
        b = self._bandit
        return "reward bandit (none in force)" if b is None else f"reward bandit ({b.learned()} outcomes learned)"
