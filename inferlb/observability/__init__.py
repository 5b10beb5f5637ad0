"""Observability: Prometheus metrics, OpenTelemetry traces, the node-state history and the dashboard.

Its config is ``inferlb/config/observability.py`` (the fleet file's ``observability:`` section);
the runtime parts live in :mod:`.metrics`, :mod:`.tracing`, :mod:`.history`, :mod:`.timing` and
:mod:`.hub` (what ``create_app`` builds). Importing this package imports nothing, so it never pulls
in prometheus-client.
"""

__all__: list[str] = []
