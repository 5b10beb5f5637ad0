"""FastCore against BatchCore: the same submissions give the same schedule (tests the DES's claim
that it models the real-time emulator's continuous-batching node, not an approximation of it)."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from inferlb.simulator.batching import BatchCore, SeqState
from inferlb.simulator.des.engine import FAILED, FINISHED, FastCore
from inferlb.simulator.presets import PRESETS
from inferlb.simulator.spec import BatchSpec


def _subs(seed: int, n: int, rate: float, prompt: tuple[int, int],
          output: tuple[int, int]) -> list[tuple[float, int, int]]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append((t, rng.randint(*prompt), rng.randint(*output)))
    return out


def _run(core: Any, subs: list[tuple[float, int, int]], aborts: dict[int, float] | None = None) -> list[Any]:
    """Submit at each time (advancing first, as the contract asks), abort some, then drain."""
    seqs: list[Any] = []
    events = sorted([(t, 0, i) for i, (t, _, _) in enumerate(subs)] +
                    [(t, 1, i) for i, t in (aborts or {}).items()])
    for t, kind, i in events:
        core.advance(t)
        if kind == 0:
            seqs.append(core.submit(subs[i][1], subs[i][2], t))
        else:
            core.abort(seqs[i], t)
    core.advance(1e9)
    return seqs


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for f in ("admitted_at", "first_token_at", "finished_at"):
            u, v = getattr(x, f), getattr(y, f)
            assert (u is None) == (v is None), (x.rid, f, u, v)
            if u is not None:
                assert math.isclose(u, v, rel_tol=1e-9, abs_tol=1e-9), (x.rid, f, u, v)
        assert x.preemptions == y.preemptions, x.rid


@pytest.mark.parametrize("preset,rate", [("h100", 8.0), ("a100", 5.0), ("l4", 2.0), ("t4", 2.0)])
def test_same_schedule_as_batchcore_with_preemptions(preset: str, rate: float) -> None:
    spec = PRESETS[preset].batch_spec()
    subs = _subs(7, 300, rate, (10, 1500), (1, 400))
    a, b = BatchCore(spec), FastCore(spec)
    sa, sb = _run(a, subs), _run(b, subs)
    _same(sa, sb)
    assert a.preemptions_total == b.preemptions_total
    assert a.generation_tokens_total == b.generation_tokens_total
    assert a.prompt_tokens_total == b.prompt_tokens_total
    assert math.isclose(a.busy_s_total, b.busy_s_total, rel_tol=1e-9)
    if preset in ("l4", "t4"):
        assert b.preemptions_total > 0   # the case is one where the KV cache runs out


def test_prefill_cap_and_batch_cap_and_kv_growth_cost() -> None:
    spec = BatchSpec(kv_tokens=16_384, max_num_seqs=6, max_batched_tokens=900, step_base_s=0.01,
                     step_per_seq_s=0.001, step_per_kv_token_s=1e-6, prefill_s_per_token=1e-5)
    subs = _subs(3, 200, 20.0, (100, 800), (1, 120))
    _same(_run(BatchCore(spec), subs), _run(FastCore(spec), subs))


def test_aborts_free_the_batch_the_same_way() -> None:
    spec = PRESETS["l4"].batch_spec()
    subs = _subs(11, 150, 3.0, (50, 1200), (20, 300))
    aborts = {i: subs[i][0] + 0.5 + (i % 7) for i in range(0, 150, 5)}
    sa = _run(BatchCore(spec), subs, aborts)
    sb = _run(FastCore(spec), subs, aborts)
    for x, y in zip(sa, sb, strict=True):
        assert (x.state is SeqState.ABORTED) == (y.state == 3)
        if x.state is SeqState.FINISHED:
            assert y.state == FINISHED and math.isclose(x.finished_at, y.finished_at, rel_tol=1e-9)


def test_oom_crash_fails_everything_and_stays_down() -> None:
    spec = BatchSpec(kv_tokens=4096, on_kv_full="oom", cold_start_s=5.0, step_base_s=0.01)
    subs = _subs(2, 60, 10.0, (200, 600), (100, 300))
    a, b = BatchCore(spec), FastCore(spec)
    sa, sb = _run(a, subs), _run(b, subs)
    assert a.oom_crashes_total == b.oom_crashes_total > 0
    for x, y in zip(sa, sb, strict=True):
        assert (x.state is SeqState.FAILED) == (y.state == FAILED)
    assert math.isclose(a.down_until, b.down_until, rel_tol=1e-9)


def test_slow_start_steps_one_at_a_time_and_agree() -> None:
    spec = PRESETS["a100"].batch_spec()
    subs = _subs(5, 120, 6.0, (50, 500), (10, 200))

    def slow(t: float) -> float:
        return 1.0 + 2.0 * max(0.0, 1.0 - t / 20.0)   # 3× at 0, easing to 1× at 20 s

    a, b = BatchCore(spec), FastCore(spec)
    a.slow_factor_at = slow
    b.slow_factor_at = slow
    _same(_run(a, subs), _run(b, subs))


def test_cached_prefix_is_not_prefilled() -> None:
    spec = BatchSpec(step_base_s=0.01, prefill_s_per_token=0.001)
    core = FastCore(spec)
    cold = core.submit(1000, 1, 0.0)
    core.advance(100.0)
    warm = core.submit(1000, 1, 100.0, cached=900)
    core.advance(200.0)
    assert cold.first_token_at is not None and warm.first_token_at is not None
    # 1000 vs 100 prompt tokens prefilled at 1 ms each (+ the step's base)
    assert math.isclose(cold.first_token_at - 0.0, 0.01 + 0.00005 + 1.0, rel_tol=1e-6)
    assert math.isclose(warm.first_token_at - 100.0, 0.01 + 0.00005 + 0.1, rel_tol=1e-6)


def test_one_event_per_boundary_not_per_step() -> None:
    """1,000 tokens of one request: BatchCore runs 1,000 steps, FastCore a handful of advances."""
    spec = PRESETS["h100"].batch_spec()
    core = FastCore(spec)
    seq = core.submit(100, 1000, 0.0)
    wakes = 0
    while (at := core.next_event_at()) is not None:   # bounded: each wake ends a macro step
        core.advance(at)
        wakes += 1
        assert wakes < 10
    ref = BatchCore(spec)
    rseq = ref.submit(100, 1000, 0.0)
    ref.advance(1e9)
    assert seq.finished_at is not None and rseq.finished_at is not None
    assert math.isclose(seq.finished_at, rseq.finished_at, rel_tol=1e-9)
