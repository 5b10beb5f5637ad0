"""The commands that talk to a running gateway take ``--url`` (and ``--api-key``) in the same
places: right after the command, or after its action."""

from __future__ import annotations

import pytest

from inferlb.cli.main import build_parser

URL = "http://127.0.0.1:9"


@pytest.mark.parametrize("argv", [
    ["fleet", "--url", URL, "--api-key", "k", "show"],
    ["fleet", "show", "--url", URL, "--api-key", "k"],
    ["rollout", "--url", URL, "--api-key", "k", "status"],
    ["rollout", "status", "--url", URL, "--api-key", "k"],
    ["rollout", "--url", URL, "--api-key", "k", "abort", "r1"],
    ["rollout", "abort", "r1", "--url", URL, "--api-key", "k"],
])
def test_url_and_key_before_or_after_the_action(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.url, args.api_key) == (URL, "k")


@pytest.mark.parametrize("argv", [["fleet", "show"], ["rollout", "status"]])
def test_without_them_the_admin_listener_is_the_default(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.url, args.api_key) == ("http://127.0.0.1:8081", None)
