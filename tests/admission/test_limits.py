"""Tenant limits with an injected clock: token buckets, TPM correction, parallel, spend, refunds;
the retry budget."""

from __future__ import annotations

import pytest

from inferlb.admission.buckets import Limiter, TokenBucket
from inferlb.admission.budget import RetryBudget
from tests.admission.rig import make_rig


def test_bucket_refills_at_limit_per_minute_and_takes_whole_requests() -> None:
    b = TokenBucket(60, now=0.0)
    assert b.take(60, 0.0) and not b.take(1, 0.0)
    assert b.retry_after(1, 0.0) == pytest.approx(1.0)
    assert b.take(1, 1.0)
    assert b.retry_after(30, 1.0) == pytest.approx(30.0)
    b.refill(1000.0)
    assert b.level == 60                        # never above capacity


def test_a_request_bigger_than_the_bucket_passes_when_full_and_leaves_debt() -> None:
    b = TokenBucket(100, now=0.0)
    assert b.take(250, 0.0)                     # min(amount, capacity) must be there
    assert b.level == -100                      # debt is bounded at -capacity
    assert b.retry_after(1, 0.0) == pytest.approx(101 / (100 / 60))


def test_limiter_takes_both_or_nothing() -> None:
    lim = Limiter()
    assert lim.check_and_take("k", rpm=10, tpm=100, tokens=80, now=0.0).ok
    d = lim.check_and_take("k", rpm=10, tpm=100, tokens=80, now=0.0)
    assert not d.ok and d.which == "tokens" and d.retry_after_s == pytest.approx(60 / (100 / 60))
    assert lim.level("k", "rpm", 0.0) == 9      # the refused request took no request unit


def test_rpm_limit_answers_429_with_retry_after() -> None:
    r = make_rig()
    r.add_key(rpm=2)
    ok = [r.admit(f"r{i}", key="key_1")[1] for i in range(2)]
    assert all(a["admitted"] for a in ok)
    _, a = r.admit("r3", key="key_1")
    assert a["status"] == 429 and a["code"] == "rate_limit_exceeded" and a["type"] == "rate_limit_error"
    assert a["retry_after_s"] == 30 and a["record_status"] == "rejected_rate_limit"
    r.clock.advance(30)
    assert r.admit("r4", key="key_1")[1]["admitted"]


def test_tpm_is_taken_from_the_estimate_and_corrected_by_usage() -> None:
    r = make_rig()
    r.add_key(tpm=100)
    s1, a1 = r.admit("r1", key="key_1", prompt=10, output=50)     # takes 60
    assert a1["admitted"]
    _, a2 = r.admit("r2", key="key_1", prompt=10, output=50)      # 40 left
    assert a2["status"] == 429 and "tokens per minute" in a2["message"]
    r.end(s1, prompt=10, completion=5)                             # used 15: 45 come back
    assert r.ctl.limiter.level("key_1", "tpm", r.clock.time()) == pytest.approx(85)
    assert r.admit("r3", key="key_1", prompt=10, output=50)[1]["admitted"]


def test_usage_above_the_estimate_takes_more() -> None:
    r = make_rig()
    r.add_key(tpm=1000)
    s, _ = r.admit("r", key="key_1", prompt=10, output=10)
    r.end(s, prompt=300, completion=200)                           # the estimate was far off
    assert r.ctl.limiter.level("key_1", "tpm", r.clock.time()) == pytest.approx(500)


def test_parallel_limit() -> None:
    r = make_rig()
    r.add_key(max_parallel=1)
    s, a = r.admit("r1", key="key_1")
    assert a["admitted"]
    assert r.admit("r2", key="key_1")[1]["status"] == 429
    r.end(s)
    assert r.admit("r3", key="key_1")[1]["admitted"]


def test_spent_budget_is_a_quota_429_without_retry_after() -> None:
    r = make_rig()
    r.add_key(budget=0.01)
    s, _ = r.admit("r1", key="key_1")
    r.end(s, cost=0.02)
    _, a = r.admit("r2", key="key_1")
    assert a["status"] == 429 and a["code"] == "insufficient_quota" and a["retry_after_s"] is None
    assert a["record_status"] == "rejected_quota"
    assert r.ctl.spend_pending["key_1"] == pytest.approx(0.02)


def test_a_request_shed_by_the_gateway_gets_its_units_back() -> None:
    r = make_rig()
    r.add_key(rpm=10, tpm=1000)
    for i in range(4):
        r.admit(f"fill{i}")
    s, a = r.admit("mine", key="key_1", prompt=100, output=100)
    assert a["queue"]
    r.clock.advance(2.5)
    r.ctl.tick()
    r.ctl.wait_result(s)
    assert r.again(s)["record_status"] == "rejected_queue_timeout"
    r.end(s, "rejected_queue_timeout", attempted=False)
    now = r.clock.time()
    assert r.ctl.limiter.level("key_1", "rpm", now) == pytest.approx(10)
    assert r.ctl.limiter.level("key_1", "tpm", now) == pytest.approx(1000)
    assert r.ctl.parallel["key_1"] == 0


def test_retry_budget_after_a_thousand_failures() -> None:  # docs/reliability.md §9.5
    b = RetryBudget(ratio=0.1, min_retries=10, window_s=10.0)
    granted = 0
    for i in range(1000):
        now = i * 0.005                              # 1 000 requests in 5 s: one window
        b.request("m", now)
        granted += b.try_retry("m", now)
        granted += b.try_retry("m", now)             # up to 2 retries each (3 attempts)
    assert granted <= 100 + 10
    assert (1000 + granted) / 1000 <= 1.1            # B3 over the window


def test_a_retry_that_answered_is_refunded_and_failed_ones_still_bound_b3() -> None:
    b = RetryBudget(ratio=0.1, min_retries=3, window_s=10.0)
    for i in range(100):
        b.request("m", i * 0.01)
    # A node flapping faster than ejection: every request's first attempt fails, its retry answers.
    assert all(b.try_retry("m", 1.0) and b.refund("m", 1.0) for _ in range(200))
    assert b.snapshot("m", 1.0)["retries"] == 0 and b.snapshot("m", 1.0)["refunded"] == 200
    # The retries that fail are never refunded: the 10 % (here 10 of 100) holds as before.
    assert sum(b.try_retry("m", 1.0) for _ in range(50)) == 10
    assert not b.refund("m", 20.0)                   # nothing left in the window to take back


def test_retry_budget_floor_and_window_ageing() -> None:
    b = RetryBudget(ratio=0.1, min_retries=3, window_s=10.0)
    b.request("m", 0.0)
    assert [b.try_retry("m", 0.0) for _ in range(4)] == [True, True, True, False]
    assert not b.try_retry("m", 9.0)
    assert b.try_retry("m", 10.5)                    # the first bucket aged out
    assert b.snapshot("m", 10.5)["requests"] == 0
