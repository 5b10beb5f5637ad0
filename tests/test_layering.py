"""The house's floors (docs/architecture.md), enforced by walking every module's imports.

``FLOORS`` is the one statement of the rules: each top-level part of ``inferlb/`` has a floor, and a
module imports only from its own floor or below. Every part must be listed (new code takes a floor
before it lands), and no two packages, at any depth, import each other round a circle. The studies
in benchmarks/ (repo root, outside the wheel) stand above every floor: they may import inferlb but
no command of inferlb/cli, and nothing in inferlb imports them.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "inferlb"
#: The studies outside the wheel (repo root): they may import inferlb, never the other way round.
BENCHMARKS = PKG.parent / "benchmarks"
IO_LIBS = {"aiohttp", "httpx", "sqlalchemy", "socket", "asyncio", "requests", "urllib", "fastapi",
           "starlette", "SpiffWorkflow", "redis"}

#: part of ``inferlb`` → floor. A module may import from its own floor and below, never above.
FLOORS: dict[str, int] = {
    # 1 ground: the shared vocabulary (the exception tree, clocks, node samples and events, waits,
    #   the hot paths' JSON codec),
    #   the one loader of every extension point's "module:attr" table, and the one background
    #   runner every loop starts, stops and reports through
    "inferlb": 1, "inferlb.errors": 1, "inferlb.types": 1, "inferlb.node_types": 1, "inferlb.wakeup": 1,
    "inferlb.plugins": 1, "inferlb.background": 1, "inferlb.jsoncodec": 1,
    # 2 the routing core: pure, I/O-free (filters, scorers, pickers, profiles, the learned model, OPE)
    "inferlb.routing": 2,
    # 3 configuration: INFERLB_* settings and the fleet-file schema, one module per feature's config;
    #   the simulator (emulated nodes, DES) stands beside it: it knows only routing and the vocabulary;
    #   so does modelserver (real model servers started on this machine: llama.cpp)
    "inferlb.config": 3, "inferlb.simulator": 3, "inferlb.modelserver": 3,
    # 4 plumbing: the BPMN engine, the database (engines, the one schema, audit pipeline, reports),
    #   the HTTP server, the cost formula
    "inferlb.workflow": 4, "inferlb.store": 4, "inferlb.server": 4, "inferlb.cost": 4,
    # 5 the fleet's live state (nodes, their counters, the health state machine's arithmetic)
    "inferlb.fleet": 5,
    # 6 features a request consults on its way
    "inferlb.admission": 6, "inferlb.versions": 6, "inferlb.health": 6, "inferlb.observability": 6,
    "inferlb.cluster": 6, "inferlb.tiers": 6, "inferlb.kvevents": 6,
    # 7 the request path: gateway, scope, upstream, SSE relay, request end
    "inferlb.engine": 7,
    # 8 features that run beside the request path and change what it uses
    "inferlb.rollout": 8, "inferlb.autoscale": 8, "inferlb.learned": 8, "inferlb.live": 8,
    "inferlb.discovery": 8,
    # 9 adapters: HTTP routes (api) and BPMN service operations (tasks)
    "inferlb.api": 9, "inferlb.tasks": 9,
    # 10 the one composition root
    "inferlb.app": 10,
    # 11 commands: the CLI's one table and the load generator it runs
    "inferlb.cli": 11, "inferlb.bench": 11,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Absolute module names imported by ``path`` (relative imports resolved; ``from P import m``
    counts ``P.m`` when that is a module, so a submodule imported by name is seen)."""
    mod_parts = _module_name(path).split(".")
    pkg_parts = mod_parts if path.name == "__init__.py" else mod_parts[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in _ALL)
    return out


def _modules(sub: str = "") -> list[Path]:
    return sorted((PKG / sub).rglob("*.py"))


_ALL = {_module_name(p) for p in _modules()}


