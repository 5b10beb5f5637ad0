"""Every document the code and the docs cite lives in the repo: a ``docs/<name>.md`` reference names
a file that exists, a ``§`` reference names a heading of that file, a bar row (B1–B10) or a test id
(C-01, V-12 …) is in it, and nothing cites the design documents that never were in the repo."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("inferlb", "benchmarks", "tests", "processes", "docs", "deploy", "migrations")
SUFFIXES = {".py", ".md", ".bpmn", ".yaml", ".yml", ".toml", ".ini"}
DOC_REF = re.compile(r"docs/([A-Za-z0-9_.-]+\.md)((?:[ ,;]+(?:§\s?\d+(?:\.\d+)*|B\d+|[A-Z]-\d+(?:\.\.[A-Z]?-?\d+)?))*)")
OUTSIDE = re.compile(r"RELIABILITY(?:\.md)?\b|ARCHITECTURE\.md|SPIFFWORKFLOW-NOTES|design card")


# Installed third-party trees (the modeler check's npm packages, virtual environments) are not ours.
_VENDORED = {"node_modules", ".venv", "venv", "__pycache__"}


def _sources() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "pyproject.toml"]
    for top in SCANNED:
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in SUFFIXES and p.is_file()
                  and not _VENDORED.intersection(p.relative_to(ROOT).parts)]
    return sorted(files)


def _refs() -> list[tuple[str, int, str, str]]:
    """(file, line, cited doc, what follows it: sections, rows, test ids)."""
    out = []
    for path in _sources():
        for no, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            for m in DOC_REF.finditer(line):
                out.append((str(path.relative_to(ROOT)), no, m.group(1), m.group(2)))
    return out


def _anchors(doc: Path) -> tuple[set[str], str]:
    """What ``§`` may name in ``doc``: its numbered headings ("9", "9.2") and the numbered items of a
    section ("5.6": item 6 of section 5's list); and its whole text."""
    text = doc.read_text(encoding="utf-8")
    anchors: set[str] = set()
    section: str | None = None
    for line in text.splitlines():
        head = re.match(r"#{2,4}\s+(\d+(?:\.\d+)*)\b", line)
        if head:
            section = head.group(1)
            anchors.add(section)
        elif line.startswith("#"):
            section = None
        elif section is not None and (item := re.match(r"(\d+)\.\s", line)):
            anchors.add(f"{section}.{item.group(1)}")
    return anchors, text


def test_the_scan_finds_the_references_the_code_makes() -> None:
    # guards the guard: the gateway's docstring cites the streaming section of the reliability doc
    refs = _refs()
    assert ("inferlb/engine/gateway.py", "reliability.md") in {(f, d) for f, _, d, _ in refs}
    assert any(tail.strip().startswith("§") for *_, tail in refs)


@pytest.mark.parametrize("ref", _refs(), ids=lambda r: f"{r[0]}:{r[1]}")
def test_cited_document_and_section_exist(ref: tuple[str, int, str, str]) -> None:
    where, line, name, tail = ref
    doc = ROOT / "docs" / name
    assert doc.is_file(), f"{where}:{line} cites docs/{name}, which is not in the repo"
    sections, text = _anchors(doc)
    for sec in re.findall(r"§\s?(\d+(?:\.\d+)*)", tail):
        assert sec in sections, f"{where}:{line} cites docs/{name} §{sec}, which has no such heading"
    for row in re.findall(r"\b(B\d+|[A-Z]-\d+)\b", tail):
        assert re.search(rf"\b{re.escape(row)}\b", text), f"{where}:{line} cites {row}, not in docs/{name}"


def test_nothing_cites_documents_outside_the_repo() -> None:
    bad = [f"{p.relative_to(ROOT)}:{no}: {line.strip()}"
           for p in _sources() if p.name != "test_doc_references.py"
           for no, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
           if OUTSIDE.search(line)]
    assert not bad, "\n".join(bad)
