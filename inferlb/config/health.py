"""The ``health:`` section of the fleet file: probes, scrapes, isolation rules, slow start.

Contract: pure pydantic models (no I/O, no imports of the rest of the engine), strict like the rest
of the fleet file (unknown keys are errors, instances are frozen). Every field has a default, so a
fleet file without the section gets Envoy's outlier-detection defaults (docs/reliability.md §1.1) except
where a [P] comment says why we differ.

::

    health:
      interval_s: 5                      # one node_health.bpmn round (probe → assess → isolate → restore → record)
      probe: {timeout_s: 2, unhealthy_threshold: 2, healthy_threshold: 1}
      outlier: {consecutive_failures: 5, base_ejection_s: 30, max_ejection_s: 300, max_ejection_percent: 50}
      circuit: {half_open_requests: 1}
      slow_start: {window_s: 60, aggression: 1.0, min_weight_percent: 10}
      hardware: {drain_on: [hw_slowdown, hw_thermal_slowdown, sw_thermal_slowdown, hw_power_brake_slowdown]}
      nodes:
        gpu-a: {metrics: vllm, agent_url: "http://10.0.0.11:9401/gpu", dcgm_url: "http://10.0.0.11:9400/metrics"}

The page formats the prober parses are one extension point, :data:`METRICS_PARSERS` (format →
``"module:attr"`` of a function ``(text: str) -> dict``, a user's own ``"module:attr"`` too),
checked when the file loads. A server format (``vllm``, ``tgi``, ``sglang``, your own) returns
``{"format", "running", "waiting", "kv_usage"}`` (None for what the page lacks); ``dcgm`` is the
``dcgm_url`` page's and returns the node agent's report shape (inferlb/health/prometheus.py).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from inferlb.config.plugin_field import check_plugin
from inferlb.plugins import Table

__all__ = [
    "DEFAULT_METRICS",
    "DEFAULT_PROBE_PATHS",
    "METRICS_PARSERS",
    "CircuitConfig",
    "HardwareConfig",
    "HealthConfig",
    "NodeHealthConfig",
    "OutlierConfig",
    "ProbeConfig",
    "SlowStartConfig",
]

_H = "inferlb.health.prometheus"
METRICS_PARSERS = Table("metrics format", {
    "vllm": f"{_H}:parse_vllm",
    "tgi": f"{_H}:parse_tgi",
    "sglang": f"{_H}:parse_sglang",
    "llamacpp": f"{_H}:parse_llamacpp",
    "dcgm": f"{_H}:parse_dcgm",
})


def _metrics_format(name: str) -> str:
    """``metrics:``: ``none`` (no scrape) or a server page's format; ``dcgm`` is not one (it has a
    GPU page's shape), so it is refused here with where it goes instead."""
    if name == "none":
        return name
    if name == "dcgm":
        why = METRICS_PARSERS.error(name, "metrics format 'dcgm' is a DCGM exporter's page: give its URL as dcgm_url")
        raise ValueError(why.message) from why
    return check_plugin(METRICS_PARSERS, name)


# A probe must cost no tokens: each server kind's own readiness endpoint, never a generation.
DEFAULT_PROBE_PATHS: dict[str, str] = {
    "vllm": "/health", "tgi": "/health", "sglang": "/health", "llamacpp": "/health", "sim": "/health",
    "triton": "/v2/health/ready", "ollama": "/api/version", "openai": "/v1/models",
    # llama-cpp-python's server (python -m llama_cpp.server) has no /health, and its /v1/models waits
    # on the model's lock behind the request being decoded (a probe would time out under load, and
    # arriving, cut a running stream): /docs is the one page it serves without the lock, and it
    # listens only once the model is loaded (tests/integration/test_real_engine.py pins both).
    "llamacpp-python": "/docs",
}
# Prometheus scrape format by node kind (the simulator speaks vLLM's names).
# llama.cpp's C++ llama-server serves /metrics only when started with --metrics, so a ``llamacpp``
# node scrapes nothing unless its config says ``metrics: llamacpp``; llama-cpp-python's server has no
# /metrics page at all.
DEFAULT_METRICS: dict[str, str] = {"vllm": "vllm", "tgi": "tgi", "sglang": "sglang", "sim": "vllm"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ProbeConfig(_Strict):
    """Active checks. Envoy ships no defaults for these (they are required fields there); ours
    follow Kubernetes readiness probes (``successThreshold`` 1) with a faster failure count [P] so
    a dead node without traffic is out within two intervals (B7: ≤ 10 s at the 5 s default)."""

    timeout_s: float = Field(2.0, gt=0)
    unhealthy_threshold: int = Field(2, ge=1)     # consecutive failed probes → down
    healthy_threshold: int = Field(1, ge=1)       # consecutive good probes → back (slow start)
    stale_after_s: float | None = Field(None, gt=0)   # default: 3 × interval_s
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0)   # a /metrics page larger than this is a failed scrape


