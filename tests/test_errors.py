"""The one OpenAI error-body builder: the JSON body, the SSE error event and the exception envelope
are the same four fields. The one exception tree: errors.py's docstring draws every subclass of
InferlbError and lists every other exception class of the package as internal to its module."""

from __future__ import annotations

import ast
import builtins
import importlib
import json
import re
from functools import cache
from pathlib import Path

from inferlb.errors import AuditUnavailable, ModelNotFound, error_body, error_event, error_json

FIELDS = {"message", "type", "param", "code"}


def test_the_body_has_exactly_the_openai_fields() -> None:
    body = error_body("bad", "invalid_request_error", "invalid_value", "messages")
    assert body == {"error": {"message": "bad", "type": "invalid_request_error", "param": "messages",
                              "code": "invalid_value"}}
    assert json.loads(error_json("bad", code="x")) == error_body("bad", "invalid_request_error", "x")


def test_the_sse_error_event_carries_the_same_body() -> None:
    event = error_event("cut", "server_error", "upstream_error")
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n\n") == 1
    assert json.loads(event[len(b"data: "):]) == error_body("cut", "server_error", "upstream_error")


def test_client_errors_render_through_the_builder() -> None:
    assert ModelNotFound("m").envelope() == error_body("The model 'm' does not exist", "invalid_request_error",
                                                       "model_not_found", "model")
    env = AuditUnavailable("journal full").envelope()
    assert set(env["error"]) == FIELDS
    assert env == error_body("journal full", "server_error", "audit_unavailable")


# -- the tree is whole ------------------------------------------------------------------------------
# errors.py's docstring draws every subclass of InferlbError under its parent, with the module of a
# leaf that lives elsewhere, and lists every other exception class of the package as internal. The
# walk reads the source (ast), so a class is found whether or not anything imports its module.

PKG = Path(__file__).resolve().parents[1] / "inferlb"
ROOT_ERROR = "inferlb.errors.InferlbError"
_TREE_LINE = re.compile(r"^    (?P<rails>(?:[│ ]   )*)(?P<branch>[├└]── )?(?P<name>\w+)(?:\s+(?P<desc>.*))?$")
_INTERNAL_LINE = re.compile(r"^    (?P<name>\w+)\s+(?P<where>[\w/]+\.py): ")
_WHERE = re.compile(r"^(?P<where>[\w/]+\.py): ")


@cache
def _modules() -> dict[str, ast.Module]:
    """Every module of ``inferlb/`` (dotted) → its parsed source."""
    return {_dotted(p): ast.parse(p.read_text(encoding="utf-8")) for p in sorted(PKG.rglob("*.py"))}


