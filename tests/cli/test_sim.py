"""``inferlb sim``: operator mistakes are one line and status 2, before any node starts."""

from __future__ import annotations

import pytest

from inferlb.cli.main import main


@pytest.mark.parametrize("argv", [["sim", "--ports", "9001", "9002"],
                                  ["sim", "--fleet", "hetero4", "--ports", "9001"]])
def test_a_port_count_that_does_not_match_the_nodes_is_one_line(argv: list[str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("inferlb: error: --ports:") and "one port per node" in err[0]
