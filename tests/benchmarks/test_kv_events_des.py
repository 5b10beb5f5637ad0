"""benchmarks/kv_events_des.py: the variants run side by side and the event-fed index is used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.kv_events_des import main


def test_a_short_run_prints_both_variants_and_the_index_decides(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                 ) -> None:
    out = tmp_path / "kv.json"
    assert main(["--loads", "0.5", "--seeds", "1", "--duration", "100", "--variants", "hash,kv,kv-lag3",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert " hash " in text and " kv " in text and "kv-lag3" in text
    rows = json.loads(out.read_text())["loads"][0]["variants"]
    assert rows["hash"]["index_used"] == 0 and rows["kv"]["index_used"] > 0 and rows["kv"]["fallbacks"] == {}
    assert rows["kv-lag3"]["fallbacks"].get("lagging", 0) > 0          # 3 s of lag is over max_lag_s
    with pytest.raises(SystemExit):
        main(["--variants", "nope"])
