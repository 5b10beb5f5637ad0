"""The fleet file's ``autoscale:`` section (validated at load time, like every other section).

A **pool** is one (model, GPU type) pair the autoscaler may size: ``min`` / ``max`` replicas, the
cold start a new replica takes before it serves (model download, weights to GPU, CUDA graphs),
its price and a prior capacity in tokens/s at SLO (used until the audit trail has taught one,
:mod:`.capacity`). Actuator settings say where the plan goes (:mod:`.actuators`).

Two extension points are declared here, as :class:`~inferlb.plugins.Table` s of short names →
``"module:attr"`` (a user's own ``"module:attr"`` is accepted too), so that the file's load checks
the names (uvicorn keeps its tables in its config module the same way):

* :data:`ACTUATORS` (``actuator.kind``): a target is a callable
  ``(cfg: AutoscaleConfig, ctx: inferlb.autoscale.actuators.ActuatorContext) -> Actuator``
  (the contract of :mod:`inferlb.autoscale.actuator`);
* :data:`FORECASTERS` (``forecaster``): a target is called with no argument and returns a
  forecaster (:class:`inferlb.autoscale.forecast.Forecaster`).

Defaults follow the Kubernetes HPA where it has one: target utilisation 0.7 is a common
``averageUtilization`` choice; the scale-down stabilisation window is the HPA's 300 s default
(``behavior.scaleDown.stabilizationWindowSeconds``); scale-up has none.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferlb.config.plugin_field import plugin_name
from inferlb.plugins import Table

__all__ = ["ACTUATORS", "FORECASTERS", "ActuatorConfig", "AutoscaleConfig", "PoolConfig"]

_A = "inferlb.autoscale.actuators"
ACTUATORS = Table("actuator", {
    "dry-run": f"{_A}:make_dry_run",
    "local": f"{_A}:make_local",
    "kubernetes": f"{_A}:make_kubernetes",
    "webhook": f"{_A}:make_webhook",
})

# The forecasters a running gateway may use (the oracle needs the future: backtests only, so it is
# not one of them; inferlb.autoscale.forecast.make_forecaster makes it).
_F = "inferlb.autoscale.forecast"
FORECASTERS = Table("forecaster", {
    "seasonal-naive": f"{_F}:SeasonalNaive",
    "holt-winters": f"{_F}:HoltWinters",
    "mstl": f"{_F}:Mstl",
    "reactive": f"{_F}:Reactive",
    "static": f"{_F}:StaticPeak",
})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolConfig(_Strict):
    """One model on one GPU type."""

    model: str
    gpu: str
    min: int = Field(0, ge=0)
    max: int = Field(8, ge=0)
    cold_start_s: float = Field(120.0, ge=0)
    price_per_hour: float | None = Field(None, ge=0)   # else observability.finops.gpu_prices[gpu], else 0
    tokens_per_s: float | None = Field(None, gt=0)     # prior capacity of ONE replica at SLO
    # kubernetes actuator: the workload whose scale subresource this pool patches
    workload: str | None = None                        # "deployment/NAME" or "statefulset/NAME"
    namespace: str = "default"

    @model_validator(mode="after")
    def _bounds(self) -> PoolConfig:
        if self.min > self.max:
            raise ValueError(f"pool {self.model}/{self.gpu}: min {self.min} > max {self.max}")
        if self.workload is not None:
            kind, _, name = self.workload.partition("/")
            if kind not in ("deployment", "statefulset") or not name:
                raise ValueError(f"pool {self.model}/{self.gpu}: workload must be deployment/NAME or "
                                 f"statefulset/NAME, got {self.workload!r}")
        return self


class ActuatorConfig(_Strict):
    """Where a plan goes: ``dry-run`` (record only), ``local`` (emulated nodes, ``inferlb demo
    --autoscale``), ``kubernetes`` (scale subresource), ``webhook`` (POST the plan JSON), or a
    ``module:attr`` of your own (:data:`ACTUATORS`)."""

    kind: Annotated[str, plugin_name(ACTUATORS)] = "dry-run"
    url: str | None = None                 # webhook
    kubeconfig: str | None = None          # kubernetes: a kubeconfig file; unset: in-cluster service account
    context: str | None = None             # kubernetes: the kubeconfig context (default: its current one)
    timeout_s: float = Field(10.0, gt=0)   # one API / webhook call
    drain_timeout_s: float = Field(60.0, ge=0)   # scale-down: wait this long for in-flight work, then remove

    @model_validator(mode="after")
    def _url(self) -> ActuatorConfig:
        if self.kind == "webhook" and not self.url:
            raise ValueError("actuator kind webhook needs url")
        return self


class AutoscaleConfig(_Strict):
    """``autoscale:`` in the fleet file. Absent: no autoscaler runs."""

    enabled: bool = True
    interval_s: float = Field(60.0, gt=0)           # one round of autoscale.bpmn
    step_s: float = Field(300.0, gt=0)              # the observed series' resolution
    season_s: float = Field(86_400.0, gt=0)         # the daily cycle
    history_s: float = Field(7 * 86_400.0, gt=0)    # how far back observe reads the audit trail
    # mstl: the most accurate on the diurnal-bursty series (docs/benchmarks.md, "Autoscaling
    # forecasters"); without the forecast extra it falls back to seasonal-naive and says so
    forecaster: Annotated[str, plugin_name(FORECASTERS)] = "mstl"   # or module:attr (FORECASTERS)
    target_utilisation: float = Field(0.7, gt=0, le=1)
    headroom: float = Field(0.0, ge=0)              # extra share of the forecast provisioned (0.1: +10 %)
    scale_down_stabilisation_s: float = Field(300.0, ge=0)
    # The forecast's upper band (autoscale/release.py): the forecast raised by this quantile of its
    # own past one-step errors; a scale-down goes before the stabilisation window ends when a plan
    # on that band wants fewer replicas. None (the default): the window holds as the HPA's does.
    release_quantile: float | None = Field(None, gt=0, lt=1)
    cost_cap_per_hour: float | None = Field(None, gt=0)
    slo_target: float = Field(0.99, gt=0, le=1)     # a bucket "held the SLO" at this attainment
    # The burst path (autoscale/planner.py): when the last round's load is above this × what the
    # replicas in place serve, the plan sizes for it in the same round; None turns it off.
    burst_factor: float | None = Field(1.0, gt=0)
    # Pools sized from the demand the router sends each (autoscale/planner.py): the share of a
    # model's tokens each pool served over this window; 0 turns it off (cheapest-first instead).
    routed_share_s: float = Field(3600.0, ge=0)
    pools: list[PoolConfig] = Field(default_factory=list)
    actuator: ActuatorConfig = ActuatorConfig()

    @model_validator(mode="after")
    def _pools(self) -> AutoscaleConfig:
        seen: set[tuple[str, str]] = set()
        for p in self.pools:
            key = (p.model, p.gpu)
            if key in seen:
                raise ValueError(f"duplicate pool {p.model}/{p.gpu}")
            seen.add(key)
        if self.actuator.kind == "kubernetes":
            missing = [f"{p.model}/{p.gpu}" for p in self.pools if p.workload is None]
            if missing:
                raise ValueError(f"actuator kubernetes: pools without workload: {', '.join(missing)}")
        return self
