"""benchmarks/request_profile.py: how a py-spy stack is assigned a component, and how each
thread's CPU is shared out over its samples (the pure parts; the runs need nodes and py-spy)."""

from __future__ import annotations

import pytest

from benchmarks.request_profile import _attribute, classify, parse_raw

_LOOP = "Runner.run (asyncio/runners.py:118)"
_SERVE = "run_loop (inferlb/cli/serve.py:102)"


@pytest.mark.parametrize(("frames", "want"), [
    # the innermost frame that names a component wins
    ([_SERVE, _LOOP, "Gateway.handle (inferlb/engine/gateway.py:126)",
      "Upstream.open (inferlb/engine/upstream.py:436)", "StreamWriter._writelines (aiohttp/http_writer.py:116)"],
     "upstream client"),
    # generic frames (json) count for the caller that names a component
    (["_finished_entry (/tmp/x/inferlb/store/wal.py:63)", "dumps (json/__init__.py:238)",
      "JSONEncoder.iterencode (json/encoder.py:258)"], "audit"),
    # asyncio code run by a component is that component's ...
    ([_LOOP, "AuditWriter._commit_wal (inferlb/store/writer.py:248)", "Lock.acquire (asyncio/locks.py:100)"],
     "audit"),
    # ... and the loop's own when nothing else is on the stack
    ([_SERVE, _LOOP], "event loop (uvloop C, socket system calls, wake-ups)"),
    (["f (somewhere/else.py:1)"], "other"),
])
def test_classify(frames: list[str], want: str) -> None:
    assert classify(frames) == want


def test_each_threads_cpu_is_shared_out_by_its_samples() -> None:
    raw = "\n".join([
        "thread (100): MainThread;" + _SERVE + ";" + _LOOP + ";validate_chat (inferlb/api/validation.py:9) 3",
        "thread (100): MainThread;" + _SERVE + ";" + _LOOP + ";select (inferlb/tasks/routing.py:5) 1",
        "thread (200): inferlb-audit-journal_0;Wal.write (inferlb/store/wal.py:211) 7",
        "not a stack line",
    ])
    samples = parse_raw(raw)
    assert samples["thread (100): MainThread"] == {"validation": 3, "routing": 1}
    # 0.4 s and 0.2 s of CPU over 100 requests; thread 300 was never sampled
    us = _attribute({100: 0.4, 200: 0.2, 300: 0.01}, samples, 100)
    assert us["validation"] == pytest.approx(3000.0)
    assert us["routing"] == pytest.approx(1000.0)
    assert us["audit"] == pytest.approx(2000.0)
    assert us["unsampled (threads py-spy did not see running)"] == pytest.approx(100.0)
