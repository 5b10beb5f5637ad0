"""What several ``inferlb`` commands share: a parser that adds its arguments when first used,
the gateway's flags, settings from flags, and the one-line error.

Contract: importing this module imports nothing but the standard library (``inferlb --help``
imports it); :func:`settings_from` imports the settings when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferlb.config.settings import Settings

__all__ = ["DeferredParser", "add_gateway_options", "one_line", "settings_from"]


class DeferredParser(argparse.ArgumentParser):
    """A parser that adds its arguments when it is first used: to parse, or to show its usage or
    help. For a subcommand whose options take their defaults or choices from a module that is slow
    to import: every command's parser is built on every run of ``inferlb``, this one's options only
    when it is chosen. Made by ``add_subparsers(parser_class=DeferredParser)`` and
    ``add_parser(name, add_arguments=fn)``; ``fn(parser)`` adds the arguments, once."""

    def __init__(self, *args: Any, add_arguments: Callable[[argparse.ArgumentParser], None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._add_arguments = add_arguments

    def _ready(self) -> None:
        add, self._add_arguments = self._add_arguments, None
        if add is not None:
            add(self)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._ready()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._ready()
        return super().format_usage()

    def format_help(self) -> str:
        self._ready()
        return super().format_help()


def add_gateway_options(sp: argparse.ArgumentParser) -> None:
    """The flags of a command that runs the gateway (``demo``, ``serve``): they override INFERLB_*."""
    sp.add_argument("--host")
    sp.add_argument("--port", type=int)
    sp.add_argument("--database-url", dest="database_url")
    sp.add_argument("--engine", choices=["auto", "spiff", "compiled"])


def settings_from(args: argparse.Namespace, **extra: Any) -> Settings:
    """The INFERLB_* settings with the command line's ``--host``, ``--port``, ``--config``,
    ``--database-url`` and ``--engine`` (those the command has and was given) and ``extra`` over them."""
    from inferlb.config.settings import load_settings

    over: dict[str, Any] = dict(extra)
    for key in ("host", "port", "config", "database_url", "engine"):
        val = getattr(args, key, None)
        if val is not None:
            over[key] = val
    return load_settings(**over)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines included) made one space: one terminal line."""
    return " ".join(text.split())
