"""docs/architecture.md's map of the house is generated from the code and kept true by this test.

The block between the ``<!-- house:begin -->`` and ``<!-- house:end -->`` markers lists every part
of ``inferlb/`` by floor (tests/test_layering.py ``FLOORS``) and every folder under it, each with
the first line of its docstring. When the code moves, regenerate the block::

    python tests/test_architecture_doc.py --write
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "inferlb"
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- house:begin -->", "<!-- house:end -->"

sys.path.insert(0, str(ROOT))
from tests.test_layering import FLOORS  # noqa: E402  (after the path: run as a script too)

FLOOR_NAMES = {
    1: "ground: the shared vocabulary",
    2: "the routing core (pure, I/O-free)",
    3: "configuration; the simulator stands beside it",
    4: "plumbing",
    5: "the fleet's live state",
    6: "features a request consults",
    7: "the request path",
    8: "features beside the request path",
    9: "adapters",
    10: "the composition root",
    11: "commands",
}


def _summary(path: Path) -> str:
    """The first line of a module's (or a package's ``__init__``) docstring."""
    target = path / "__init__.py" if path.is_dir() else path
    doc = ast.get_docstring(ast.parse(target.read_text())) or ""
    line = doc.strip().splitlines()[0] if doc.strip() else ""
    return line.rstrip(".").replace("``", "`")


def _folders(path: Path) -> list[Path]:
    """Every folder under ``path`` holding Python code, depth first."""
    out = []
    for sub in sorted(p for p in path.iterdir() if p.is_dir() and (p / "__init__.py").is_file()):
        out.append(sub)
        out.extend(_folders(sub))
    return out


def house() -> str:
    """The generated block (without the markers)."""
    lines = ["```"]
    by_floor: dict[int, list[str]] = {}
    for part, floor in FLOORS.items():
        if part != "inferlb":
            by_floor.setdefault(floor, []).append(part)
    for floor in sorted(by_floor, reverse=True):
        lines.append(f"floor {floor:>2}  {FLOOR_NAMES[floor]}")
        for part in sorted(by_floor[floor]):
            rel = Path(*part.split(".")[1:])
            path = PKG / rel if (PKG / rel).is_dir() else PKG / rel.with_suffix(".py")
            name = f"{rel.as_posix()}/" if path.is_dir() else path.name
            lines.append(f"  {name:<22}{_summary(path)}")
            if path.is_dir():
                for sub in _folders(path):
                    lines.append(f"    {sub.relative_to(PKG).as_posix() + '/':<20}{_summary(sub)}")
    lines.append("```")
    return "\n".join(lines)


def _current() -> str:
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC} lost its {BEGIN} / {END} markers"
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def test_the_map_of_the_house_is_the_code_as_it_is() -> None:
    assert _current() == house(), "regenerate it: python tests/test_architecture_doc.py --write"


def test_every_folder_of_the_package_is_on_the_map() -> None:
    block = _current()
    for folder in _folders(PKG):
        assert f"{folder.relative_to(PKG).as_posix()}/" in block, folder


def _write() -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(f"{head}{BEGIN}\n{house()}\n{END}{tail}")


if __name__ == "__main__":
    if "--write" in sys.argv:
        _write()
    else:
        print(house())
