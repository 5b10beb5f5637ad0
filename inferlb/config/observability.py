"""The ``observability:`` section of the fleet file: metric labels, tracing, FinOps prices, sampling.

Contract: pure pydantic models (no I/O, no imports of the rest of the engine), strict like the rest
of the fleet file (unknown keys are errors, instances are frozen). Every field has a default, so a
fleet file without the section gets: metrics on, at most 20 tenant label values (the rest counted
as ``other``), tracing off, node prices from each node's ``price_per_hour``.

::

    observability:
      metrics:
        tenants: [acme, globex]          # only these tenant label values; others are "other"
        max_tenants: 20                  # without a list: the first 20 valid tenants seen
        max_priorities: 8
      tracing: {enabled: true, exporter: otlp, service_name: inferlb-gw, sample_ratio: 0.1}
      finops:
        gpu_label: gpu                   # node label naming the GPU type
        gpu_prices: {h100: 4.10, a10g: 1.01}   # per hour; used when a node has no price_per_hour
      node_state_sample_s: 15            # the dashboard's node-state timeline resolution
      node_state_history: 480            # samples kept in memory (2 h at 15 s)
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat

__all__ = ["FinOpsConfig", "MetricsConfig", "ObservabilityConfig", "TracingConfig"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MetricsConfig(_Strict):
    """Bounds on label values: no request ids or raw client strings ever become a series."""

    enabled: bool = True
    # Known tenants: when set, only these become label values. The backpressure work's tenant
    # table can feed the same list.
    tenants: list[str] | None = None
    max_tenants: int = Field(20, ge=0, le=1000)
    max_priorities: int = Field(8, ge=1, le=100)


class TracingConfig(_Strict):
    """OpenTelemetry traces (needs the ``otel`` extra). Off unless ``enabled``."""

    enabled: bool = False
    exporter: Literal["otlp", "console", "none"] = "otlp"   # otlp: OTEL_EXPORTER_OTLP_* env vars apply
    service_name: str = "inferlb"
    sample_ratio: float = Field(1.0, ge=0.0, le=1.0)


class FinOpsConfig(_Strict):
    """Node prices for the cost ledger: a node's ``price_per_hour`` wins; else its GPU type's price."""

    gpu_label: str = "gpu"
    gpu_prices: dict[str, NonNegativeFloat] = Field(default_factory=dict)
    currency: str = "USD"


class ObservabilityConfig(_Strict):
    metrics: MetricsConfig = MetricsConfig()
    tracing: TracingConfig = TracingConfig()
    finops: FinOpsConfig = FinOpsConfig()
    node_state_sample_s: float = Field(15.0, gt=0)
    node_state_history: int = Field(480, ge=1, le=100_000)
