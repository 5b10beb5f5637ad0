"""Every repository path the code, the tests and the docs cite names a file or folder that exists.

A move of a module leaves no docstring, comment or page pointing at where it used to be. Scanned:
paths that start at a top-level folder of the repository (``inferlb/routing/gate.py``,
``tests/routing/``, ``docs/install.md``) and package-relative module paths (``store/events.py``).
Not scanned: docs/benchmarks.md, whose sections record the code as it was when each figure was
taken; this file (its guard cites stale paths on purpose); and what is not ours or not in git (the
Envoy source paths docs/reliability.md cites, the copies the wheel packages under ``inferlb/_*``,
the npm packages the install scripts put in ``node_modules``).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".bpmn", ".sh", ".ini")
HISTORICAL = {"docs/benchmarks.md", "tests/test_path_references.py"}
NOT_OURS = ("docs/root/", "inferlb/_")
_TOPS = "inferlb|tests|benchmarks|docs|processes|migrations|deploy"
_PARTS = ("engine|store|routing|health|admission|autoscale|rollout|cluster|discovery|observability|versions|"
          "workflow|api|tasks|simulator|bench|live|learned|fleet|config|server|cli")
FULL = re.compile(rf"(?<![\w/.-])((?:{_TOPS})/[\w/.-]*\w)")
SHORT = re.compile(rf"(?<![\w/.-])((?:{_PARTS})/[\w/]*\w\.py)")


def _files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [f for f in out.split() if f.endswith(SUFFIXES) and f not in HISTORICAL]


def missing(text: str) -> set[str]:
    """The cited paths in ``text`` that do not exist in the repository."""
    out = set()
    for m in FULL.finditer(text):
        path = m.group(1).rstrip(".")
        if path.startswith(NOT_OURS) or "*" in path or "node_modules" in path:
            continue
        if not (ROOT / path).exists() and not (ROOT / f"{path}.py").exists():
            out.add(path)
    for m in SHORT.finditer(text):
        if not (ROOT / "inferlb" / m.group(1)).exists() and not (ROOT / m.group(1)).exists():
            out.add(m.group(1))
    return out


def test_every_cited_path_exists() -> None:
    bad = {}
    for f in _files():
        path = ROOT / f
        if path.is_file():
            found = missing(path.read_text(encoding="utf-8", errors="replace"))
            if found:
                bad[f] = sorted(found)
    assert bad == {}


def test_the_scan_sees_a_stale_path() -> None:
    # guards the guard: a module path from before the move, and one that exists
    assert missing("see inferlb/engine/settings.py and store/models.py") == {"inferlb/engine/settings.py",
                                                                             "store/models.py"}
    assert missing("see inferlb/config/settings.py and store/schema.py") == set()
