"""The vLLM-like engine as a pure model: batching, step time, KV limit, queueing, preemption, OOM.

Time is a :class:`ManualClock`; nothing sleeps. Step times use round numbers so the expected
token times can be written down by hand.
"""

from __future__ import annotations

import pytest

from inferlb.simulator.batching import BatchCore, SeqState
from inferlb.simulator.spec import BatchSpec
from inferlb.types import ManualClock


def spec(**kw: object) -> BatchSpec:
    base: dict[str, object] = {"kv_tokens": 1600, "block_tokens": 16, "max_num_seqs": 8,
                               "max_batched_tokens": 4096, "step_base_s": 0.010, "step_per_seq_s": 0.001,
                               "step_per_kv_token_s": 0.0, "prefill_s_per_token": 0.0, "watermark": 0.0}
    base.update(kw)
    return BatchSpec(**base)  # type: ignore[arg-type]


def run_until_idle(core: BatchCore, clock: ManualClock, limit: int = 10_000) -> int:
    """Advance step by step (bounded) until the engine is idle; returns the number of steps."""
    steps = 0
    for _ in range(limit):
        at = core.next_event_at()
        if at is None:
            return steps
        clock.advance(max(0.0, at - clock.monotonic()))
        steps += core.advance(clock.monotonic()).steps
    raise AssertionError("the engine did not go idle")


def test_continuous_batching_one_token_per_step_for_every_running_request() -> None:
    clock = ManualClock()
    core = BatchCore(spec())
    t0 = clock.monotonic()
    a = core.submit(10, 3, t0)
    b = core.submit(10, 5, t0)
    assert core.next_event_at() == t0          # an idle engine starts a step at once
    core.advance(t0)
    # Both admitted into the same step: 10 ms + 2 × 1 ms.
    assert core.next_event_at() == pytest.approx(t0 + 0.012)
    assert core.kv_usage > 0 and len(core.running) == 2
    clock.advance(0.012)
    report = core.advance(clock.monotonic())
    assert report.steps == 1 and a.generated == 1 and b.generated == 1
    assert a.first_token_at == pytest.approx(t0 + 0.012)
    clock.advance(0.024)                       # two more steps at batch 2
    core.advance(clock.monotonic())
    assert a.state is SeqState.FINISHED and a.generated == 3
    assert b.generated == 3
    # a left the batch: steps are now 11 ms.
    assert core.next_event_at() == pytest.approx(t0 + 0.036 + 0.011)
    run_until_idle(core, clock)
    assert b.state is SeqState.FINISHED and b.finished_at == pytest.approx(t0 + 0.036 + 0.022)
    assert core.used_blocks == 0 and core.finished_total == 2
    assert core.generation_tokens_total == 8 and core.prompt_tokens_total == 20


def test_step_time_grows_with_batch_context_and_prefill() -> None:
    clock = ManualClock()
    core = BatchCore(spec(step_per_kv_token_s=0.0001, prefill_s_per_token=0.001))
    t0 = clock.monotonic()
    core.submit(100, 2, t0)
    core.advance(t0)
    # 10 ms + 1 ms × 1 seq + 0.1 ms × 100 context + 1 ms × 100 prefilled
    assert core.next_event_at() == pytest.approx(t0 + 0.010 + 0.001 + 0.010 + 0.100)
    clock.advance(0.121)
    core.advance(clock.monotonic())
    # The decode step has no prefill; context is 101.
    assert core.next_event_at() == pytest.approx(t0 + 0.121 + 0.010 + 0.001 + 0.0101)


def test_a_request_arriving_mid_step_joins_the_next_step() -> None:
    clock = ManualClock()
    core = BatchCore(spec())
    t0 = clock.monotonic()
    a = core.submit(10, 4, t0)
    core.advance(t0)
    clock.advance(0.005)
    b = core.submit(10, 1, clock.monotonic())
    assert core.next_event_at() == pytest.approx(t0 + 0.011)   # the running step is not disturbed
    clock.advance(0.006)
    core.advance(clock.monotonic())
    assert a.generated == 1 and b.generated == 0 and b.state is SeqState.RUNNING
    clock.advance(0.012)
    core.advance(clock.monotonic())
    assert b.state is SeqState.FINISHED and b.first_token_at == pytest.approx(t0 + 0.023)