def _starts(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _part(name: str) -> str | None:
    """The ``FLOORS`` key that holds module ``name`` (the longest prefix), or None."""
    best = None
    for key in FLOORS:
        if _starts(name, key) and (best is None or len(key) > len(best)):
            best = key
    return best


def _package(name: str) -> str:
    """The package a module lives in (a package's ``__init__`` lives in the package itself); a
    module at the root of ``inferlb/`` (``errors``, ``app`` …) is a part of its own."""
    if (PKG.parent / Path(*name.split(".")) / "__init__.py").is_file():
        return name
    parent = name.rpartition(".")[0]
    return name if parent == "inferlb" else parent


def test_every_part_of_the_package_has_a_floor() -> None:
    tops = {"inferlb." + (p.stem if p.is_file() else p.name) for p in PKG.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert tops - set(FLOORS) == set(), "give these a floor in FLOORS and docs/architecture.md"
    assert set(FLOORS) - tops - {"inferlb"} == set(), "FLOORS names parts that no longer exist"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(PKG).as_posix())
def test_no_import_runs_up_a_floor(path: Path) -> None:
    me = _module_name(path)
    here = _part(me)
    assert here is not None
    for name in _imports(path):
        if not _starts(name, "inferlb") or (name not in _ALL and _part(name) is None):
            continue
        there = _part(name)
        assert there is not None, name
        assert FLOORS[there] <= FLOORS[here], f"{me} (floor {FLOORS[here]}) imports {name} (floor {FLOORS[there]})"


def _package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in _modules():
        src = _package(_module_name(path))
        for name in _imports(path):
            if name in _ALL:
                dst = _package(name)
                if dst != src:
                    graph[src].add(dst)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_package_level_cycle() -> None:
    assert _cycles(_package_graph()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    # guards the guard
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_walker_sees_imports_of_submodules_by_name() -> None:
    # guards the guard: app.py takes its routers as `from inferlb.api import admin, ...`
    assert "inferlb.api.admin" in _imports(PKG / "app.py")
    assert _package("inferlb.api.admin") == "inferlb.api" and _package("inferlb.api") == "inferlb.api"


@pytest.mark.parametrize("path", _modules("routing"), ids=lambda p: p.name)
def test_routing_imports_only_the_vocabulary_and_itself(path: Path) -> None:
    for name in _imports(path):
        if name.startswith("inferlb"):
            assert _starts(name, "inferlb.routing") or name in ("inferlb.errors", "inferlb.types",
                                                                 "inferlb.plugins"), name
        assert name.split(".")[0] not in IO_LIBS, f"routing must stay I/O-free: {name}"


@pytest.mark.parametrize("path", _modules("tasks"), ids=lambda p: p.name)
def test_tasks_never_import_api_or_workflow(path: Path) -> None:
    for name in _imports(path):
        assert not _starts(name, "inferlb.api"), name
        assert not _starts(name, "inferlb.workflow") or name == "inferlb.workflow.services", name
        assert not _starts(name, "SpiffWorkflow"), name


@pytest.mark.parametrize("path", _modules("workflow"), ids=lambda p: p.name)
def test_workflow_does_not_import_tasks(path: Path) -> None:
    assert not any(_starts(n, "inferlb.tasks") for n in _imports(path))


@pytest.mark.parametrize("path", _modules("api"), ids=lambda p: p.name)
def test_api_imports_neither_tasks_nor_spiff(path: Path) -> None:
    for name in _imports(path):
        assert not _starts(name, "inferlb.tasks"), name
        assert not _starts(name, "SpiffWorkflow"), name
        assert not _starts(name, "inferlb.workflow"), name


def test_only_app_wires_tasks_into_the_engine() -> None:
    users = {_module_name(p) for p in _modules() if not _starts(_module_name(p), "inferlb.tasks")
             and any(_starts(n, "inferlb.tasks") for n in _imports(p))}
    assert users <= {"inferlb.app", "inferlb.cli.validate"} | {m for m in users if _starts(m, "inferlb.bench")}, users


@pytest.mark.parametrize("path", [p for p in _modules() if not _starts(_module_name(p), "inferlb.cli")
                                  and not _starts(_module_name(p), "inferlb.bench")],
                         ids=lambda p: p.relative_to(PKG).as_posix())
def test_nothing_below_the_commands_imports_simulator_bench_or_cli(path: Path) -> None:
    if _starts(_module_name(path), "inferlb.simulator"):
        return
    for name in _imports(path):
        for top in ("inferlb.simulator", "inferlb.bench", "inferlb.cli"):
            assert not _starts(name, top), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", _modules("simulator"), ids=lambda p: p.relative_to(PKG).as_posix())
def test_simulator_imports_only_shared_vocabulary_and_routing(path: Path) -> None:
    allowed = ("inferlb.simulator", "inferlb.types", "inferlb.routing", "inferlb.errors", "inferlb.plugins")
    for name in _imports(path):
        if name.startswith("inferlb"):
            assert any(_starts(name, a) for a in allowed), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", _modules("bench"), ids=lambda p: p.relative_to(PKG).as_posix())
def test_bench_never_imports_the_cli(path: Path) -> None:
    assert not any(_starts(n, "inferlb.cli") for n in _imports(path))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.relative_to(PKG).as_posix())
def test_the_wheel_never_imports_the_benchmarks(path: Path) -> None:
    assert not any(_starts(n, "benchmarks") for n in _imports(path)), f"{path.name} imports benchmarks/"


def _benchmarks() -> list[Path]:
    return sorted(BENCHMARKS.rglob("*.py"))


def test_the_benchmarks_are_found() -> None:
    # guards the guard: the studies docs/benchmarks.md runs live in benchmarks/
    assert BENCHMARKS / "des_speed.py" in _benchmarks()


@pytest.mark.parametrize("path", _benchmarks(), ids=lambda p: p.relative_to(BENCHMARKS).as_posix())
def test_benchmarks_import_no_command(path: Path) -> None:
    assert not any(_starts(n, "inferlb.cli") for n in _imports(path)), f"{path.name} imports inferlb.cli"


@pytest.mark.parametrize("path", [p for p in _modules("api") if p.name != "deps.py"], ids=lambda p: p.name)
def test_routers_take_app_objects_from_deps_only(path: Path) -> None:
    """``api/deps.py`` is the one reader of ``app.state``: routers and guards take its Annotated types."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "state":
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
            assert name != "app", f"{path.name}:{node.lineno} reads app.state"


def test_tests_mirror_the_package_folders() -> None:
    """A reader finds a part's tests by its path: every package ``inferlb/<part>/`` has ``tests/<part>/``."""
    tests = PKG.parent / "tests"
    parts = sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").is_file())
    assert len(parts) > 10  # guards the guard: the walk sees the packages
    assert [p for p in parts if not (tests / p).is_dir()] == []
