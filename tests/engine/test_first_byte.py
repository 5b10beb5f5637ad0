"""The per-node first-byte wait: a few of the node's usual times, floored, capped, and only once known."""

from __future__ import annotations

import pytest

from inferlb.engine.first_byte import FirstByteBudget


def test_unknown_node_or_too_few_samples_get_the_configured_wait() -> None:
    b = FirstByteBudget(min_samples=20)
    assert b.wait_s("n", stream=True, output_tokens=10, configured_s=60.0) == 60.0
    for _ in range(19):
        b.observe("n", stream=True, ttfb_s=0.5, completion_tokens=0)
    assert b.wait_s("n", stream=True, output_tokens=10, configured_s=60.0) == 60.0
    b.observe("n", stream=True, ttfb_s=0.5, completion_tokens=0)
    assert b.wait_s("n", stream=True, output_tokens=10, configured_s=60.0) == pytest.approx(4 * 0.5)


def test_streamed_wait_is_k_times_the_p99_with_a_floor_and_the_configured_cap() -> None:
    b = FirstByteBudget(k=4.0, floor_s=1.0, min_samples=20, refresh_every=1)
    for i in range(100):
        b.observe("n", stream=True, ttfb_s=0.9 if i == 99 else 0.1, completion_tokens=0)
    # p99 of 100 samples is the 99th smallest: 0.1 (one outlier does not move it)
    assert b.wait_s("n", stream=True, output_tokens=0, configured_s=60.0) == pytest.approx(1.0)   # floor
    for _ in range(10):
        b.observe("n", stream=True, ttfb_s=3.0, completion_tokens=0)
    assert b.wait_s("n", stream=True, output_tokens=0, configured_s=60.0) == pytest.approx(12.0)
    assert b.wait_s("n", stream=True, output_tokens=0, configured_s=5.0) == 5.0                  # cap
    # streamed samples say nothing about non-streamed answers
    assert b.wait_s("n", stream=False, output_tokens=100, configured_s=70.0) == 70.0


def test_non_streamed_wait_scales_with_the_output_budget() -> None:
    b = FirstByteBudget(k=4.0, floor_s=1.0, min_samples=20, refresh_every=1)
    for _ in range(20):
        b.observe("n", stream=False, ttfb_s=2.0, completion_tokens=100)   # 20 ms per token
    assert b.wait_s("n", stream=False, output_tokens=500, configured_s=110.0) == pytest.approx(4 * 0.02 * 500)
    assert b.wait_s("n", stream=False, output_tokens=5, configured_s=110.0) == pytest.approx(1.0)
    assert b.wait_s("other", stream=False, output_tokens=5, configured_s=110.0) == 110.0


def test_window_forgets_old_samples_and_ignores_nonsense() -> None:
    b = FirstByteBudget(k=1.0, floor_s=0.0, min_samples=5, window=10, refresh_every=1)
    for _ in range(10):
        b.observe("n", stream=True, ttfb_s=5.0, completion_tokens=0)
    for _ in range(10):
        b.observe("n", stream=True, ttfb_s=0.2, completion_tokens=0)
    assert b.wait_s("n", stream=True, output_tokens=0, configured_s=60.0) == pytest.approx(0.2)
    b.observe("n", stream=True, ttfb_s=float("nan"), completion_tokens=0)
    b.observe("n", stream=True, ttfb_s=-1.0, completion_tokens=0)
    b.observe("n", stream=False, ttfb_s=1.0, completion_tokens=0)   # no tokens: no per-token sample
    assert len(b.nodes["n"].ttft.samples) == 10 and not b.nodes["n"].per_token.samples


def test_a_longer_prompt_than_usual_scales_the_wait() -> None:
    b = FirstByteBudget(k=4.0, floor_s=0.1, min_samples=20, refresh_every=1)
    for _ in range(20):
        b.observe("n", stream=True, ttfb_s=0.5, completion_tokens=0, prompt_tokens=1000)
    assert b.wait_s("n", stream=True, output_tokens=0, configured_s=60.0, prompt_tokens=500) == pytest.approx(2.0)
    assert b.wait_s("n", stream=True, output_tokens=0, configured_s=60.0, prompt_tokens=8000) == pytest.approx(16.0)
    assert b.wait_s("n", stream=True, output_tokens=0, configured_s=60.0, prompt_tokens=100_000) == 60.0


def test_the_floor_of_a_call_overrides_the_budgets_own() -> None:
    # timeouts.first_byte_floor_s: a fleet whose host may pause raises the floor per call.
    b = FirstByteBudget(k=4.0, floor_s=1.0, min_samples=20, refresh_every=1)
    for _ in range(20):
        b.observe("n", stream=True, ttfb_s=0.01, completion_tokens=1)
    assert b.wait_s("n", stream=True, output_tokens=0, configured_s=60.0) == pytest.approx(1.0)
    assert b.wait_s("n", stream=True, output_tokens=0, configured_s=60.0, floor_s=20.0) == pytest.approx(20.0)
    assert b.wait_s("n", stream=True, output_tokens=0, configured_s=10.0, floor_s=20.0) == pytest.approx(10.0)