class OutlierConfig(_Strict):
    """Passive outlier detection from live traffic; Envoy's names and defaults."""

    consecutive_failures: int = Field(5, ge=1)          # consecutive_5xx
    interval_s: float = Field(10.0, gt=0)              # the analysis sweep (success rate, latency)
    base_ejection_s: float = Field(30.0, gt=0)         # × ejections in a row
    max_ejection_s: float = Field(300.0, gt=0)         # cap (or base, when larger)
    # [P] Envoy: 10 %. With 2–8 GPU nodes that is "never more than one"; the panic threshold
    # guards against ejecting too much instead (docs/reliability.md §1.1).
    max_ejection_percent: float = Field(50.0, ge=0, le=100)
    success_rate_minimum_hosts: int = Field(5, ge=1)
    success_rate_request_volume: int = Field(100, ge=1)
    success_rate_stdev_factor: float = Field(1.9, gt=0)   # Envoy's 1900 / 1000
    enforcing_success_rate: int = Field(100, ge=0, le=100)
    failure_percentage_threshold: float = Field(85.0, ge=0, le=100)
    failure_percentage_minimum_hosts: int = Field(5, ge=1)
    failure_percentage_request_volume: int = Field(50, ge=1)
    enforcing_failure_percentage: int = Field(0, ge=0, le=100)
    # [P] Latency, like with like: streamed time to first token and non-streamed time per output
    # token are two measures, never mixed. A node is ejected when an interval's median is over
    # latency_factor × its OWN learned baseline AND over latency_peer_factor × the median of its
    # peers (the other nodes of a model, same measure, same interval), with enough requests
    # (fleet/rules.py: latency_outliers).
    latency_factor: float = Field(3.0, gt=1)
    latency_peer_factor: float = Field(2.0, gt=1)
    latency_minimum_peers: int = Field(1, ge=1)        # peers with enough requests before judging
    latency_request_volume: int = Field(20, ge=1)
    latency_baseline_intervals: int = Field(3, ge=1)   # intervals learned before judging
    enforcing_latency: int = Field(100, ge=0, le=100)
    # [P] Envoy's panic threshold: below this share of available nodes (per model) health is ignored.
    panic_threshold_percent: float = Field(50.0, ge=0, le=100)
    # [P] Envoy: true. Our probe (/health) does not exercise inference, so a passing probe would
    # un-eject a node whose generations still fail (the Envoy docs warn of exactly this).
    successful_probe_uneject: bool = False


class CircuitConfig(_Strict):
    """Per-node circuit breaker: when an ejection ends the node is half-open and admits this many
    concurrent trial requests; one success closes it (slow start follows), one failure re-opens it
    with the next, longer ejection. 0 disables half-open (back to full service at once, as Envoy)."""

    half_open_requests: int = Field(1, ge=0)
    half_open_successes: int = Field(1, ge=1)


class SlowStartConfig(_Strict):
    """Envoy slow start: weight × max(min_weight_percent/100, time_factor^(1/aggression)),
    time_factor = max(t, 1 ms) / window. Envoy requires the window; 60 s is ours [P]."""

    window_s: float = Field(60.0, ge=0)   # 0 disables slow start
    aggression: float = Field(1.0, gt=0)
    min_weight_percent: float = Field(10.0, ge=0, le=100)


class HardwareConfig(_Strict):
    """GPU faults from the node agent (NVML) or a DCGM exporter, acted on before requests fail."""

    eject_on_xid: bool = True
    # Xids NVIDIA's catalogue attributes to the application (illegal access, MMU fault from user
    # code, stopped processing, preemptive cleanup): reported, not acted on.
    xid_ignore: list[int] = Field(default_factory=lambda: [13, 31, 43, 45])
    eject_on_uncorrected_ecc: bool = True
    ejection_s: float = Field(300.0, gt=0)
    # Throttle reasons that drain a node (no new requests until clear). sw_power_cap is left out on
    # purpose: a busy GPU sits at its power cap all day.
    drain_on: list[str] = Field(default_factory=lambda: [
        "hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"])
    max_temperature_c: float | None = Field(None, gt=0)   # drain above this, when set


class NodeHealthConfig(_Strict):
    """Per-node sources; unset fields follow the node's ``kind``."""

    probe_path: str | None = None          # default: DEFAULT_PROBE_PATHS[kind]
    probe: bool = True                      # false: no active probe (passive detection only)
    # default: DEFAULT_METRICS.get(kind, "none"); a METRICS_PARSERS format or module:attr of your own
    metrics: Annotated[str, AfterValidator(_metrics_format)] | None = None
    metrics_url: str | None = None          # default: node url + /metrics
    agent_url: str | None = None            # full URL of an `inferlb agent` report (…/gpu)
    dcgm_url: str | None = None             # full URL of a DCGM exporter (…:9400/metrics)


class HealthConfig(_Strict):
    interval_s: float = Field(5.0, gt=0)
    process: str = "node_health.bpmn"       # in the processes directory
    # Envoy's cluster warming: the first round runs before the gateway reports ready.
    first_round_timeout_s: float = Field(5.0, ge=0)
    probe: ProbeConfig = ProbeConfig()
    outlier: OutlierConfig = OutlierConfig()
    circuit: CircuitConfig = CircuitConfig()
    slow_start: SlowStartConfig = SlowStartConfig()
    hardware: HardwareConfig = HardwareConfig()
    nodes: dict[str, NodeHealthConfig] = Field(default_factory=dict)

    @property
    def stale_after_s(self) -> float:
        return self.probe.stale_after_s if self.probe.stale_after_s is not None else 3.0 * self.interval_s

    def node(self, name: str) -> NodeHealthConfig:
        return self.nodes.get(name) or NodeHealthConfig()
