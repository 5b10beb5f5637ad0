"""The output-length predictor (routing/length.py) shared by a cluster: one trainer, snapshots for
the others (learned/share.py says how; this module is the adapter).

The predictor exists without the learned profile (``routing.output_length``, on by default), so its
share is turned by :class:`~inferlb.learned.share.SharesLoop`, which app.py starts only in a
cluster. Contract of :class:`LengthState`:

* it gives the predictor an **outbox** (a deque of :data:`MAX_OUTBOX` observations, the oldest
  dropped): from then on a finished request's :meth:`LengthPredictor.observe` is one append there,
  on every replica, the trainer included; the share's turn learns the trainer's own and the
  followers' (:meth:`LengthPredictor.learn`), or sends a follower's to the trainer. The outbox is
  taken off again by :meth:`LengthState.detach` (the app's shutdown), so a predictor never waits
  for a loop that stopped;
* an observation travels as ``[model, endpoint, tenant, prompt_tokens, tokens, estimate]``, the
  estimate as ``[p50, p90, mean, budget, level, samples]`` or None, so the trainer's calibration
  counts every replica's estimates;
* the snapshot is :meth:`LengthPredictor.state` (the non-empty bins of the histograms kept, the
  calibration, the count learned); a follower installs it whole, so its estimates, ``/admin/fleet``
  summary and ``inferlb_routing_output_length_learned`` are the trainer's. A snapshot or a batch
  made under another ``window`` or other ``bands`` is ignored (:meth:`LengthState.fit`).
* A follower's estimates lag its own answers by about three turns (its send, the trainer's learn
  and publish, its install: up to 6 s with app.py's 2 s turns), on top of the eight answers each
  histogram's statistics lag anyway.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from inferlb.routing.length import LengthEstimate, LengthObservation, LengthPredictor

__all__ = ["MAX_OUTBOX", "LengthState"]

#: observations an outbox holds until the next turn (beyond, the oldest are dropped)
MAX_OUTBOX = 10_000


def _int(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x >= 0 else None


class LengthState:
    """The output-length predictor as a :class:`~inferlb.learned.share.Shared` part (kind
    ``length``: the keys ``cluster:length:*``, the messages ``length`` and ``length-obs``)."""

    kind = "length"
    what = "output-length prediction"
    noun = "answers"

    def __init__(self, lengths: LengthPredictor, *, max_outbox: int = MAX_OUTBOX) -> None:
        self.lp = lengths
        self.outbox: deque[LengthObservation] = deque(maxlen=max_outbox)
        lengths.outbox = self.outbox

    def detach(self) -> None:
        """The predictor learns its answers itself again (what waited in the outbox is learned now)."""
        self.train()
        self.lp.outbox = None

    def take(self, limit: int) -> list[Any]:
        box = self.outbox
        return [box.popleft() for _ in range(min(len(box), limit))]

    def put_back(self, items: list[Any]) -> None:
        self.outbox.extendleft(reversed(items))

    def encode(self, item: Any) -> Any:
        model, endpoint, tenant, prompt, tokens, est = item
        e = None if est is None else [est.p50, est.p90, est.mean, est.budget, est.level, est.samples]
        return [model, endpoint, tenant, prompt, tokens, e]

    def absorb(self, item: Any) -> bool:
        if not (isinstance(item, list) and len(item) == 6):
            return False
        model, endpoint, tenant, prompt, tokens, e = item
        if not (isinstance(model, str) and isinstance(endpoint, str) and (tenant is None or isinstance(tenant, str))):
            return False
        prompt, tokens = _int(prompt), _int(tokens)
        if prompt is None or tokens is None:
            return False
        est = None
        if isinstance(e, list) and len(e) == 6 and isinstance(e[4], str):
            nums = [_int(v) for v in (e[0], e[1], e[2], e[3], e[5])]
            if all(v is not None for v in nums):
                p50, p90, mean, budget, samples = (int(v or 0) for v in nums)
                est = LengthEstimate(p50, p90, mean, budget, e[4], samples)
        self.lp.learn(model, prompt_tokens=prompt, tokens=tokens, tenant=tenant, endpoint=endpoint, estimate=est)
        return True

    def train(self) -> int:
        box, lp = self.outbox, self.lp
        n = 0
        while box:
            model, endpoint, tenant, prompt, tokens, est = box.popleft()
            lp.learn(model, prompt_tokens=prompt, tokens=tokens, tenant=tenant, endpoint=endpoint, estimate=est)
            n += 1
        return n

    def mark(self) -> Any:
        return self.lp.learned or None

    def fit(self) -> str | None:
        return f"window={self.lp.window};bands={','.join(str(b) for b in self.lp.bands)}"

    def state(self) -> dict[str, Any] | None:
        return self.lp.state()

    def install(self, snap: dict[str, Any], *, force: bool) -> bool:
        self.lp.load(snap)
        return True

    def describe(self) -> str:
        return f"output-length predictor ({self.lp.learned} answers learned, {self.lp.kept()} keys)"