def _dotted(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _where(dotted_class: str) -> str:
    """``inferlb.api.edge.UnsupportedMediaType`` → ``api/edge.py`` (the module as the tree names it)."""
    module = dotted_class.rpartition(".")[0]
    path = PKG.parent.joinpath(*module.split("."))
    return str((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(PKG))


def _bindings(tree: ast.Module) -> dict[str, str]:
    """Every name an import binds in a module → what it names, dotted (``aiohttp``, ``inferlb.errors.X``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _base(expr: ast.expr, module: str, local: set[str], bindings: dict[str, str]) -> str | None:
    """A class's base as a dotted name (None for what is not a plain name: ``Generic[T]``)."""
    if isinstance(expr, ast.Name):
        if expr.id in local:
            return f"{module}.{expr.id}"
        if expr.id in bindings:
            return bindings[expr.id]
        return f"builtins.{expr.id}" if hasattr(builtins, expr.id) else None
    if isinstance(expr, ast.Attribute):
        head = _base(expr.value, module, local, bindings)
        return None if head is None else f"{head}.{expr.attr}"
    return None


def _classes() -> dict[str, list[str]]:
    """Every class defined in ``inferlb/`` (dotted) → its bases (dotted)."""
    out: dict[str, list[str]] = {}
    for module, tree in _modules().items():
        bindings = _bindings(tree)
        defs = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        local = {n.name for n in defs}
        for node in defs:
            bases = [_base(b, module, local, bindings) for b in node.bases]
            out[f"{module}.{node.name}"] = [b for b in bases if b is not None]
    return out


def _is_foreign_exception(dotted: str) -> bool:
    module, _, name = dotted.rpartition(".")
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):   # an optional library not installed here: go by its name
        return name.endswith(("Error", "Exception"))
    return isinstance(obj, type) and issubclass(obj, BaseException)


@cache
def _exceptions() -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(the subclasses of InferlbError, every other exception class), each dotted → its bases."""
    classes = _classes()

    def ancestors(name: str, seen: frozenset[str] = frozenset()) -> set[str]:
        out: set[str] = set()
        for base in classes.get(name, []):
            if base not in seen:
                out |= {base} | ancestors(base, seen | {name})
        return out

    ours: dict[str, list[str]] = {}
    others: dict[str, list[str]] = {}
    for name, bases in classes.items():
        up = ancestors(name)
        if ROOT_ERROR in up:
            ours[name] = bases
        elif name != ROOT_ERROR and any(b not in classes and _is_foreign_exception(b) for b in up):
            others[name] = bases
    return ours, others


def _docstring() -> tuple[str, str]:
    """errors.py's docstring, split into the tree and the internal part."""
    doc = ast.get_docstring(_modules()["inferlb.errors"], clean=False) or ""
    tree, _, internal = doc.partition("Internal exceptions")
    assert internal, "errors.py's docstring has no 'Internal exceptions' part"
    return tree, internal


def _drawn() -> dict[str, tuple[str | None, str]]:
    """The tree: class name → (its parent as drawn, the module named: ``errors.py`` when none is)."""
    drawn: dict[str, tuple[str | None, str]] = {}
    stack: list[str] = []
    for line in _docstring()[0].splitlines():
        m = _TREE_LINE.match(line)
        if m is None or (not m["branch"] and m["rails"]):   # prose, or a description's second line
            continue
        depth = len(m["rails"]) // 4 + (1 if m["branch"] else 0)
        if depth and len(stack) < depth:
            continue
        del stack[depth:]
        where = _WHERE.match(m["desc"] or "")
        assert m["name"] not in drawn, f"{m['name']} is drawn twice in errors.py's tree"
        drawn[m["name"]] = (stack[-1] if stack else None, where["where"] if where else "errors.py")
        stack.append(m["name"])
    return drawn


def _internal() -> dict[str, str]:
    """The internal part: class name → the module named."""
    return {m["name"]: m["where"] for line in _docstring()[1].splitlines() if (m := _INTERNAL_LINE.match(line))}


def test_the_walk_finds_errors_outside_errors_py_and_outside_the_tree() -> None:
    # guards the guard: a leaf defined in an API router, reached through ClientError, is found with
    # its base; so is an exception whose base is a foreign library's class named by attribute
    ours, others = _exceptions()
    assert ours["inferlb.api.edge.UnsupportedMediaType"] == ["inferlb.errors.ClientError"]
    assert "inferlb.cluster.election.FencedOut" in ours       # two steps down: StoreError, InferlbError
    assert others["inferlb.server.protocol._Refused"] == ["httptools.HttpParserError"]
    assert "inferlb.errors.ClientError" in ours and ROOT_ERROR not in ours and ROOT_ERROR not in others
    drawn = _drawn()
    assert drawn["InferlbError"] == (None, "errors.py")
    assert drawn["UnsupportedMediaType"] == ("ClientError", "api/edge.py")
    assert drawn["UpstreamTimeout"] == ("UpstreamError", "errors.py")
    assert _internal()["_Refused"] == "server/protocol.py"


def test_every_subclass_of_the_base_error_is_drawn_under_its_parent_with_its_module() -> None:
    ours, _ = _exceptions()
    drawn = _drawn()
    found = {name.rpartition(".")[2]: name for name in ours} | {"InferlbError": ROOT_ERROR}
    assert len(found) == len(ours) + 1, "two subclasses of InferlbError share a name: the tree cannot tell them apart"
    missing = sorted(f"{_where(d)}: {n}" for n, d in found.items() if n not in drawn)
    assert not missing, f"subclasses of InferlbError missing from errors.py's tree: {missing}"
    stale = sorted(set(drawn) - set(found))
    assert not stale, f"errors.py's tree draws classes that do not exist: {stale}"
    for name, (parent, where) in drawn.items():
        dotted = found[name]
        assert where == _where(dotted), f"{name} lives in {_where(dotted)}, the tree says {where}"
        if parent is not None:
            bases = [b.rpartition(".")[2] for b in ours[dotted]]
            assert parent in bases, f"{name} is drawn under {parent}, its bases are {bases}"


def test_every_other_exception_is_listed_as_internal_and_stays_in_its_module() -> None:
    _, others = _exceptions()
    internal = _internal()
    listed = {name: _where(dotted) for dotted, name in ((d, d.rpartition(".")[2]) for d in others)}
    assert internal == listed, "errors.py's internal part must list every exception outside the tree " \
                               f"with its module: listed {internal}, found {listed}"
    # internal: no other module names it (an import from its module, or an attribute of that name)
    home = {d.rpartition(".")[2]: d.rpartition(".")[0] for d in others}
    for other, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                used = [a.name for a in node.names if home.get(a.name) == node.module]
            elif isinstance(node, ast.Attribute):
                used = [node.attr] if node.attr in home else []
            else:
                continue
            for name in used:
                assert home[name] == other, f"{other} uses {home[name]}.{name}: bring it into errors.py's tree"
