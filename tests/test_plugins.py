"""The one loader of extension points (inferlb/plugins.py): a built-in name, a user's module:attr,
and every way a name can fail, each one PluginError naming the point, the name and the known names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferlb.errors import ConfigError, PluginError
from inferlb.plugins import Table, is_target

TABLE = Table("widget", {"dumps": "json:dumps", "error": "inferlb.errors:PluginError"})


def test_a_builtin_name_loads_its_target() -> None:
    assert TABLE.load("dumps") is json.dumps
    assert TABLE.target("error") == "inferlb.errors:PluginError"
    assert "dumps" in TABLE and TABLE.names() == ("dumps", "error") and dict(TABLE)["dumps"] == "json:dumps"


def test_a_module_attr_of_ones_own_loads_and_may_be_dotted() -> None:
    assert TABLE.load("json:loads") is json.loads
    assert TABLE.load("inferlb.plugins:Table.names") is Table.names


def test_an_unknown_name_names_the_point_the_name_and_the_known_names() -> None:
    with pytest.raises(PluginError) as info:
        TABLE.load("nope")
    err = info.value
    assert isinstance(err, ConfigError)
    assert str(err) == "unknown widget 'nope' (known: dumps, error; or module:attr of your own)"
    assert (err.point, err.name, err.known) == ("widget", "nope", ("dumps", "error"))


def test_a_table_without_custom_names_refuses_module_attr() -> None:
    closed = Table("gadget", {"dumps": "json:dumps"}, custom=False)
    with pytest.raises(PluginError, match=r"^unknown gadget 'json:loads' \(known: dumps\)$"):
        closed.load("json:loads")


def test_a_module_that_does_not_import() -> None:
    with pytest.raises(PluginError) as info:
        TABLE.load("no_such_module_here:Thing")
    assert str(info.value) == ("cannot load widget 'no_such_module_here:Thing': ModuleNotFoundError: No module "
                               "named 'no_such_module_here' (known: dumps, error; or module:attr of your own)")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_a_module_whose_import_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_widget_mod.py").write_text("raise RuntimeError('half written')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PluginError, match=r"cannot load widget 'broken_widget_mod:W': RuntimeError: half written"):
        TABLE.load("broken_widget_mod:W")


def test_an_attribute_the_module_lacks() -> None:
    with pytest.raises(PluginError) as info:
        TABLE.load("json:nope")
    assert str(info.value) == ("cannot load widget 'json:nope': 'json' has no attribute 'nope' "
                               "(known: dumps, error; or module:attr of your own)")
    with pytest.raises(PluginError, match=r"'inferlb.plugins.Table' has no attribute 'nope'"):
        TABLE.load("inferlb.plugins:Table.nope")


def test_check_passes_builtins_without_importing_and_loads_ones_own() -> None:
    lazy = Table("widget", {"later": "no_such_module_here:Thing"})
    assert lazy.check("later") == "later"        # a built-in is trusted: its import waits for the build
    assert lazy.check("json:dumps") == "json:dumps"
    with pytest.raises(PluginError, match="cannot load widget 'json:nope'"):
        lazy.check("json:nope")
    with pytest.raises(PluginError, match="unknown widget"):
        lazy.check("")


def test_the_module_attr_shape() -> None:
    assert is_target("pkg.mod:Attr") and is_target("m:A.b")
    assert not any(is_target(s) for s in ("mod", ":A", "mod:", "a b:C", "fleet.yaml", "C:\\fleet.yaml", "m:A:b"))


def test_a_builtin_target_must_have_the_shape() -> None:
    with pytest.raises(ValueError, match="widget table"):
        Table("widget", {"x": "json.dumps"})


def test_a_located_error_keeps_what_it_says_and_adds_where() -> None:
    err = TABLE.error("x", "unknown widget 'x'").located(source="fleet.yaml", path="widgets[0]")
    assert isinstance(err, PluginError) and err.point == "widget" and err.known == ("dumps", "error")
    assert str(err).startswith("fleet.yaml: widgets[0]: unknown widget 'x' (known: dumps, error")


# -- every extension point is a table of this shape, and every built-in target loads ----------------


def _points() -> dict[str, Table]:
    from inferlb.config.autoscale import ACTUATORS, FORECASTERS
    from inferlb.config.health import METRICS_PARSERS
    from inferlb.routing.lifecycle import PREDICTORS
    from inferlb.routing.registry import BUILTINS
    from inferlb.simulator.presets import FLEETS

    return {"routing plugin": BUILTINS, "predictor": PREDICTORS, "actuator": ACTUATORS,
            "forecaster": FORECASTERS, "metrics format": METRICS_PARSERS, "simulated fleet": FLEETS}


@pytest.mark.parametrize("point", list(_points()))
def test_every_extension_point_is_one_table_whose_builtins_load(point: str) -> None:
    table = _points()[point]
    assert isinstance(table, Table) and table.point == point and table.custom
    for name in table:
        assert callable(table.load(name)), f"{point} {name}: {table[name]}"
    with pytest.raises(PluginError, match=f"unknown {point} 'no-such-name'"):
        table.load("no-such-name")


def test_the_configured_names_of_old_keep_working() -> None:
    points = _points()
    assert set(points["actuator"]) == {"local", "kubernetes", "webhook", "dry-run"}
    assert set(points["forecaster"]) == {"seasonal-naive", "holt-winters", "mstl", "reactive", "static"}
    assert set(points["metrics format"]) == {"vllm", "tgi", "sglang", "dcgm", "llamacpp"}
    assert set(points["predictor"]) == {"online-linear"}
    assert set(points["simulated fleet"]) == {"hetero4", "cache4", "uniform4", "large16"}
