"""The ``tiers:`` of a model alias (config/tiers.py): a good one loads; every bad one is a ConfigError
naming the file and the key path of the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlb.config.settings import load_fleet_file
from inferlb.errors import ConfigError

NODES = "nodes: [{name: a, url: 'http://10.0.0.1', models: [s, l]}]\n"


def write(tmp: Path, models: str, nodes: str = NODES) -> Path:
    p = tmp / "fleet.yaml"
    p.write_text(f"models:\n{models}\n{nodes}")
    return p


GOOD = """  - name: auto
    tiers:
      models: [{model: s, max_score: 0.4}, {model: l}]
      weights: {tools: 0.5}
      guard: {max_error_rate: 0.1, cooldown_s: 60}
  - {name: s}
  - {name: l}"""


def test_a_good_alias_loads(tmp_path: Path) -> None:
    cfg = load_fleet_file(write(tmp_path, GOOD))
    auto = cfg.model("auto")
    assert auto is not None and auto.tiers is not None
    assert [(t.model, t.max_score) for t in auto.tiers.models] == [("s", 0.4), ("l", None)]
    assert auto.tiers.weights == {"tools": 0.5} and auto.tiers.guard.cooldown_s == 60
    assert auto.tiers.learned.enabled is False          # off by default


@pytest.mark.parametrize(("models", "where", "what"), [
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 0.4}, {model: zz}]}}\n  - {name: s}\n  - {name: l}",
     "models[0].tiers.models[1].model", "unknown model 'zz'"),
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 0.4}, {model: auto}]}}\n  - {name: s}\n  - {name: l}",
     "models[0].tiers.models[1].model", "names itself as a tier (a cycle)"),
    # An alias naming an alias: two aliases naming each other would be a cycle; chains are refused.
    ("  - {name: a1, tiers: {models: [{model: s, max_score: 0.4}, {model: a2}]}}\n"
     "  - {name: a2, tiers: {models: [{model: s, max_score: 0.4}, {model: a1}]}}\n  - {name: s}\n  - {name: l}",
     "models[0].tiers.models[1].model", "'a2' is itself an alias with tiers"),
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 0.4}, {model: s}]}}\n  - {name: s}\n  - {name: l}",
     "models[0].tiers.models[1].model", "model 's' is already tier 0"),
    ("  - {name: auto, tiers: {models: [{model: s}, {model: l}]}}\n  - {name: s}\n  - {name: l}",
     "models[0].tiers.models[0]", "every tier but the last needs max_score"),
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 0.4}, {model: l, max_score: 0.9}]}}\n"
     "  - {name: s}\n  - {name: l}",
     "models[0].tiers.models[1].max_score", "leave out its max_score"),
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 0.5}, {model: l, max_score: 0.5}, {model: x}]}}\n"
     "  - {name: s}\n  - {name: l}\n  - {name: x}",
     "models[0].tiers.models[1].max_score", "not above the tier before's 0.5"),
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 1.5}, {model: l}]}}\n  - {name: s}\n  - {name: l}",
     "models[0].tiers.models[0].max_score", "less than or equal to 1"),
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 0.4}]}}\n  - {name: s}\n  - {name: l}",
     "models[0].tiers.models", "at least 2 items"),
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 0.4}, {model: l}], weights: {length: 1}}}\n"
     "  - {name: s}\n  - {name: l}",
     "models[0].tiers.weights", "unknown feature 'length'"),
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 0.4}, {model: l}], guard: {max_error_rate: 0}}}\n"
     "  - {name: s}\n  - {name: l}",
     "models[0].tiers.guard.max_error_rate", "greater than 0"),
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 0.4}, {model: l}], colour: red}}\n"
     "  - {name: s}\n  - {name: l}",
     "models[0].tiers.colour", "unknown key"),
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 0.4}, {model: e}]}}\n  - {name: s}\n  - {name: l}\n"
     "  - {name: e, kind: embedding}",
     "models[0].tiers.models[1].model", "of kind 'embedding'"),
    ("  - {name: auto, tiers: {models: [{model: s, max_score: 0.4}, {model: l}]}}\n  - {name: s, fallbacks: [auto]}\n"
     "  - {name: l}",
     "models[1].fallbacks[0]", "an alias with tiers"),
])
def test_bad_tiers_name_the_key_path(tmp_path: Path, models: str, where: str, what: str) -> None:
    p = write(tmp_path, models)
    with pytest.raises(ConfigError) as ei:
        load_fleet_file(p)
    msg = str(ei.value)
    assert msg.startswith(str(p)) and where in msg and what in msg, msg


def test_a_node_serving_the_alias_itself_is_refused(tmp_path: Path) -> None:
    nodes = ("nodes: [{name: a, url: 'http://10.0.0.1', models: [s, l]},"
             " {name: b, url: 'http://10.0.0.2', models: [auto]}]\n")
    with pytest.raises(ConfigError) as ei:
        load_fleet_file(write(tmp_path, GOOD, nodes))
    assert "nodes[1].models" in str(ei.value) and "an alias with tiers" in str(ei.value)
