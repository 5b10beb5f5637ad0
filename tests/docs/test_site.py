"""The docs site and the README that leads to it: ``mkdocs build --strict`` passes (every page in
the nav, every link between pages and every ``#anchor`` resolves: mkdocs.yml's ``validation``), the
site fetches nothing from the internet, every relative link in README.md names a file of the repo,
and the README's first commands and its fleet file stay true."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

_FENCE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n.*?^\1[ \t]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1", re.S)
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^[ ]{0,3}\[[^\]]+\]:\s*<?([^\s>]+)>?", re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def link_targets(text: str) -> list[str]:
    """Targets of the Markdown links and images in ``text`` (inline and reference style), leaving
    out what fenced code blocks and code spans hold."""
    prose = _CODE_SPAN.sub("", _FENCE.sub("", text))
    return _INLINE.findall(prose) + _REFERENCE.findall(prose)


def broken_links(text: str, base: Path, root: Path = ROOT) -> list[str]:
    """The relative link targets in ``text`` (a file in ``base``) that name no file or folder inside
    ``root``. URLs with a scheme (https:, mailto:) and same-page anchors are not checked."""
    bad = []
    for target in link_targets(text):
        if _SCHEME.match(target) or target.startswith(("#", "//")):
            continue
        path = unquote(target.split("#", 1)[0].split("?", 1)[0])
        resolved = (root / path.lstrip("/")) if path.startswith("/") else (base / path)
        resolved = resolved.resolve()
        if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
            bad.append(target)
    return bad


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"mkdocs build --strict failed (exit {proc.returncode}; mkdocs comes with pip install -e '.[test]'):\n"
        + proc.stdout + proc.stderr)
    return out


def test_the_site_builds_strict(site: Path) -> None:
    pages = sorted(p.relative_to(ROOT / "docs").with_suffix("").as_posix() for p in (ROOT / "docs").glob("*.md"))
    for page in pages:
        html = site / ("index.html" if page == "index" else f"{page}/index.html")
        assert html.is_file(), f"docs/{page}.md was not built"
    for image in (ROOT / "docs").glob("*.png"):
        assert (site / image.name).is_file(), f"docs/{image.name} is not in the site"


def test_the_site_fetches_nothing_from_the_internet(site: Path) -> None:
    remote = re.compile(r"""<(?:script|link|img)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.I)
    bad = [f"{p.relative_to(site)}: {m.group(0)}" for p in sorted(site.rglob("*.html"))
           for m in remote.finditer(p.read_text(encoding="utf-8"))]
    assert not bad, "\n".join(bad)


def test_every_relative_link_in_the_readme_exists() -> None:
    text = README.read_text(encoding="utf-8")
    assert link_targets(text), "the README links nothing: the link scan is broken"
    bad = broken_links(text, README.parent)
    assert not bad, f"README.md links to what is not in the repo: {bad}"


def test_the_link_checker_sees_a_broken_link(tmp_path: Path) -> None:
    # (not docs/: tests/test_doc_references.py would read these samples as citations)
    (tmp_path / "manual").mkdir()
    (tmp_path / "manual" / "here.md").write_text("# here\n")
    sample = "\n".join([
        "[fine](manual/here.md) and [fine with an anchor](manual/here.md#here), [a folder](manual/)",
        "[gone](manual/gone.md) ![missing picture](manual/gone.png)",
        "[outside the repo](../elsewhere.md)",
        "[web](https://example.com/x.md) [mail](mailto:a@example.com) [same page](#top)",
        "`[in a code span](manual/code-span.md)`",
        "```", "[in a fence](manual/fenced.md)", "```",
        "[ref]: manual/ref-gone.md",
    ])
    assert broken_links(sample, tmp_path, tmp_path) == [
        "manual/gone.md", "manual/gone.png", "../elsewhere.md", "manual/ref-gone.md"]


def test_the_readme_starts_with_its_two_commands() -> None:
    text = README.read_text(encoding="utf-8")
    first = re.search(r"```bash\n(.*?)```", text, re.S)
    assert first is not None and text.index("```bash") < text.index("\n## "), "the commands come first"
    commands = [line.split("#", 1)[0].strip() for line in first.group(1).splitlines()]
    venv = "python3 -m venv .venv && . .venv/bin/activate && "
    assert commands == [venv + "pip install -e . && inferlb demo", venv + "pip install -e '.[test]' && pytest"]


def test_the_readme_fleet_file_is_valid(tmp_path: Path) -> None:
    from inferlb.app import check_startup_files
    from inferlb.config.settings import load_settings

    block = re.search(r"```yaml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert block is not None, "the README shows a fleet.yaml"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(block.group(1), encoding="utf-8")
    checked = check_startup_files(load_settings(config=fleet))   # what `inferlb validate --config` runs
    assert [n.name for n in checked.fleet.nodes] == ["gpu-a", "gpu-b"]
