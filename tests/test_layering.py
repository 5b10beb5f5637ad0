"""The dependency rules of docs/architecture.md, enforced by walking every module's imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "inferlb"
IO_LIBS = {"aiohttp", "httpx", "sqlalchemy", "socket", "asyncio", "requests", "urllib", "fastapi",
           "starlette", "SpiffWorkflow", "redis"}


def _imports(path: Path) -> set[str]:
    """Absolute module names imported by ``path`` (relative imports resolved)."""
    mod_parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if mod_parts[-1] == "__init__":
        mod_parts = mod_parts[:-1]
        pkg_parts = mod_parts
    else:
        pkg_parts = mod_parts[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
                out.add(name)
                if not node.module:
                    out.update(f"{name}.{a.name}" for a in node.names)
            elif node.module:
                out.add(node.module)
    return out


def _modules(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py"))


def _starts(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("path", _modules("routing"), ids=lambda p: p.name)
def test_routing_imports_only_errors_and_itself(path: Path) -> None:
    for name in _imports(path):
        if name.startswith("inferlb"):
            assert _starts(name, "inferlb.routing") or name == "inferlb.errors", name
        assert name.split(".")[0] not in IO_LIBS, f"routing must stay I/O-free: {name}"


@pytest.mark.parametrize("path", _modules("tasks"), ids=lambda p: p.name)
def test_tasks_never_import_api_or_workflow(path: Path) -> None:
    for name in _imports(path):
        assert not _starts(name, "inferlb.api"), name
        assert not _starts(name, "inferlb.workflow"), name
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
    users = [p.relative_to(PKG).as_posix() for p in _modules("engine")
             if any(_starts(n, "inferlb.tasks") for n in _imports(p))]
    assert set(users) <= {"app.py"}, users


@pytest.mark.parametrize("path", _modules("engine"), ids=lambda p: p.relative_to(PKG).as_posix())
def test_engine_never_imports_simulator_bench_or_cli(path: Path) -> None:
    for name in _imports(path):
        for top in ("inferlb.simulator", "inferlb.bench", "inferlb.cli.main"):
            assert not _starts(name, top), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", _modules("simulator"), ids=lambda p: p.relative_to(PKG).as_posix())
def test_simulator_imports_only_shared_vocabulary_and_routing(path: Path) -> None:
    allowed = ("inferlb.simulator", "inferlb.types", "inferlb.routing", "inferlb.errors")
    for name in _imports(path):
        if name.startswith("inferlb"):
            assert any(_starts(name, a) for a in allowed), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", _modules("bench"), ids=lambda p: p.relative_to(PKG).as_posix())
def test_bench_never_imports_the_cli(path: Path) -> None:
    assert not any(_starts(n, "inferlb.cli.main") for n in _imports(path))


def test_the_walker_sees_relative_imports() -> None:
    # guards the guard: a module known to import the routing package relatively must show it
    assert "inferlb.routing" in _imports(PKG / "engine" / "scope.py")


@pytest.mark.parametrize("path", [p for p in _modules("api") if p.name != "deps.py"], ids=lambda p: p.name)
def test_routers_take_app_objects_from_deps_only(path: Path) -> None:
    """``api/deps.py`` is the one reader of ``app.state``: routers and guards take its Annotated types."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "state":
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
            assert name != "app", f"{path.name}:{node.lineno} reads app.state"
