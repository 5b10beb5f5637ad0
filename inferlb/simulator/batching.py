"""A vLLM-like engine as a pure discrete-event model: continuous batching over a paged KV cache.

Contract: :class:`BatchCore` does no I/O and reads no clock; every call takes ``now`` (monotonic
seconds) and the model moves only inside :meth:`BatchCore.advance`. The HTTP node drives it in real
time (:mod:`.driver`); tests drive it with a :class:`~inferlb.types.ManualClock`.

The scheduler follows vLLM's (V1, without chunked prefill of a single prompt):

- one *step* runs the whole running batch: every running sequence gets one output token at the
  step's end; sequences admitted in the step are prefilled in it (prompt, plus the tokens already
  generated when it is a recomputation after a preemption) and get their first token at its end;
- a step lasts ``step_base_s + step_per_seq_s × batch + step_per_kv_token_s × context tokens +
  prefill_s_per_token × prefilled tokens`` (a prompt's prefix-cache hit, ``Seq.cached_tokens``,
  is not prefilled on its first admission) (× the slow-start factor), steps run back to back while
  there is work, and the next step is composed when the previous one ends;
- the KV cache has ``kv_tokens // block_tokens`` blocks; a sequence holds
  ``ceil((context + 1) / block_tokens)`` of them for the token it computes next;
- at the start of a step every running sequence needs its next slot; when blocks are short, the
  most recently admitted one is preempted (its blocks freed, back to the head of the queue, to be
  recomputed) — or, with ``on_kv_full="oom"``, the node crashes: every sequence fails and the
  engine is down for ``cold_start_s``;
- waiting sequences are admitted first-come first-served (the head blocks the rest) while the
  batch is under ``max_num_seqs``, the step's prefill stays under ``max_batched_tokens`` (one
  prompt always fits) and ``watermark`` of the blocks stays free; nothing is admitted in a step
  that preempted (as vLLM does, to avoid thrashing).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from inferlb.simulator.spec import BatchSpec

__all__ = ["BatchCore", "Seq", "SeqState", "StepReport"]


class SeqState(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    FAILED = "failed"        # lost in an OOM crash


@dataclass(eq=False, slots=True)
class Seq:
    """One request inside the engine; times are the model's (virtual) monotonic seconds."""

    rid: int
    prompt_tokens: int
    output_tokens: int
    arrived_at: float
    generated: int = 0
    blocks: int = 0
    state: SeqState = SeqState.WAITING
    admitted_at: float | None = None          # first admission (queue time ends)
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    cached_tokens: int = 0                    # prompt tokens found in the prefix cache: not prefilled
    # Set by the real-time driver: wake the waiting handler once ``generated >= want``.
    want: int = 0
    waiter: object | None = None

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def done(self) -> bool:
        return self.state in (SeqState.FINISHED, SeqState.ABORTED, SeqState.FAILED)


@dataclass(slots=True)
class StepReport:
    """What :meth:`BatchCore.advance` did: sequences that got tokens, finished, or failed."""

    steps: int = 0
    progressed: list[Seq] = field(default_factory=list)
    failed: list[Seq] = field(default_factory=list)
    crashed_at: float | None = None


@dataclass(slots=True)
class _Step:
    start: float
    end: float
    seqs: list[Seq]


