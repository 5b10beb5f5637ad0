"""benchmarks/stream_chunk.py: its child streams complete answers and counts the same calls per
read each time for one tree (the CPU figures are the benchmark's to print, not a test's)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.stream_chunk import _child

ROOT = Path(__file__).resolve().parents[2]


def test_the_child_counts_calls_per_read_the_same_way_twice() -> None:
    first = _child(ROOT, tokens=16, requests=2, repeats=1)   # it asserts each stream ends with [DONE]
    second = _child(ROOT, tokens=16, requests=2, repeats=1)
    assert first["calls_per_read"] > 5
    assert abs(first["calls_per_read"] - second["calls_per_read"]) < 2   # background loops may tick
