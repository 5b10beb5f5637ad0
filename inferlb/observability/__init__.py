"""Observability: Prometheus metrics, OpenTelemetry traces, the node-state history and the dashboard.

Importing this package loads only :mod:`.config` (the fleet file's ``observability:`` section), so
``settings`` can use it without pulling in prometheus-client; the runtime parts live in
:mod:`.metrics`, :mod:`.tracing`, :mod:`.history`, :mod:`.timing` and :mod:`.hub` (what
``create_app`` builds).
"""

from __future__ import annotations

from inferlb.config.observability import FinOpsConfig, MetricsConfig, ObservabilityConfig, TracingConfig

__all__ = ["FinOpsConfig", "MetricsConfig", "ObservabilityConfig", "TracingConfig"]
