"""The fleet file's kv_events blocks (config/kvevents.py): optional, validated; an error names the file and
the key path, as every fleet-file error does (config/settings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlb.config.settings import load_fleet_file
from inferlb.errors import ConfigError

GOOD = """models:
  - name: m
    kv_events: {tokenizer: emulator, block_size: 16}
nodes:
  - name: a
    url: http://127.0.0.1:9001
    models: [m]
    kv_events:
      endpoint: tcp://127.0.0.1:5557
      replay_endpoint: tcp://127.0.0.1:5558
kv_index: {max_blocks_per_node: 1000, max_lag_s: 1.5}
"""


def test_a_good_file(tmp_path: Path) -> None:
    p = tmp_path / "fleet.yaml"
    p.write_text(GOOD)
    cfg = load_fleet_file(p)
    assert cfg.models[0].kv_events is not None and cfg.models[0].kv_events.tokenizer == "emulator"
    node = cfg.nodes[0].kv_events
    assert node is not None and node.replay_endpoint == "tcp://127.0.0.1:5558"
    assert cfg.kv_index.max_blocks_per_node == 1000 and cfg.kv_index.max_lag_s == 1.5


@pytest.mark.parametrize("old, new, where, what", [
    ("endpoint: tcp://127.0.0.1:5557", "endpoint: 'tcp://*:5557'", "nodes[0].kv_events.endpoint",
     "not a ZeroMQ endpoint"),
    ("replay_endpoint: tcp://127.0.0.1:5558", "replay_endpoint: tcp://h:70000", "nodes[0].kv_events.replay_endpoint",
     "port must be"),
    ("tokenizer: emulator", "tokenizer: model", "models[0].kv_events.tokenizer", "needs the model's tokenizer"),
    ("block_size: 16", "block_size: 0", "models[0].kv_events.block_size", "greater than or equal to 1"),
    ("max_lag_s: 1.5", "max_lag: 1.5", "kv_index.max_lag", "unknown key"),
])
def test_bad_blocks_name_the_file_and_key_path(tmp_path: Path, old: str, new: str, where: str, what: str) -> None:
    p = tmp_path / "fleet.yaml"
    text = GOOD.replace(old, new)
    assert text != GOOD
    p.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_fleet_file(p)
    msg = str(ei.value)
    assert msg.startswith(str(p)) and where in msg and what in msg
