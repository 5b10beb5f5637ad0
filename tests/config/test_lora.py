"""The fleet file's ``lora:``: adapters validated with their key path, the default profile, the upstream name."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlb.config.settings import fleet_from_mapping, load_fleet_file
from inferlb.errors import ConfigError

FILE = """
models:
  - name: sql-assistant
    lora: {adapter: sql-lora, base: llama-3-8b}
  - name: support-bot
    lora: {base: llama-3-8b, failure_cooldown_s: 60}
    versions:
      - {name: v1, weight: 90, upstream_name: support-lora-v1}
      - {name: v2, weight: 10, upstream_name: support-lora-v2}
  - name: llama-3-8b
nodes:
  - {name: a, url: "http://10.0.0.1:8000", models: [sql-assistant, support-bot, llama-3-8b]}
"""


def test_a_lora_fleet_routes_with_lora_affinity_by_default(tmp_path: Path) -> None:
    p = tmp_path / "f.yaml"
    p.write_text(FILE)
    cfg = load_fleet_file(p)
    sql = cfg.model("sql-assistant")
    assert sql is not None and sql.lora is not None and sql.lora.adapter == "sql-lora"
    assert sql.lora.failure_cooldown_s == 30.0
    assert cfg.routing.profile == "lora-affinity"
    names = [type(f).__name__ for f in cfg.routing.build_router().filters]
    assert "LoraAvailable" in names


def test_a_profile_of_its_own_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "f.yaml"
    p.write_text(FILE + "routing: {profile: least-connections}\n")
    assert load_fleet_file(p).routing.profile == "least-connections"
    p.write_text(FILE.replace("lora: {adapter: sql-lora, base: llama-3-8b}", "upstream_name: sql-lora")
                 .replace("lora: {base: llama-3-8b, failure_cooldown_s: 60}", ""))
    assert load_fleet_file(p).routing.profile == "token-aware"     # no LoRA model: the usual default


@pytest.mark.parametrize(("model", "where", "what"), [
    ("{name: m, lora: {adapter: 'two words'}}", "models[0].lora.adapter", "no commas or spaces"),
    ("{name: m, lora: {adapter: x, colour: red}}", "models[0].lora.colour", "unknown key"),
    ("{name: m, lora: {failure_cooldown_s: 0}}", "models[0].lora.failure_cooldown_s", "greater than 0"),
    ("{name: m, upstream_name: y, lora: {adapter: x}}", "models[0].lora.adapter", "give one of them"),
    ("{name: m, lora: {}, versions: [{name: v1, upstream_name: 'a,b'}]}", "models[0].versions[0].upstream_name",
     "served as a LoRA adapter"),
    ("{name: 'm m', lora: {}}", "models[0].name", "served as a LoRA adapter"),
])
def test_bad_lora_settings_name_their_key_path(tmp_path: Path, model: str, where: str, what: str) -> None:
    p = tmp_path / "fleet.yaml"
    name = "m m" if "'m m'" in model else "m"
    p.write_text(f"models: [{model}]\nnodes: [{{name: a, url: 'http://x', models: ['{name}']}}]\n")
    with pytest.raises(ConfigError) as ei:
        load_fleet_file(p)
    msg = str(ei.value)
    assert msg.startswith(str(p)) and where in msg and what in msg, msg


def test_the_inline_fleet_gets_the_same_default() -> None:
    cfg = fleet_from_mapping({"models": [{"name": "m", "lora": {"adapter": "m-lora"}}],
                              "nodes": [{"name": "a", "url": "http://x", "models": ["m"]}]})
    assert cfg.routing.profile == "lora-affinity"
    again = fleet_from_mapping(cfg.model_dump())     # a reload of the dumped config keeps it
    assert again.routing.profile == "lora-affinity" and again.models[0].lora == cfg.models[0].lora
