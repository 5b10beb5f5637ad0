"""Fleet file and environment settings: bad input names the file, the key path and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlb.config.settings import Settings, load_fleet_file, load_settings
from inferlb.errors import ConfigError, PluginError
from inferlb.live.startup import check_journal_dir

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
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://x', models: [zz]}]", "nodes[0].models[0]",
     "unknown model 'zz'"),
    ("models: [{name: m, fallbacks: [q]}]\nnodes: [{name: a, url: 'http://x', models: [m]}]",
     "models[0].fallbacks[0]", "unknown model 'q'"),
    # URLs: http(s), a host, a numeric port 1-65535.
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://127.0.0.1:notaport', models: [m]}]",
     "nodes[0].url", "'http://127.0.0.1:notaport' is not a valid URL"),
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://127.0.0.1:0', models: [m]}]", "nodes[0].url", "port must be"),
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://h:70000', models: [m]}]", "nodes[0].url", "not a valid URL"),
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http:///v1', models: [m]}]", "nodes[0].url", "no host"),
    ("models: [{name: m}]\nnodes: [{name: a, url: 'ftp://x', models: [m]}]", "nodes[0].url", "http:// or https://"),
    ("models: [{name: m}]\nnodes: [{name: a, url: '10.0.0.1:8000', models: [m]}]", "nodes[0].url",
     "http:// or https://"),
    # Duplicates name the entry and the earlier one.
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://x', models: [m]}, {name: b, url: 'http://y', models: [m]},"
     " {name: a, url: 'http://z', models: [m]}]", "nodes[2].name", "duplicate node name 'a' (also nodes[0])"),
    ("models: [{name: m}, {name: m}]\nnodes: [{name: a, url: 'http://x', models: [m]}]", "models[1].name",
     "duplicate model name 'm' (also models[0])"),
    # The routing profile is checked when the file is read, not inside the app at start-up.
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://x', models: [m]}]\nrouting: {profile: fastest}",
     "routing.profile", "unknown routing profile 'fastest'"),
    ("models: [{name: m}]\nnodes: [{name: a, url: 'http://x', models: [m]}]\nretry: {retry_on_status: [503, 200]}",
     "retry.retry_on_status", "not an HTTP error status (400–599): 200"),
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


def test_a_yaml_error_names_the_line_but_never_quotes_it(tmp_path: Path) -> None:
    """PyYAML's message quotes the offending line, which may hold a node's key: the error names
    line and column only (it reaches the reload answer and the logs)."""
    p = tmp_path / "fleet.yaml"
    p.write_text("models: [{name: m}]\nnodes:\n  - name: a\n    api_key: sk-node-CANARY-yaml: oops\n")
    with pytest.raises(ConfigError) as ei:
        load_fleet_file(p)
    msg = str(ei.value)
    assert "sk-node-CANARY-yaml" not in msg, msg
    assert "not valid YAML: mapping values are not allowed here (line 4, column 33)" in msg, msg


_ONE = "models: [{name: m}]\nnodes: [{name: a, url: 'http://x', models: [m]}]\n"


@pytest.mark.parametrize(("section", "where", "point", "what"), [
    ("routing: {profile: custom, filters: [healthy], scorers: {qeue-depth: 1}, picker: max-score}",
     "routing", "routing plugin", "unknown routing plugin 'qeue-depth' (known: affinity,"),
    ("autoscale: {forecaster: prophet}", "autoscale.forecaster", "forecaster",
     "unknown forecaster 'prophet' (known: holt-winters, mstl, reactive, seasonal-naive, static; or module:attr"),
    ("autoscale: {actuator: {kind: 'my_scalers:Nope'}}", "autoscale.actuator.kind", "actuator",
     "cannot load actuator 'my_scalers:Nope': ModuleNotFoundError"),
    ("health: {nodes: {a: {metrics: prometheus}}}", "health.nodes.a.metrics", "metrics format",
     "unknown metrics format 'prometheus' (known: dcgm, llamacpp, sglang, tgi, vllm; or module:attr"),
])
def test_a_name_no_extension_point_knows_is_a_plugin_error_of_the_file(
        tmp_path: Path, section: str, where: str, point: str, what: str) -> None:
    p = tmp_path / "fleet.yaml"
    p.write_text(_ONE + section + "\n")
    with pytest.raises(PluginError) as ei:
        load_fleet_file(p)
    assert (ei.value.source, ei.value.path, ei.value.point) == (str(p), where, point)
    assert str(ei.value).startswith(f"{p}: {where}: {what}")


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


def test_url_keeps_a_base_path_and_drops_the_trailing_slash(tmp_path: Path) -> None:
    p = tmp_path / "f.yaml"
    p.write_text("models: [{name: m}]\nnodes: [{name: a, url: 'https://gpu-1.internal:8443/vllm/', models: [m]}]\n")
    assert load_fleet_file(p).nodes[0].url == "https://gpu-1.internal:8443/vllm"


def test_retry_on_status_default_and_override(tmp_path: Path) -> None:
    p = tmp_path / "f.yaml"
    p.write_text("models: [{name: m}]\nnodes: [{name: a, url: 'http://x', models: [m]}]\n")
    assert load_fleet_file(p).retry.retry_on_status == {429, 500, 502, 503, 504}
    p.write_text("models: [{name: m}]\nnodes: [{name: a, url: 'http://x', models: [m]}]\n"
                 "retry: {retry_on_status: [500, 503]}\n")
    assert load_fleet_file(p).retry.retry_on_status == {500, 503}


def test_store_prompts_is_gone_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """INFERLB_STORE_PROMPTS was read by nothing: asking for stored prompts is an error that says
    inferlb never stores them; turned off it matches what inferlb does."""
    monkeypatch.setenv("INFERLB_STORE_PROMPTS", "false")
    load_settings()
    monkeypatch.setenv("INFERLB_STORE_PROMPTS", "true")
    with pytest.raises(ConfigError, match="INFERLB_STORE_PROMPTS: removed: inferlb never stores prompt"):
        load_settings()
    assert "store_prompts" not in Settings.model_fields


def test_journal_dir_is_probed(tmp_path: Path) -> None:
    check_journal_dir(tmp_path / "new" / "journal")
    assert (tmp_path / "new" / "journal").is_dir() and not list((tmp_path / "new" / "journal").iterdir())
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"INFERLB_JOURNAL_DIR: the audit journal directory .* is not writable"):
        check_journal_dir(tmp_path / "file" / "journal")


def test_workers_default_one_auto_is_the_usable_cores_and_zero_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("INFERLB_WORKERS", raising=False)
    assert load_settings().worker_count() == 1          # one process, no supervisor: as before
    monkeypatch.setenv("INFERLB_WORKERS", "3")
    assert load_settings().worker_count() == 3
    monkeypatch.setenv("INFERLB_WORKERS", "auto")
    assert load_settings().worker_count() == len(os.sched_getaffinity(0))
    for bad in ("0", "many", "300"):
        monkeypatch.setenv("INFERLB_WORKERS", bad)
        with pytest.raises(ConfigError, match="INFERLB_WORKERS"):
            load_settings()
