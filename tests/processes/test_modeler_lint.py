"""Modeler-side check: every BPMN file imports into bpmn-moddle (the parser under bpmn.io and
Camunda Modeler) without warnings and passes bpmnlint's recommended rules.

Runs ``node tests/processes/modeler/check.mjs`` when Node.js is on PATH and the tooling is installed
(``tests/processes/modeler/install.sh``; installing is CI's job, not the test's). Otherwise the tests
skip with the reason, unless ``INFERLB_REQUIRE_MODELER_LINT=1``: then they fail.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

MODELER = Path(__file__).parent / "modeler"
REQUIRED = os.environ.get("INFERLB_REQUIRE_MODELER_LINT") == "1"
MIN_NODE_MAJOR = 20  # bpmnlint 11 declares node >= 20


def _unavailable(reason: str) -> NoReturn:
    if REQUIRED:
        pytest.fail(f"{reason} (INFERLB_REQUIRE_MODELER_LINT=1 requires the modeler check)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def node() -> str:
    exe = shutil.which("node")
    if exe is None:
        _unavailable("node is not on PATH: the modeler check needs Node.js >= 20")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    match = re.match(r"v(\d+)\.", version)
    if match is None or int(match.group(1)) < MIN_NODE_MAJOR:
        _unavailable(f"node {version or '(unknown version)'} is too old: the modeler check needs >= 20")
    if not (MODELER / "node_modules").is_dir():
        _unavailable("modeler tooling is not installed: run tests/processes/modeler/install.sh")
    return exe


def _check(node: str, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [node, str(MODELER / "check.mjs"), *map(str, files)],
        cwd=MODELER,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_bpmn_files_import_cleanly_and_pass_bpmnlint(node: str) -> None:
    proc = _check(node)
    print(proc.stdout)  # bpmnlint warnings stay visible with -s / on failure
    assert proc.returncode == 0, f"modeler check failed:\n{proc.stdout}\n{proc.stderr}"
    assert "processes/inference_request.bpmn" in proc.stdout
    assert "ok   processes/rollout.bpmn\n" in proc.stdout   # no warning either


def test_check_rejects_a_broken_diagram(node: str, tmp_path: Path) -> None:
    """The check is not vacuous: an unknown attribute and a missing gateway label both fail it."""
    main = (MODELER.parents[2] / "processes" / "inference_request.bpmn").read_text()
    broken = main.replace('camunda:topic="routing/select"', 'camunda:topik="routing/select"', 1).replace(
        ' name="Valid?"', "", 1
    )
    assert broken != main
    path = tmp_path / "broken.bpmn"
    path.write_text(broken)

    proc = _check(node, path)

    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "unknown attribute <camunda:topik>" in proc.stdout
    assert "gw_valid: Element is missing label/name (label-required)" in proc.stdout
