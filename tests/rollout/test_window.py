"""Per-version window (rollout/window.py): what counts as a failure of a version, which
version an attempt counts for, the sliding window and the step start, and the node's times the
latency tests use."""

from __future__ import annotations

import pytest

from inferlb.config.settings import SLOConfig
from inferlb.rollout.guard import Counts
from inferlb.rollout.window import VersionWindow, attempt_failed, node_times
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.types import ManualClock


def test_what_counts_as_a_failed_attempt() -> None:
    assert attempt_failed("ok", 200) is False
    assert attempt_failed("retryable", 500) is True
    assert attempt_failed("retryable", None) is True          # connect error, timeout
    assert attempt_failed("midstream_error", 200) is True
    assert attempt_failed("fatal", 502) is True
    assert attempt_failed("fatal", 400) is None                # the request's own fault
    assert attempt_failed("retryable", 429) is None            # busy, not broken
    assert attempt_failed("client_closed", None) is None


def _rec(clock: ManualClock, *attempts: tuple[str, str, int | None], served: str | None, e2e: float = 0.1,
         status: str = "ok") -> RequestRecord:
    now = clock.time()
    rec = RequestRecord(request_id="r", received_at=now, endpoint="chat", model_requested="m", stream=True,
                        status=status, model_version=served, first_byte_at=now + e2e / 2, last_byte_at=now + e2e)
    for i, (version, outcome, http) in enumerate(attempts, 1):
        rec.decisions.append({"attempt": i, "model": "m", "version": version})
        rec.attempts.append(AttemptRecord(i, "n", "m", now, now, outcome, http))
    return rec


def test_attempts_count_for_their_version_and_the_slo_for_the_served_one() -> None:
    clock = ManualClock()
    w = VersionWindow(clock, lambda m: m == "m", slos=[SLOConfig(model="m", e2e_max_s=1.0)])
    since = clock.monotonic()
    clock.advance(1.0)
    # A canary attempt fails, the retry on v1 succeeds slowly: one failure for v2, a miss for v1.
    w.observe(_rec(clock, ("v2", "retryable", 503), ("v1", "ok", 200), served="v1", e2e=1.5))
    w.observe(_rec(clock, ("v2", "ok", 200), served="v2", e2e=0.2))
    w.observe(_rec(clock, ("v2", "retryable", 429), ("v2", "ok", 200), served="v2", e2e=0.2))
    other = RequestRecord(request_id="x", received_at=0.0, endpoint="chat", model_requested="unversioned",
                          status="ok", model_version="v9", last_byte_at=1.0)
    w.observe(other)
    assert w.counts("m", "v2", since=since, window_s=60) == Counts(attempts=3, failed=1, ok=2, slo_missed=0)
    assert w.counts("m", "v1", since=since, window_s=60) == Counts(attempts=1, failed=0, ok=1, slo_missed=1)
    assert ("unversioned", "v9") not in w.totals


def test_the_window_slides_and_never_reaches_before_the_step() -> None:
    clock = ManualClock()
    w = VersionWindow(clock, lambda m: True)
    for _ in range(10):
        clock.advance(1.0)
        w.observe(_rec(clock, ("v2", "ok", 200), served="v2"))
    assert w.counts("m", "v2", since=0.0, window_s=5).attempts == 5        # the last 5 seconds
    step = clock.monotonic()
    assert w.counts("m", "v2", since=step, window_s=60).attempts == 0       # a new step starts empty
    clock.advance(1.0)
    w.observe(_rec(clock, ("v2", "ok", 200), served="v2"))
    assert w.counts("m", "v2", since=step, window_s=60).attempts == 1
    assert w.totals[("m", "v2")][0] == 11


def test_a_rollout_sets_its_own_slo() -> None:
    w = VersionWindow(ManualClock(), lambda m: True, slos=[SLOConfig(model="*", e2e_max_s=5.0)])
    assert w.slo_of("m") == (None, 5.0)
    w.set_slo("m", (0.5, 2.0))
    assert w.slo_of("m") == (0.5, 2.0)
    w.set_slo("m", None)
    assert w.slo_of("m") == (None, 5.0)


def _timed(clock: ManualClock, *, stream: bool, queued: float, node_ttft: float, node_total: float,
           tokens: int = 11, version: str = "v2") -> RequestRecord:
    """A request that waited ``queued`` s in the gateway, then took ``node_total`` s at the node."""
    now = clock.time()
    start = now + queued
    rec = RequestRecord(request_id="t", received_at=now, endpoint="chat", model_requested="m", stream=stream,
                        status="ok", model_version=version, completion_tokens=tokens,
                        first_byte_at=start + node_ttft, last_byte_at=start + node_total)
    rec.decisions.append({"attempt": 1, "model": "m", "version": version})
    rec.attempts.append(AttemptRecord(1, "n", "m", start, start + node_total, "ok", 200,
                                      first_byte_at=start + node_ttft))
    return rec


def test_node_times_leave_out_the_gateway_queue_and_keep_streams_apart() -> None:
    clock = ManualClock()
    streamed = _timed(clock, stream=True, queued=3.0, node_ttft=0.1, node_total=1.1)
    assert node_times(streamed) == pytest.approx({"ttft": 0.1, "tpot": 0.1})   # tpot: (1.1 − 0.1) / 10
    assert node_times(_timed(clock, stream=False, queued=3.0, node_ttft=0.1, node_total=0.5)) == pytest.approx(
        {"e2e": 0.5})
    assert "tpot" not in node_times(_timed(clock, stream=True, queued=0, node_ttft=0.1, node_total=0.2, tokens=1))
    failed = _timed(clock, stream=False, queued=0, node_ttft=0.1, node_total=0.5)
    failed.status = "upstream_error"
    assert node_times(failed) == {}
    # A record without node timestamps (ended when it started) adds no time.
    assert node_times(_timed(clock, stream=False, queued=0, node_ttft=0, node_total=0)) == {}


def test_the_window_sums_log_times_per_version_and_metric() -> None:
    clock = ManualClock()
    w = VersionWindow(clock, lambda m: True)
    since = clock.monotonic()
    clock.advance(1.0)
    for total in (0.2, 0.8):
        w.observe(_timed(clock, stream=False, queued=1.0, node_ttft=0.05, node_total=total))
    w.observe(_timed(clock, stream=True, queued=0.0, node_ttft=0.3, node_total=0.4, version="v1"))
    v2 = w.counts("m", "v2", since=since, window_s=60).latency
    assert set(v2) == {"e2e"} and v2["e2e"].n == 2
    assert v2["e2e"].geomean == pytest.approx(0.4)                 # sqrt(0.2 × 0.8)
    assert set(w.counts("m", "v1", since=since, window_s=60).latency) == {"ttft", "tpot"}
    assert w.counts("m", "v2", since=clock.monotonic(), window_s=60).latency == {}   # a new step starts empty
