"""The one loader of every extension point: a table of short names → ``"module:attr"`` strings.

An extension point (routing plugins, latency predictors, autoscale actuators, forecasters, metrics
formats, simulated fleets) is one :class:`Table`: what it is called in errors (``point``) and its
built-ins, short name → ``"module:attr"``. A name resolves to its built-in's target or, when it is
not one, is itself taken as ``"module:attr"`` of the user's own (uvicorn's ``import_from_string``
style; ``attr`` may be dotted, ``module:Class.factory``). What the target must be (a class, a
factory, a function of what arguments) is the extension point's contract, stated where its table
is declared.

Every failure is one :class:`~inferlb.errors.PluginError` whose message names the extension point,
the name and the known names:

* ``unknown <point> 'x' (known: …)``: not a built-in and not of the ``module:attr`` shape;
* ``cannot load <point> 'm:a': ModuleNotFoundError: … (known: …)``: the module does not import
  (whatever its import raised, so a user's broken module is a load-time error, not a traceback);
* ``cannot load <point> 'm:a': 'm' has no attribute 'a' (known: …)``.

:meth:`Table.check` is what a settings loader calls: a built-in name passes without importing
anything (the settings layer stays below the features it names), a user's ``module:attr`` is
loaded then, so a typo fails when the file is loaded, not when the component is first built.
:meth:`Table.load` is what the component's builder calls. Imports only the standard library and
:mod:`inferlb.errors`, so every floor may use it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping
from typing import Any

from inferlb.errors import PluginError

__all__ = ["Table", "is_target"]

# "pkg.module:attr" or "pkg.module:Class.attr": dotted identifiers either side of one colon.
_TARGET = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def is_target(name: str) -> bool:
    """Whether ``name`` has the ``module:attr`` shape (it may still fail to load)."""
    return _TARGET.fullmatch(name) is not None


class Table(Mapping[str, str]):
    """One extension point: ``point`` (its name in errors) and ``builtins`` (short name →
    ``"module:attr"``). ``custom``: whether a user's own ``"module:attr"`` is accepted besides the
    built-ins. A read-only mapping of the built-ins (``name in table``, ``table[name]``)."""

    __slots__ = ("_builtins", "custom", "point")

    def __init__(self, point: str, builtins: Mapping[str, str], *, custom: bool = True) -> None:
        bad = [f"{k}={v}" for k, v in builtins.items() if not is_target(v)]
        if bad:
            raise ValueError(f"{point} table: targets must be module:attr, not {', '.join(bad)}")
        self.point = point
        self.custom = custom
        self._builtins = dict(builtins)

    def __getitem__(self, name: str) -> str:
        return self._builtins[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._builtins)

    def __len__(self) -> int:
        return len(self._builtins)

    def __repr__(self) -> str:
        return f"Table({self.point!r}, {self._builtins!r})"

    def names(self) -> tuple[str, ...]:
        """The built-in names, sorted (as error messages list them)."""
        return tuple(sorted(self._builtins))

    def error(self, name: str, why: str) -> PluginError:
        """A :class:`PluginError` about ``name`` at this extension point; ``why`` leads the message."""
        known = ", ".join(self.names()) or "none"
        own = "; or module:attr of your own" if self.custom else ""
        return PluginError(f"{why} (known: {known}{own})", point=self.point, name=name, known=self.names())

    def target(self, name: str) -> str:
        """The ``"module:attr"`` that ``name`` stands for; PluginError when it stands for none."""
        found = self._builtins.get(name)
        if found is not None:
            return found
        if self.custom and is_target(name):
            return name
        raise self.error(name, f"unknown {self.point} {name!r}")

    def load(self, name: str) -> Any:
        """The object ``name`` stands for, imported; PluginError when it does not load."""
        mod_name, _, attrs = self.target(name).partition(":")
        try:
            obj: Any = importlib.import_module(mod_name)
        except Exception as exc:   # a user's module: whatever its import raises is a load error
            raise self.error(name, f"cannot load {self.point} {name!r}: {type(exc).__name__}: {exc}") from exc
        where = mod_name
        for attr in attrs.split("."):
            try:
                obj = getattr(obj, attr)
            except AttributeError as exc:
                raise self.error(name, f"cannot load {self.point} {name!r}: {where!r} has no attribute "
                                       f"{attr!r}") from exc
            where = f"{where}.{attr}"
        return obj

    def check(self, name: str) -> str:
        """``name`` when it resolves: a built-in without importing it, a user's ``module:attr`` by
        loading it; PluginError otherwise. What a settings loader calls at load time."""
        if name not in self._builtins:
            self.load(name)
        return name
