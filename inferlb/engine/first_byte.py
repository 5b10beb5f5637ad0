"""How long to wait for a node's first byte: bounded by what that node normally does.

A hung node (accepts, reads, never answers) would otherwise cost every request routed to it the
configured ``first_token_s`` (60 s by default) before the retry. :class:`FirstByteBudget` keeps,
per node, the recent successful first-byte times and derives a tighter wait from them:

* streamed: ``max(floor_s, k × p99 of the node's streamed time to first byte)``;
* non-streamed (the first byte is the whole answer): ``max(floor_s, k × p99 of the node's time per
  output token × the request's output budget)``, where a non-streamed sample's time per token is
  its time to first byte ÷ its completion tokens (prefill included, so the estimate errs long).

Prefill grows with the prompt, so a request whose prompt is longer than the node's median sample
prompt gets the wait scaled up by that ratio (a long prompt is not mistaken for a hang). Either is
capped by the configured wait, and applies only once the node has ``min_samples`` samples of that
kind: a node the gateway knows nothing about gets the configured wait. Pure: the gateway feeds it
successes (``Gateway._learn``) and asks it per attempt; no clock, no I/O.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

__all__ = ["FirstByteBudget", "NodeFirstByte"]


@dataclass
class _Window:
    """The last ``size`` samples and their p99, recomputed every ``every`` samples (not per call)."""

    size: int
    samples: collections.deque[float] = field(default_factory=collections.deque)
    prompts: collections.deque[int] = field(default_factory=collections.deque)
    p99: float | None = None
    prompt_p50: float = 1.0
    _since: int = 0

    def add(self, value: float, prompt_tokens: int, every: int) -> None:
        self.samples.append(value)
        self.prompts.append(prompt_tokens)
        if len(self.samples) > self.size:
            self.samples.popleft()
            self.prompts.popleft()
        self._since += 1
        if self.p99 is None or self._since >= every:
            self._since = 0
            ordered = sorted(self.samples)
            self.p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
            self.prompt_p50 = max(1.0, float(sorted(self.prompts)[len(self.prompts) // 2]))


@dataclass
class NodeFirstByte:
    """One node's samples: streamed time to first byte, and time per output token."""

    ttft: _Window
    per_token: _Window


class FirstByteBudget:
    """Per-node first-byte statistics and the wait they allow (see the module doc)."""

    def __init__(self, *, k: float = 4.0, floor_s: float = 1.0, min_samples: int = 20, window: int = 200,
                 refresh_every: int = 16) -> None:
        self.k = k
        self.floor_s = floor_s
        self.min_samples = min_samples
        self.window = window
        self.refresh_every = refresh_every
        self.nodes: dict[str, NodeFirstByte] = {}

    def _node(self, node: str) -> NodeFirstByte:
        st = self.nodes.get(node)
        if st is None:
            st = self.nodes[node] = NodeFirstByte(_Window(self.window), _Window(self.window))
        return st

    def observe(self, node: str, *, stream: bool, ttfb_s: float, completion_tokens: int,
                prompt_tokens: int = 0) -> None:
        """A successful attempt: its time to first byte, its prompt tokens and, non-streamed, its
        completion tokens."""
        if not math.isfinite(ttfb_s) or ttfb_s < 0:
            return
        st = self._node(node)
        if stream:
            st.ttft.add(ttfb_s, prompt_tokens, self.refresh_every)
        elif completion_tokens > 0:
            st.per_token.add(ttfb_s / completion_tokens, prompt_tokens, self.refresh_every)

    def wait_s(self, node: str, *, stream: bool, output_tokens: int, configured_s: float,
               prompt_tokens: int = 0, floor_s: float | None = None) -> float:
        """The first-byte wait for an attempt on ``node``: never more than ``configured_s``, never
        less than ``floor_s`` (default: the budget's own)."""
        st = self.nodes.get(node)
        if st is None:
            return configured_s
        win = st.ttft if stream else st.per_token
        if win.p99 is None or len(win.samples) < self.min_samples:
            return configured_s
        expected = win.p99 if stream else win.p99 * max(1, output_tokens)
        expected *= max(1.0, prompt_tokens / win.prompt_p50)
        return min(configured_s, max(self.floor_s if floor_s is None else floor_s, self.k * expected))