def test_kv_limit_queues_new_requests_fifo() -> None:
    clock = ManualClock()
    core = BatchCore(spec(kv_tokens=320))    # 20 blocks of 16
    t0 = clock.monotonic()
    big = core.submit(200, 2, t0)            # 13 blocks
    small = core.submit(120, 2, t0)          # 8 blocks: fits only after big leaves
    tiny = core.submit(10, 2, t0)            # fits now, but FIFO: waits behind small
    core.advance(t0)
    assert big.state is SeqState.RUNNING and small.state is SeqState.WAITING
    assert tiny.state is SeqState.WAITING and len(core.waiting) == 2
    run_until_idle(core, clock)
    assert all(s.state is SeqState.FINISHED for s in (big, small, tiny))
    assert small.admitted_at is not None and small.admitted_at >= big.finished_at  # type: ignore[operator]
    assert core.preemptions_total == 0


def test_max_num_seqs_caps_the_batch() -> None:
    clock = ManualClock()
    core = BatchCore(spec(max_num_seqs=2))
    seqs = [core.submit(10, 2, clock.monotonic()) for _ in range(3)]
    core.advance(clock.monotonic())
    assert [s.state for s in seqs] == [SeqState.RUNNING, SeqState.RUNNING, SeqState.WAITING]


def test_decode_growth_preempts_the_newest_and_recomputes_it() -> None:
    clock = ManualClock()
    core = BatchCore(spec(kv_tokens=64))     # 4 blocks
    t0 = clock.monotonic()
    old = core.submit(15, 20, t0)            # 1 block now (16 slots), grows
    new = core.submit(15, 20, t0)
    core.advance(t0)
    assert core.used_blocks == 2
    run_until_idle(core, clock)
    assert core.preemptions_total >= 1 and new.preemptions >= 1 and old.preemptions == 0
    assert old.state is SeqState.FINISHED and new.state is SeqState.FINISHED
    assert new.generated == 20 and core.used_blocks == 0
    assert new.finished_at > old.finished_at  # type: ignore[operator]


def test_oom_mode_crashes_instead_of_preempting_then_cold_starts() -> None:
    clock = ManualClock()
    core = BatchCore(spec(kv_tokens=64, on_kv_full="oom", cold_start_s=5.0))
    t0 = clock.monotonic()
    a = core.submit(15, 20, t0)
    b = core.submit(15, 20, t0)
    crashed = None
    for _ in range(100):
        at = core.next_event_at()
        assert at is not None
        clock.advance(at - clock.monotonic())
        report = core.advance(clock.monotonic())
        if report.crashed_at is not None:
            crashed = report
            break
    assert crashed is not None and core.oom_crashes_total == 1 and core.preemptions_total == 0
    assert {id(s) for s in crashed.failed} == {id(a), id(b)}
    assert a.state is SeqState.FAILED and core.used_blocks == 0 and core.next_event_at() is None
    assert core.is_down(clock.monotonic()) and not core.is_down(clock.monotonic() + 5.0)


def test_abort_frees_blocks_and_skips_the_sequence() -> None:
    clock = ManualClock()
    core = BatchCore(spec())
    a = core.submit(100, 10, clock.monotonic())
    core.advance(clock.monotonic())
    assert core.used_blocks == 7
    core.abort(a, clock.monotonic())
    assert core.used_blocks == 0 and a.state is SeqState.ABORTED
    clock.advance(1.0)
    core.advance(clock.monotonic())
    assert a.generated == 0 and core.next_event_at() is None
    queued = core.submit(10, 1, clock.monotonic())
    core.abort(queued, clock.monotonic())
    assert not core.waiting


def test_a_prompt_that_never_fits_is_refused_and_watermark_keeps_room() -> None:
    core = BatchCore(spec(kv_tokens=160, watermark=0.1))   # 10 blocks, 1 kept free
    assert core.fits_ever(16 * 9 - 1) and not core.fits_ever(16 * 9)


def test_slow_start_factor_stretches_steps() -> None:
    clock = ManualClock()
    core = BatchCore(spec())
    core.slow_factor_at = lambda t: 3.0
    t0 = clock.monotonic()
    core.submit(1, 1, t0)
    core.advance(t0)
    assert core.next_event_at() == pytest.approx(t0 + 0.033)


def test_late_advance_catches_up_without_drift() -> None:
    clock = ManualClock()
    core = BatchCore(spec())
    t0 = clock.monotonic()
    a = core.submit(1, 10, t0)
    core.advance(t0)
    clock.advance(0.0555)        # the loop woke late: 5 steps of 11 ms were due
    report = core.advance(clock.monotonic())
    assert report.steps == 5 and a.generated == 5
    assert core.next_event_at() == pytest.approx(t0 + 0.066)
