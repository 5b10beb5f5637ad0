"""The same simulation, to the last bit: small runs against digests made before a change.

golden.json was written by ``python -m tests.simulator.des.golden_runs`` on main at 7d42050, before
the event loop, lifecycle and engine were reworked for speed (docs/benchmarks.md, "The DES's own
cost per request, fifth pass"). A change that moves any row's times, outcome or node, the event
count, the end time or the node table fails here; one that means to change the simulation
rewrites golden.json and says why.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.simulator.des.golden_runs import CASES, Case, digest

_GOLDEN = json.loads((Path(__file__).parent / "golden.json").read_text())


def test_every_case_has_a_digest() -> None:
    assert sorted(_GOLDEN) == sorted(c.name for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_run_gives_the_digest_made_before(case: Case) -> None:
    assert digest(case) == _GOLDEN[case.name]
