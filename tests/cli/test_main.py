"""The ``inferlb`` command table (inferlb/cli/main.py): every command registers its own parser and
handler, ``main`` runs the handler, and building the parser imports no heavy module."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

import pytest

from inferlb.cli import main as cli_main
from inferlb.cli.bench import BENCHES
from inferlb.cli.main import COMMANDS, build_parser, main
from inferlb.cli.shared import DeferredParser
from inferlb.errors import ConfigError
from inferlb.plugins import Table
from tests.support import ROOT

# What the gateway's request path or a command's handler imports; none is needed to parse.
HEAVY = ("numpy", "sqlalchemy", "httpx", "aiohttp", "rich", "pydantic", "yaml", "fastapi", "starlette", "uvicorn",
         "SpiffWorkflow", "alembic", "redis")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_the_parser_lists_the_table_in_its_order() -> None:
    assert list(_subcommands(build_parser())) == list(COMMANDS) == [
        "demo", "serve", "validate", "db", "report", "sim", "fleet", "autoscale", "agent", "keys", "routing",
        "rollout", "bench"]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_registers_its_parser_and_a_handler(name: str) -> None:
    root = argparse.ArgumentParser(prog="inferlb")
    sub = root.add_subparsers(dest="cmd")
    COMMANDS.load(name)(sub)
    parsers = _subcommands(root)
    assert list(parsers) == [name]
    # A command with subcommands may set the handler on each of them (autoscale backtest) instead.
    leaves = [parsers[name], *_leaves(parsers[name])]
    assert any(callable(p.get_default("handler")) for p in leaves), name


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out: list[argparse.ArgumentParser] = []
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for p in a.choices.values():
                out += [p, *_leaves(p)]
    return out


def test_every_bench_target_resolves() -> None:
    for what in BENCHES:
        assert callable(BENCHES.load(what)), what


def test_building_the_parser_imports_no_heavy_module() -> None:
    code = ("import sys; import inferlb.cli.main as m; m.build_parser(); "
            "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         timeout=60).stdout.split()
    assert sorted(set(out) & set(HEAVY)) == []


def test_python_m_inferlb_cli_is_the_command() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = [subprocess.run([sys.executable, "-m", mod, "--help"], env=env, capture_output=True, text=True,
                           timeout=60) for mod in ("inferlb.cli", "inferlb.cli.main")]
    assert [r.returncode for r in runs] == [0, 0]
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.startswith("usage: inferlb ")


def test_a_deferred_parser_adds_its_arguments_once_when_first_used() -> None:
    calls: list[argparse.ArgumentParser] = []

    def add(p: argparse.ArgumentParser) -> None:
        calls.append(p)
        p.add_argument("--x", type=int, default=3)

    root = argparse.ArgumentParser(prog="t")
    sub = root.add_subparsers(dest="cmd", parser_class=DeferredParser)
    leaf = sub.add_parser("leaf", add_arguments=add)
    assert calls == []
    assert root.parse_args(["leaf"]).x == 3
    assert "--x X" in leaf.format_help() and root.parse_args(["leaf", "--x", "5"]).x == 5
    assert calls == [leaf]


def _register_fake(sub: Any) -> None:
    p = sub.add_parser("fake")
    p.add_argument("what", choices=["ok", "config", "interrupt"])
    p.set_defaults(handler=_fake)
    s = sub.add_parser("fake-server")
    s.set_defaults(handler=lambda args: _fake(argparse.Namespace(what="interrupt")), ctrl_c_status=0)


def _fake(args: argparse.Namespace) -> int:
    if args.what == "config":
        raise ConfigError("bad key\n  on two lines", source="fleet.yaml", path="nodes[0]")
    if args.what == "interrupt":
        raise KeyboardInterrupt
    return 7


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_main, "COMMANDS", Table("command", {**COMMANDS, "fake": f"{__name__}:_register_fake"},
                                                   custom=False))


@pytest.mark.usefixtures("fake")
def test_main_returns_the_handlers_status_and_maps_errors_and_ctrl_c(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fake", "ok"]) == 7
    assert main(["fake", "config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("inferlb: error: ") and "bad key on two lines" in err[0]
    assert main(["fake", "interrupt"]) == 130
    assert main(["fake-server"]) == 0