class BatchCore:
    """The engine of one node. ``submit`` / ``abort`` between steps, ``advance(now)`` to run them."""

    def __init__(self, spec: BatchSpec) -> None:
        self.spec = spec
        self.total_blocks = spec.kv_tokens // spec.block_tokens
        self._watermark_blocks = int(spec.watermark * self.total_blocks)
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.used_blocks = 0
        self.down_until = -math.inf
        # The node's slow-start curve: factor ≥ 1 that multiplies step times at time t.
        self.slow_factor_at: Callable[[float], float] | None = None
        self._step: _Step | None = None
        self._pending_start: float | None = None
        self._next_rid = 0
        # Counters (vLLM's names in the node's /metrics).
        self.preemptions_total = 0
        self.oom_crashes_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished_total = 0
        self.busy_s_total = 0.0

    # -- state ---------------------------------------------------------------------------------

    @property
    def kv_usage(self) -> float:
        """Share of KV blocks in use, 0..1 (``vllm:kv_cache_usage_perc``)."""
        return self.used_blocks / self.total_blocks

    def is_down(self, now: float) -> bool:
        return now < self.down_until

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.spec.block_tokens)

    def fits_ever(self, prompt_tokens: int) -> bool:
        """Whether a prompt can be admitted on an empty cache at all."""
        return self.blocks_for(prompt_tokens + 1) <= self.total_blocks - self._watermark_blocks

    def next_event_at(self) -> float | None:
        """When :meth:`advance` next has something to do (``None``: idle until a submit)."""
        if self._step is not None:
            return self._step.end
        return self._pending_start

    # -- requests --------------------------------------------------------------------------------

    def submit(self, prompt_tokens: int, output_tokens: int, now: float, cached_tokens: int = 0) -> Seq:
        """Queue a request; it joins the next step (one starts at ``now`` when the engine is idle).
        ``cached_tokens`` of the prompt are in the prefix cache: its first prefill skips them (a
        recomputation after a preemption prefills everything)."""
        prompt = max(0, prompt_tokens)
        seq = Seq(self._next_rid, prompt, max(1, output_tokens), now,
                  cached_tokens=min(max(0, cached_tokens), max(0, prompt - 1)))
        self._next_rid += 1
        self.waiting.append(seq)
        if self._step is None and self._pending_start is None:
            self._pending_start = now
        return seq

    def abort(self, seq: Seq, now: float) -> None:
        """The client went away: drop the sequence and free its blocks (no-op when done)."""
        if seq.done:
            return
        if seq.state is SeqState.WAITING:
            self.waiting.remove(seq)
        else:
            self.running.remove(seq)
            self._free(seq)
        seq.state = SeqState.ABORTED
        seq.finished_at = now

    def crash(self, now: float, cold_start_s: float) -> list[Seq]:
        """Kill the engine: every sequence fails; nothing runs until ``now + cold_start_s``."""
        lost = [*self.running, *self.waiting]
        for seq in lost:
            seq.state = SeqState.FAILED
            seq.finished_at = now
            seq.blocks = 0
        self.running.clear()
        self.waiting.clear()
        self.used_blocks = 0
        self._step = None
        self._pending_start = None
        self.down_until = now + cold_start_s
        return lost

    # -- time --------------------------------------------------------------------------------------

    def advance(self, now: float) -> StepReport:
        """Run every step that ends by ``now``; steps run back to back while there is work."""
        report = StepReport()
        while True:  # bounded: each pass ends a step or composes one that ends later
            step = self._step
            if step is not None:
                if step.end > now:
                    break
                self._finish(step, report)
                report.steps += 1
                self._step = None
                self._compose(step.end, report)
                continue
            start = self._pending_start
            if start is None or start > now:
                break
            self._pending_start = None
            self._compose(start, report)
            if self._step is None:
                break
        return report

    def _slow(self, t: float) -> float:
        fn = self.slow_factor_at
        return 1.0 if fn is None else fn(t)

    def _free(self, seq: Seq) -> None:
        self.used_blocks -= seq.blocks
        seq.blocks = 0

    def _compose(self, t: float, report: StepReport) -> None:
        spec = self.spec
        preempted = False
        # 1. every running sequence needs the slot of the token it computes next.
        while self.running:
            need = sum(self.blocks_for(s.context + 1) - s.blocks for s in self.running)
            if self.used_blocks + need <= self.total_blocks:
                for s in self.running:
                    grow = self.blocks_for(s.context + 1) - s.blocks
                    s.blocks += grow
                    self.used_blocks += grow
                break
            if spec.on_kv_full == "oom":
                self.oom_crashes_total += 1
                report.failed.extend(self.crash(t, spec.cold_start_s))
                report.crashed_at = t
                return
            victim = self.running.pop()   # the most recently admitted
            self._free(victim)
            victim.state = SeqState.WAITING
            victim.preemptions += 1
            self.preemptions_total += 1
            self.waiting.appendleft(victim)
            preempted = True
        # 2. admit from the queue, first come first served.
        prefill = 0
        admitted = 0
        while self.waiting and not preempted and len(self.running) < spec.max_num_seqs:
            seq = self.waiting[0]
            ctx = seq.context
            todo = ctx - (seq.cached_tokens if seq.preemptions == 0 else 0)   # a cached prefix is not prefilled
            if admitted and prefill + todo > spec.max_batched_tokens:
                break
            blocks = self.blocks_for(ctx + 1)
            limit = self.total_blocks - self._watermark_blocks
            if blocks > limit:
                # Can never be admitted (vLLM ignores such a prompt; the node refuses it up front with
                # fits_ever, so this is a sequence that grew too long for the cache).
                self.waiting.popleft()
                seq.state = SeqState.FAILED
                seq.finished_at = t
                report.failed.append(seq)
                continue
            if self.used_blocks + blocks > limit:
                break
            self.waiting.popleft()
            seq.blocks = blocks
            self.used_blocks += blocks
            seq.state = SeqState.RUNNING
            if seq.admitted_at is None:
                seq.admitted_at = t
                self.prompt_tokens_total += seq.prompt_tokens
            self.running.append(seq)
            prefill += todo
            admitted += 1
        if not self.running:
            return
        context = sum(s.context for s in self.running)
        duration = (spec.step_base_s + spec.step_per_seq_s * len(self.running)
                    + spec.step_per_kv_token_s * context + spec.prefill_s_per_token * prefill) * self._slow(t)
        self._step = _Step(t, t + duration, list(self.running))
        self.busy_s_total += duration

    def _finish(self, step: _Step, report: StepReport) -> None:
        end = step.end
        for seq in step.seqs:
            if seq.state is not SeqState.RUNNING:
                continue   # aborted during the step
            seq.generated += 1
            self.generation_tokens_total += 1
            if seq.first_token_at is None:
                seq.first_token_at = end
            if seq.generated >= seq.output_tokens:
                seq.state = SeqState.FINISHED
                seq.finished_at = end
                self.running.remove(seq)
                self._free(seq)
                self.finished_total += 1
            report.progressed.append(seq)
