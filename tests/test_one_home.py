"""One home per name: no re-exports (docs/architecture.md: "No re-exports kept after a move").

A name is imported from the module that defines it, never from one that imports it in turn, and a
module's ``__all__`` lists only what the module itself defines. Read from the source (ast), so a
re-export is caught whether or not anything imports it yet.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "inferlb"
IMPORTERS = ("inferlb", "tests", "migrations")


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_dotted(p): p for p in sorted(PKG.rglob("*.py"))}


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The module's own statements, also those under ``if`` / ``try`` (a conditional definition)."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            yield from _top_level(stmt.body)
            yield from _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for part in (stmt.body, stmt.orelse, stmt.finalbody, *(h.body for h in stmt.handlers)):
                yield from _top_level(part)
        else:
            yield stmt


def _names(target: ast.expr) -> Iterator[str]:
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for elt in target.elts:
            yield from _names(elt)


def defined_in(tree: ast.Module) -> set[str]:
    """What a module defines itself: functions, classes, assigned names (not what it imports)."""
    out: set[str] = set()
    for stmt in _top_level(tree.body):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(stmt.name)
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                out.update(_names(target))
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
            out.update(_names(stmt.target))
    return out


@cache
def _defined(module: str) -> frozenset[str]:
    return frozenset(defined_in(ast.parse(MODULES[module].read_text(encoding="utf-8"))))


def _all_of(tree: ast.Module) -> list[str]:
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, ast.AnnAssign):
            targets = [stmt.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and stmt.value is not None:
            assert isinstance(stmt.value, (ast.List, ast.Tuple)), "__all__ is a literal list"
            return [ast.literal_eval(e) for e in stmt.value.elts]
    return []


def reexports(module: str, tree: ast.Module) -> list[str]:
    """Names ``module``'s ``__all__`` lists without defining them (a submodule counts as defined)."""
    own = defined_in(tree)
    return [n for n in _all_of(tree) if n not in own and f"{module}.{n}" not in MODULES]


def misdirected(tree: ast.Module) -> list[str]:
    """``from inferlb.X import n`` where ``X`` does not define ``n`` (and ``n`` is no submodule)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module in MODULES:
            for alias in node.names:
                if alias.name not in _defined(node.module) and f"{node.module}.{alias.name}" not in MODULES:
                    out.append(f"line {node.lineno}: from {node.module} import {alias.name}")
    return out


def _importers() -> list[Path]:
    return sorted(p for top in IMPORTERS for p in (ROOT / top).rglob("*.py"))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_all_lists_only_what_the_module_defines(module: str) -> None:
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    assert not reexports(module, tree), f"{module} re-exports {reexports(module, tree)}: import them from their home"


@pytest.mark.parametrize("path", _importers(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_import_names_the_module_that_defines_the_name(path: Path) -> None:
    bad = misdirected(ast.parse(path.read_text(encoding="utf-8")))
    assert not bad, f"{path.relative_to(ROOT)} imports names from a module that only imports them: {bad}"


def test_the_checks_catch_a_reexport() -> None:
    # guards the guards: a package that re-imports a class to list it, and a module importing the
    # class from that package, are both caught; the class's own home and a submodule are not
    shim = ast.parse('from inferlb.routing.profiles import Router\n__all__ = ["Router", "profiles"]\n')
    assert reexports("inferlb.routing", shim) == ["Router"]
    user = ast.parse("def f():\n    from inferlb.fleet.state import Fleet, NodeState\n"
                     "from inferlb.routing import profiles\nfrom inferlb.routing.profiles import Router\n")
    assert misdirected(user) == ["line 2: from inferlb.fleet.state import NodeState"]
    assert "Fleet" in _defined("inferlb.fleet.state") and "NodeState" in _defined("inferlb.fleet.node")
