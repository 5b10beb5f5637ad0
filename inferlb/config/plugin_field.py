"""Fleet-file fields that name an extension point's plugin (an actuator kind, a forecaster, a
metrics format): checked against the point's :class:`~inferlb.plugins.Table` when the file loads.

:func:`plugin_name` is a pydantic validator running :func:`check_plugin`, i.e.
:meth:`Table.check <inferlb.plugins.Table.check>` (a built-in passes without importing it; a user's
``module:attr`` is loaded). Pydantic only turns a
``ValueError`` into a validation error, so the :class:`~inferlb.errors.PluginError` travels as the
cause of one; :func:`~inferlb.config.settings.fleet_from_mapping` raises it again, with the file and
the field's key path.
"""

from __future__ import annotations

from pydantic import AfterValidator

from inferlb.errors import PluginError
from inferlb.plugins import Table

__all__ = ["check_plugin", "plugin_name"]


def check_plugin(table: Table, name: str) -> str:
    """``name`` when it resolves in ``table``; else a ValueError caused by the PluginError."""
    try:
        return table.check(name)
    except PluginError as exc:
        raise ValueError(exc.message) from exc


def plugin_name(table: Table) -> AfterValidator:
    """The validator of a ``str`` field holding one of ``table``'s names (``Annotated[str, …]``)."""
    return AfterValidator(lambda name: check_plugin(table, name))
