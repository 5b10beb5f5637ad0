"""Hop markers (engine/hops.py), pure: what a request to a node carries, and which arrivals loop."""

from __future__ import annotations

import pytest

from inferlb.engine.hops import HOP_HEADER, LoopDetected, check_hops, hop_headers, parse_hops


def test_a_request_to_a_node_names_every_gateway_it_passed_this_one_last() -> None:
    assert hop_headers((), "gw-a") == {HOP_HEADER: "gw-a", "via": "1.1 gw-a"}
    assert hop_headers(("gw-b",), "gw-a") == {HOP_HEADER: "gw-b, gw-a", "via": "1.1 gw-b, 1.1 gw-a"}


def test_a_request_carrying_this_gateways_own_marker_is_a_508_not_audited_again() -> None:
    with pytest.raises(LoopDetected) as ei:
        check_hops("gw-b, gw-a", "gw-a", max_hops=4)
    assert ei.value.status == 508 and ei.value.own
    env = ei.value.envelope()["error"]
    assert env["code"] == "loop_detected" and env["param"] == HOP_HEADER and env["type"] == "server_error"


def test_too_many_hops_is_a_508_from_a_gateway_seeing_it_first() -> None:
    assert check_hops("a, b, c", "me", max_hops=4) == ("a", "b", "c")
    with pytest.raises(LoopDetected) as ei:
        check_hops("a, b, c, d", "me", max_hops=4)
    assert not ei.value.own and "4 gateways" in ei.value.message


def test_malformed_and_oversized_headers_are_bounded() -> None:
    assert parse_hops(None) == () and parse_hops("") == ()
    assert parse_hops("ok-1, bad id, ,x" + "y" * 200 + ", ok-2") == ("ok-1", "ok-2")
    assert len(parse_hops(", ".join(f"h{i}" for i in range(500)))) == 64
