"""server/gc_tuning.py: what ``inferlb serve`` does to the collector once started."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from inferlb.config.settings import load_settings
from inferlb.server.gc_tuning import tune_gc


@pytest.fixture
def restore_gc() -> Iterator[None]:
    """The test process's collector as it was (thresholds, nothing frozen)."""
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


@pytest.mark.usefixtures("restore_gc")
def test_threshold_only_leaves_nothing_frozen() -> None:
    gc.set_threshold(700, 11, 12)
    assert tune_gc(freeze=False, gen0_threshold=5000) == {"frozen": 0, "gen0_threshold": 5000}
    assert gc.get_threshold() == (5000, 11, 12)       # the older generations keep theirs
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("restore_gc")
def test_freeze_moves_live_objects_out_and_zero_keeps_the_threshold() -> None:
    gc.set_threshold(700, 10, 10)
    kept = [[i] for i in range(1000)]   # live containers at "start-up"
    done = tune_gc(freeze=True, gen0_threshold=0)
    assert done["frozen"] == gc.get_freeze_count() >= len(kept)
    assert done["gen0_threshold"] == 700 and gc.get_threshold() == (700, 10, 10)


def test_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert (s.gc_freeze, s.gc_gen0_threshold) == (True, 10_000)
    monkeypatch.setenv("INFERLB_GC_FREEZE", "0")
    monkeypatch.setenv("INFERLB_GC_GEN0_THRESHOLD", "0")
    s = load_settings()
    assert (s.gc_freeze, s.gc_gen0_threshold) == (False, 0)
