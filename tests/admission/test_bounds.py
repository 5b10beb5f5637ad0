"""Per-client state of the admission controller stays bounded however many clients come and go."""

from __future__ import annotations

from tests.admission.rig import make_rig


def test_failed_authentication_buckets_are_forgotten_once_full_again() -> None:
    r = make_rig({"auth_failures_per_minute": 5})
    fails = r.ctl.auth_failures
    now = r.clock.time()
    for i in range(1000):                                   # 1,000 addresses fail once each
        assert fails.check_and_take(f"10.0.{i // 256}.{i % 256}", rpm=5, tpm=None, tokens=0, now=now).ok
    for _ in range(5):                                      # one address uses up its limit
        fails.check_and_take("192.0.2.1", rpm=5, tpm=None, tokens=0, now=now)
    assert len(fails.buckets) == 1001
    r.ctl.sweep()
    assert len(fails.buckets) == 1001                       # nothing refilled yet: every limit still counts
    r.clock.advance(13.0)                                   # 5/min: one unit back after 12 s
    r.ctl.sweep()
    assert len(fails.buckets) == 1                          # only the address still below its full limit
    r.clock.advance(60.0)
    r.ctl.sweep()
    assert fails.buckets == {}
