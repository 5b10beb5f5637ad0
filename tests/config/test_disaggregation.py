"""``role`` of a node and ``disaggregation`` of a model in the fleet file: each problem names the
file, the key path and what is wrong (config/disaggregation.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlb.config.settings import load_fleet_file
from inferlb.errors import ConfigError

PD = "disaggregation: {mode: prefill-decode, protocol: vllm-nixl}"


def _load(tmp: Path, text: str) -> object:
    p = tmp / "fleet.yaml"
    p.write_text(text)
    return load_fleet_file(p)


def test_a_disaggregated_model_with_a_prefill_and_a_decode_node_loads(tmp_path: Path) -> None:
    cfg = _load(tmp_path, f"""
models: [{{name: m, {PD}}}, {{name: plain}}]
nodes:
  - {{name: p, url: "http://p:1", models: [m], role: prefill}}
  - {{name: d, url: "http://d:1", models: [m], role: decode}}
  - {{name: x, url: "http://x:1", models: [m, plain]}}
""")
    m = cfg.model("m")  # type: ignore[attr-defined]
    assert m.disaggregation.protocol == "vllm-nixl" and m.disaggregation.min_prompt_tokens == 0
    assert m.disaggregation.colocated_fallback is True
    assert [n.role for n in cfg.nodes] == ["prefill", "decode", "both"]  # type: ignore[attr-defined]
    assert cfg.model("plain").disaggregation is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(("text", "where", "what"), [
    # no prefill-capable node
    (f"models: [{{name: m, {PD}}}]\nnodes: [{{name: d, url: 'http://d:1', models: [m], role: decode}}]",
     "models[0].disaggregation", "no node serving it can prefill"),
    # no decode-capable node
    (f"models: [{{name: m, {PD}}}]\nnodes: [{{name: p, url: 'http://p:1', models: [m], role: prefill}}]",
     "models[0].disaggregation", "no node serving it can decode"),
    # a role node serving a model that is not disaggregated
    ("models: [{name: m}]\nnodes: [{name: p, url: 'http://p:1', models: [m], role: prefill}]",
     "nodes[0].models[0]", "has no disaggregation"),
    # typos are caught where they are
    ("models: [{name: m}]\nnodes: [{name: p, url: 'http://p:1', models: [m], role: prefil}]",
     "nodes[0].role", "'prefill', 'decode' or 'both'"),
    ("models: [{name: m, disaggregation: {mode: prefill-decode, protocol: sglang}}]\n"
     "nodes: [{name: p, url: 'http://p:1', models: [m]}]", "models[0].disaggregation.protocol", "vllm-nixl"),
    ("models: [{name: m, disaggregation: {modes: x}}]\nnodes: [{name: p, url: 'http://p:1', models: [m]}]",
     "models[0].disaggregation.modes", "unknown key"),
    ("models: [{name: m, disaggregation: {min_prompt_tokens: -1}}]\n"
     "nodes: [{name: p, url: 'http://p:1', models: [m]}]", "models[0].disaggregation.min_prompt_tokens",
     "greater than or equal to 0"),
    (f"models: [{{name: e, kind: embedding, {PD}}}]\nnodes: [{{name: p, url: 'http://p:1', models: [e]}}]",
     "models[0].disaggregation", "only an llm model"),
])
def test_problems_name_the_key_path(tmp_path: Path, text: str, where: str, what: str) -> None:
    with pytest.raises(ConfigError) as ei:
        _load(tmp_path, text)
    assert ei.value.path == where and what in ei.value.message, str(ei.value)
    assert str(ei.value).startswith(str(tmp_path / "fleet.yaml"))


def test_both_nodes_alone_serve_a_disaggregated_model(tmp_path: Path) -> None:
    cfg = _load(tmp_path, f"models: [{{name: m, {PD}}}]\nnodes: [{{name: x, url: 'http://x:1', models: [m]}}]")
    assert cfg.nodes[0].role == "both"  # type: ignore[attr-defined]
