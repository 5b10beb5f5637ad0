"""Fleet file and environment settings: bad input names the file, the key path and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlb.engine.errors import ConfigError
from inferlb.engine.settings import load_fleet_file, load_settings

GOOD = """
models: [{name: m, fallbacks: [s]}, {name: s}]
nodes:
  - {name: a, url: "http://10.0.0.1:8000/", models: [m, s], capacity_tokens: 1000, price_per_hour: 2}
routing: {profile: least-connections}
slos: [{model: m, e2e_max_s: 3}]
"""


def test_good_file(tmp_path: Path) -> None:
    p = tmp_path / "f.yaml"
    p.write_text(GOOD)
    cfg = load_fleet_file(p)
    assert cfg.nodes[0].url == "http://10.0.0.1:8000"
    assert cfg.routing.profile == "least-connections"
    assert cfg.model("m") is not None and cfg.model("m").fallbacks == ["s"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("text", "where", "what"), [
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://x', models: [m], capacity_tokens: -1}]",
     "nodes[0].capacity_tokens", "greater than 0"),
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://x', models: [m], colour: red}]",
     "nodes[0].colour", "unknown key"),
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://x', models: [zz]}]", "", "unknown model 'zz'"),
    ("models: [{name: m}]\n", "nodes", "Field required"),
    ("- just\n- a list\n", "", "top level must be a mapping"),
    ("models: [{name: m\n", "", "not valid YAML"),
])
def test_bad_files(tmp_path: Path, text: str, where: str, what: str) -> None:
    p = tmp_path / "fleet.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as ei:
        load_fleet_file(p)
    msg = str(ei.value)
    assert msg.startswith(str(p))
    assert where in msg and what in msg


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_fleet_file(tmp_path / "nope.yaml")


def test_env_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERLB_ENGINE", "spiff")
    monkeypatch.setenv("INFERLB_PORT", "9090")
    s = load_settings()
    assert (s.engine, s.port) == ("spiff", 9090)
    monkeypatch.setenv("INFERLB_ENGINE", "warp")
    with pytest.raises(ConfigError, match="INFERLB_ENGINE"):
        load_settings()
