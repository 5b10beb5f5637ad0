"""The vLLM-like engine of :mod:`inferlb.simulator.batching`, fast-forwarded: the same schedule, in
O(events) instead of O(steps).

Contract: :class:`FastCore` gives every request the first-token and finish times that
:class:`~inferlb.simulator.batching.BatchCore` gives it for the same submissions (same
:class:`~inferlb.simulator.spec.BatchSpec`, same times), up to float rounding of the summed step
durations; preemptions, KV-block accounting, the prefill cap, the watermark and OOM crashes
follow the same rules (tests/simulator/des/test_engine.py runs both side by side). Like
``BatchCore`` it does no I/O and reads no clock: :meth:`FastCore.advance` must be called with
``now`` before :meth:`FastCore.submit` / :meth:`FastCore.abort` at ``now``.

Why it is faster. ``BatchCore`` runs one Python step per decode step of the whole batch (a node
at 30 tokens/s per sequence does ~35 steps a second whatever the batch). Between *boundaries*
(a sequence finishes, one arrives at an empty queue, a preemption is due, the prefill cap left
work for the next step) the running batch is constant, so step ``j`` lasts
``base + inc × j`` (context grows by the batch size every step) and ``m`` steps take
``m × base + inc × m (m − 1) / 2``. Such a run of steps is one *macro step*; sequences carry the
step index at which they were admitted, so their token counts are computed, not stored. A step
that composes (admits, preempts) is composed by the same rules as ``BatchCore._compose``, one at
a time. Admission can only newly succeed after a boundary: between boundaries the free KV blocks
only shrink and the batch size is constant, so a queue head that did not fit still does not.

While a slow-start factor above 1 applies (``slow_factor_at``), steps are composed one at a time
(the factor changes every step). ``prefill_cached`` tokens of a submission (the prefix-cache
extension point) are not prefilled on first admission: they still hold KV blocks.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from inferlb.simulator.spec import BatchSpec

__all__ = ["ABORTED", "FAILED", "FINISHED", "RUNNING", "WAITING", "CoreReport", "FastCore", "FastSeq"]

WAITING, RUNNING, FINISHED, ABORTED, FAILED = 0, 1, 2, 3, 4


class FastSeq:
    """One request in the engine. ``gen0`` tokens were generated before its current admission at
    step ``start_k``; at the composition of step ``j`` it has ``gen0 + j − start_k``."""

    __slots__ = ("admitted_at", "arrived_at", "cached", "finish_k", "finished_at", "first_token_at", "gen0",
                 "output", "preemptions", "prompt", "rid", "start_k", "state", "tag")

    def __init__(self, rid: int, prompt: int, output: int, arrived_at: float, cached: int, tag: int) -> None:
        self.rid = rid
        self.prompt = prompt
        self.output = output
        self.arrived_at = arrived_at
        self.cached = cached
        self.tag = tag
        self.gen0 = 0
        self.start_k = 0
        self.finish_k = 0
        self.state = WAITING
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.preemptions = 0

    @property
    def done(self) -> bool:
        return self.state >= FINISHED


@dataclass(slots=True)
class CoreReport:
    """What :meth:`FastCore.advance` did: sequences that finished, sequences lost."""

    finished: list[FastSeq] = field(default_factory=list)
    failed: list[FastSeq] = field(default_factory=list)
    crashed_at: float | None = None


class FastCore:
    """One node's engine (see the module docstring)."""

    # Slots: every event reads a dozen of these, on a different node's engine each time (slot
    # loads from the object itself, no separate values array to fetch).
    __slots__ = ("_active", "_base", "_bt", "_ctx", "_dirty", "_first", "_heap", "_inc", "_limit", "_m",
                 "_max_batched", "_max_seqs", "_next_rid", "_pending", "_sb", "_spk", "_spp", "_sps", "_t0",
                 "_t_end", "busy_s_total", "down_until", "finished_total", "generation_tokens_total", "k",
                 "oom_crashes_total", "preemptions_total", "prompt_tokens_total", "running", "slow_factor_at",
                 "spec", "total_blocks", "waiting")

    def __init__(self, spec: BatchSpec) -> None:
        self.spec = spec
        self.total_blocks = spec.kv_tokens // spec.block_tokens
        self._limit = self.total_blocks - int(spec.watermark * self.total_blocks)
        self._bt = spec.block_tokens
        # The spec's step terms (a frozen BatchSpec), read on every composition: one attribute each.
        self._sb = spec.step_base_s
        self._sps = spec.step_per_seq_s
        self._spk = spec.step_per_kv_token_s
        self._spp = spec.prefill_s_per_token
        self._max_seqs = spec.max_num_seqs
        self._max_batched = spec.max_batched_tokens
        self.waiting: deque[FastSeq] = deque()
        self.running: list[FastSeq] = []
        self._ctx = 0                 # Σ (prompt + gen0 − start_k) over running: context at step j = _ctx + B·j
        self._heap: list[tuple[int, int, FastSeq]] = []    # (finish_k, rid, seq); stale entries skipped
        self.k = 0                    # the current (or next) step's index
        self._active = False
        self._t0 = 0.0                # start of the current macro step's first step
        self._m = 0                   # steps in it
        self._first = 0.0             # duration of its first step (it may prefill)
        self._base = 0.0              # duration of its second step
        self._inc = 0.0               # growth of the duration per step from the second on
        self._t_end = 0.0
        self._pending: float | None = None
        self._dirty = False           # the next step must be composed (admission possible)
        self.down_until = -math.inf
        self.slow_factor_at: Callable[[float], float] | None = None
        self._next_rid = 0
        self.preemptions_total = 0
        self.oom_crashes_total = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished_total = 0
        self.busy_s_total = 0.0

    # -- state -------------------------------------------------------------------------------------


    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self._bt)

    def fits_ever(self, tokens: int) -> bool:
        """Whether ``tokens`` of context can be admitted on an empty cache at all."""
        return -(-(tokens + 1) // self._bt) <= self._limit     # blocks_for(tokens + 1)

    def is_down(self, now: float) -> bool:
        return now < self.down_until

    def next_event_at(self) -> float | None:
        """When :meth:`advance` next has something to do (``None``: idle until a submit)."""
        return self._t_end if self._active else self._pending

    def usage_at(self, now: float) -> float:
        """Share of KV blocks held at ``now`` (the allocation of the step in progress), 0..1: what a
        scrape of ``vllm:kv_cache_usage_perc`` reads. O(batch)."""
        if not self.running:
            return 0.0
        return self._need(self._current_k(now)) / self.total_blocks

    # -- requests ------------------------------------------------------------------------------------

    def submit(self, prompt_tokens: int, output_tokens: int, now: float, *, cached: int = 0, tag: int = 0) -> FastSeq:
        """Queue a request (after ``advance(now)``); it joins the next step."""
        # max(0, p), max(1, o), min(max(0, c), max(0, p)), without the builtin calls (the same
        # values: each keeps the first of equals, as max and min do)
        prompt = prompt_tokens if prompt_tokens > 0 else 0
        c = cached if cached > 0 else 0
        seq = FastSeq(self._next_rid, prompt, output_tokens if output_tokens > 1 else 1, now,
                      prompt if prompt < c else c, tag)
        self._next_rid += 1
        was_empty = not self.waiting
        self.waiting.append(seq)
        if not self._active:
            if self._pending is None:
                self._pending = now
        elif was_empty:
            # A queue that was empty: the step in progress ends the macro step, the next composes.
            self._cut(now)
        return seq

    def abort(self, seq: FastSeq, now: float) -> None:
        """Drop ``seq`` (after ``advance(now)``) and free its blocks; no-op when done."""
        if seq.state >= FINISHED:
            return
        if seq.state == WAITING:
            self.waiting.remove(seq)
        else:
            k = self._current_k(now)
            self.generation_tokens_total += k - seq.start_k
            self.running.remove(seq)
            self._ctx -= seq.prompt + seq.gen0 - seq.start_k
            if self._active:
                self._cut(now)
        seq.state = ABORTED
        seq.finished_at = now
        if seq.first_token_at is not None and seq.first_token_at > now:
            seq.first_token_at = None

    def crash(self, now: float, cold_start_s: float) -> list[FastSeq]:
        """Kill the engine: every sequence fails; nothing runs until ``now + cold_start_s``."""
        if self._active and self._t_end > now:
            self._cut(now)   # the step in progress counts as busy, as BatchCore counts it
        lost = [*self.running, *self.waiting]
        for seq in lost:
            seq.state = FAILED
            seq.finished_at = now
            if seq.first_token_at is not None and seq.first_token_at > now:
                seq.first_token_at = None
        self.running.clear()
        self.waiting.clear()
        self._heap.clear()
        self._ctx = 0
        self._active = False
        self._pending = None
        self._dirty = False
        self.down_until = now + cold_start_s
        return lost

    # -- time ------------------------------------------------------------------------------------------

    def advance(self, now: float) -> CoreReport:
        """Run every step that ends by ``now``."""
        report = CoreReport()
        while True:  # bounded: each pass ends a (macro) step or composes one that ends later
            if self._active:
                t = self._t_end
                if t > now:
                    break
                last = self.k + self._m - 1
                self._active = False
                heap = self._heap
                if heap and heap[0][0] <= last:   # _finish's own first test, without the call
                    self._finish(last, t, report)
                self.k = last + 1
                # The next step from ``t``: composed alone at a boundary (a finish, an admission that
                # may succeed, slow start), else the decode steps up to the next boundary in one go.
                if self._dirty or not self.running or (self.slow_factor_at is not None and self._slow(t) > 1.0):
                    self._compose(t, report)
                    continue
                nxt = self._uniform_until(self.k)
                if nxt < self.k:
                    self._compose(t, report)
                    continue
                self._macro(t, self._step_s(self.k), nxt)
                continue
            start = self._pending
            if start is None or start > now:
                break
            self._pending = None
            self._compose(start, report)
            if not self._active:
                break
        return report

    def _slow(self, t: float) -> float:
        fn = self.slow_factor_at
        return 1.0 if fn is None else fn(t)

    def _steps_in(self, dt: float) -> int:
        """How many whole steps of the current macro step end within ``dt`` of its start."""
        m = self._m
        if dt < self._first or m == 0:
            return 0
        rest = dt - self._first
        base, inc = self._base, self._inc
        if inc <= 0:
            n = m if base <= 0 else 1 + int(rest / base)
        else:
            b = base - inc / 2
            n = 1 + int((-b + math.sqrt(max(0.0, b * b + 2 * inc * rest))) / inc)
        n = max(1, min(n, m))
        # exact correction of the float estimate, a step or two at most
        while n < m and self._span(n + 1) <= dt:
            n += 1
        while n > 0 and self._span(n) > dt:
            n -= 1
        return n

    def _span(self, n: int) -> float:
        """Seconds from the macro step's start to the end of its ``n``-th step."""
        if n <= 0:
            return 0.0
        j = n - 1
        return self._first + j * self._base + self._inc * j * (j - 1) / 2

    def _current_k(self, now: float) -> int:
        """The index of the step in progress at ``now`` (or the next one to compose)."""
        if not self._active:
            return self.k
        return self.k + min(self._m - 1, self._steps_in(now - self._t0))

    def _cut(self, now: float) -> None:
        """End the current macro step with the step in progress at ``now``; compose the next."""
        self._dirty = True
        if self._m <= 1:
            return
        n = min(self._m - 1, self._steps_in(now - self._t0))
        old = self._t_end
        self._m = n + 1
        self._t_end = self._t0 + self._span(self._m)
        self.busy_s_total -= old - self._t_end

    def _finish(self, last_k: int, t: float, report: CoreReport) -> None:
        """The step ``last_k`` ended at ``t``: the sequences whose last token it made finish."""
        heap = self._heap
        if not heap or heap[0][0] > last_k:
            return
        pop = heapq.heappop
        running = self.running
        finished = report.finished
        while heap and heap[0][0] <= last_k:
            fk, _, seq = pop(heap)
            if seq.state != RUNNING or seq.finish_k != fk:
                continue   # stale: preempted or aborted since
            seq.state = FINISHED
            seq.finished_at = t
            running.remove(seq)
            self._ctx -= seq.prompt + seq.gen0 - seq.start_k
            self.generation_tokens_total += seq.output - seq.gen0
            self.finished_total += 1
            self._dirty = True
            finished.append(seq)

    def _need(self, j: int) -> int:
        """KV blocks the running batch holds at the composition of step ``j``."""
        bt = self._bt
        return sum(-(-(s.prompt + s.gen0 + j - s.start_k + 1) // bt) for s in self.running)

    def _uniform_until(self, k1: int) -> int:
        """The last step index ``L`` (≥ ``k1`` − 1) such that steps ``k1`` … ``L`` compose with no
        boundary: no later than the next finish, before the first step that would preempt."""
        heap = self._heap
        while heap:
            top = heap[0]
            s = top[2]
            if s.state == RUNNING and s.finish_k == top[0]:
                break
            heapq.heappop(heap)
        else:
            return k1 - 1
        last = heap[0][0]
        if last < k1:
            return k1 - 1
        total = self.total_blocks
        b = len(self.running)
        # an upper bound of _need(last) in O(1): Σ ⌈(c + 1) / bt⌉ ≤ (Σ c + B) / bt + B
        if (self._ctx + b * last + b) // self._bt + b + 1 > total and self._need(last) > total:
            # the first step whose allocation would preempt is composed on its own
            if self._need(k1) > total:
                return k1 - 1
            lo, hi = k1, last
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self._need(mid) > total:
                    hi = mid
                else:
                    lo = mid
            last = lo
        return last

    def _step_s(self, k: int) -> float:
        """The duration of decode step ``k`` of the running batch (no prefill, no slow start)."""
        b = len(self.running)
        return self._sb + self._sps * b + self._spk * (self._ctx + b * k)

    def _macro(self, t: float, first: float, last: int) -> None:
        """Steps ``self.k`` … ``last`` from ``t``: the first lasts ``first``, the rest are decode steps."""
        k = self.k
        m = last - k + 1
        b = len(self.running)
        spk = self._spk
        inc = spk * b
        base = self._sb + self._sps * b + spk * (self._ctx + b * (k + 1))     # _step_s(k + 1)
        self._active = True
        self._t0 = t
        self._m = m
        self._first = first
        self._inc = inc
        self._base = base
        j = m - 1
        end = t + (first + j * base + inc * j * (j - 1) / 2)                  # t + _span(m), m >= 1
        self._t_end = end
        self.busy_s_total += end - t
        if m > 1 and last < self._heap[0][0]:
            self._dirty = True   # it stops short of the next finish: a preemption is due

    def _compose(self, t: float, report: CoreReport) -> None:
        """One step composed by ``BatchCore._compose``'s rules (the step's index is ``self.k``)."""
        k = self.k
        bt = self._bt
        running = self.running
        self._dirty = False
        preempted = False
        # 1. every running sequence needs the slot of the token it computes next. ``need`` is an
        # upper bound until ``exact`` (the O(batch) sum is taken only when the bound decides).
        if running:
            b = len(running)
            need = (self._ctx + b * k + b) // bt + b + 1     # a bound of _need(k), as in _uniform_until
            exact = False
        else:
            need, exact = 0, True
        if need > self.total_blocks:
            need, exact = self._need(k), True
        while running and need > self.total_blocks:
            spec = self.spec
            if spec.on_kv_full == "oom":
                self.oom_crashes_total += 1
                report.failed.extend(self.crash(t, spec.cold_start_s))
                report.crashed_at = t
                return
            victim = running.pop()   # the most recently admitted
            gen = victim.gen0 + k - victim.start_k
            need -= -(-(victim.prompt + gen + 1) // bt)
            self._ctx -= victim.prompt + victim.gen0 - victim.start_k
            self.generation_tokens_total += gen - victim.gen0
            victim.gen0 = gen
            victim.state = WAITING
            victim.preemptions += 1
            self.preemptions_total += 1
            self.waiting.appendleft(victim)
            preempted = True
        # 2. admit from the queue, first come first served.
        prefill = 0
        admitted = 0
        limit = self._limit
        waiting = self.waiting
        max_seqs = self._max_seqs
        while waiting and not preempted and len(running) < max_seqs:
            seq = waiting[0]
            ctx = seq.prompt + seq.gen0
            work = ctx - seq.cached if seq.admitted_at is None else ctx
            if admitted and prefill + work > self._max_batched:
                self._dirty = True   # the cap, not the cache, stopped it: the next step admits more
                break
            blocks = -(-(ctx + 1) // bt)
            if blocks > limit:
                waiting.popleft()
                seq.state = FAILED
                seq.finished_at = t
                report.failed.append(seq)
                continue
            if need + blocks > limit and not exact:
                need, exact = self._need(k), True    # the admitted ones included: same sum
            if need + blocks > limit:
                break
            waiting.popleft()
            need += blocks
            seq.state = RUNNING
            seq.start_k = k
            seq.finish_k = k + seq.output - seq.gen0 - 1
            if seq.admitted_at is None:
                seq.admitted_at = t
                self.prompt_tokens_total += seq.prompt
            running.append(seq)
            self._ctx += ctx - k
            heapq.heappush(self._heap, (seq.finish_k, seq.rid, seq))
            prefill += work
            admitted += 1
        if preempted:
            self._dirty = True
        if not running:
            return
        b = len(running)
        fn = self.slow_factor_at
        duration = (self._sb + self._sps * b + self._spk * (self._ctx + b * k)
                    + self._spp * prefill) * (1.0 if fn is None else fn(t))
        last = k
        if not self._dirty and (fn is None or fn(t + duration) <= 1.0):
            last = self._uniform_until(k + 1)   # the decode steps after it, in one go
            if last < k:
                last = k
        self._macro(t, duration, last)
        if admitted:
            end = t + duration
            for seq in running[b - admitted:]:
                if seq.first_token_at is None:
                    seq.first_token_at = end
