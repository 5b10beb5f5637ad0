"""What an emulated node exposes to scrapers: vLLM's Prometheus metrics and an NVML-like GPU reading.

Contract: the metric names, types and labels are vLLM's (``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc`` and its older name
``vllm:gpu_cache_usage_perc``, ``vllm:num_preemptions_total``, ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``, ``vllm:request_success_total``, and the histograms
``vllm:time_to_first_token_seconds``, ``vllm:time_per_output_token_seconds``,
``vllm:e2e_request_latency_seconds``, ``vllm:request_queue_time_seconds``), each with the
``model_name`` label, so a scraper written for real vLLM reads the emulator unchanged; a node with
LoRA adapters also ``vllm:lora_requests_info`` (no ``model_name``, as vLLM's). Extra
``inferlb_sim_*`` series carry what vLLM cannot report (OOM crashes). The text is Prometheus
exposition format 0.0.4, built by hand: no global registry, many nodes per process.

The GPU reading (``GET /sim/gpu``) has the shape of the node agent's NVML report
(:mod:`inferlb.health.nvml`): ``{"agent", "nvml": "ok", "reason", "driver_version",
"boot_id", "time", "gpus": [{"index", "uuid", "name", "memory_used_mib", "memory_total_mib",
"utilization_gpu_pct", "utilization_memory_pct", "temperature_c", "power_w", "power_limit_w",
"throttle_reasons", "throttle_mask", "ecc_errors": {"corrected", "uncorrected"}, "xid_errors",
"xid_last", "lost", "unsupported", "errors"}], "xid_events": [{"seq", "gpu", "xid", "at"}]}``.
Memory used is constant, as vLLM pre-allocates its KV pool; ``boot_id`` changes at every crash.
"""

from __future__ import annotations

import bisect
import hashlib
from dataclasses import dataclass, field
from typing import Any

from inferlb.simulator.spec import FaultSpec, GpuSpec

__all__ = ["Histogram", "NodeMetrics", "gpu_reading", "render_metrics"]

# vLLM's bucket boundaries (vllm/engine/metrics.py).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


@dataclass
class Histogram:
    """A cumulative Prometheus histogram."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = []
        acc = 0
        for le, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {acc}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.n}')
        out.append(f"{name}_sum{{{labels}}} {self.total}")
        out.append(f"{name}_count{{{labels}}} {self.n}")
        return out


@dataclass
class NodeMetrics:
    """Per-request figures a node observes; the engine's gauges and counters are read live."""

    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    queue: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    success: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0, "abort": 0})

    def observe(self, *, ttft_s: float | None, e2e_s: float, output_tokens: int, queue_s: float,
                finish_reason: str) -> None:
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
            if output_tokens > 1:
                self.tpot.observe((e2e_s - ttft_s) / (output_tokens - 1))
        self.e2e.observe(e2e_s)
        self.queue.observe(queue_s)
        self.success[finish_reason] = self.success.get(finish_reason, 0) + 1


def _gauge(name: str, help_: str, labels: str, value: float, kind: str = "gauge") -> list[str]:
    return [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value}"]


def render_metrics(model: str, *, running: int, waiting: int, kv_usage: float, preemptions: int,
                   prompt_tokens: int, generation_tokens: int, oom_crashes: int, metrics: NodeMetrics,
                   lora: tuple[int, list[tuple[str, str, float]]] | None = None) -> str:
    """The ``/metrics`` text of one node serving ``model``. ``lora``: ``(max_lora, [(running,
    waiting, time set), ...])`` of a node with LoRA adapters: vLLM's ``vllm:lora_requests_info``,
    one series per label set it set (comma-separated adapter names), its value the time it was set
    (simulator/lora.py)."""
    lab = f'model_name="{model}"'
    out: list[str] = []
    out += _gauge("vllm:num_requests_running", "Number of requests in model execution batches.", lab, running)
    out += _gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lab, waiting)
    out += _gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.", lab, 0)
    out += _gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lab, kv_usage)
    out += _gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.", lab, kv_usage)
    out += _gauge("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.", lab,
                  preemptions, "counter")
    out += _gauge("vllm:prompt_tokens_total", "Number of prefill tokens processed.", lab, prompt_tokens, "counter")
    out += _gauge("vllm:generation_tokens_total", "Number of generation tokens processed.", lab,
                  generation_tokens, "counter")
    out += ["# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter"]
    out += [f'vllm:request_success_total{{{lab},finished_reason="{r}"}} {n}' for r, n in metrics.success.items()]
    for name, help_, hist in (
        ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", metrics.ttft),
        ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", metrics.tpot),
        ("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.", metrics.e2e),
        ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.",
         metrics.queue),
    ):
        out += [f"# HELP {name} {help_}", f"# TYPE {name} histogram", *hist.lines(name, lab)]
    if lora is not None:
        max_lora, sets = lora
        out += ["# HELP vllm:lora_requests_info Running stats on lora requests.",
                "# TYPE vllm:lora_requests_info gauge"]
        out += [f'vllm:lora_requests_info{{max_lora="{max_lora}",running_lora_adapters="{r}",'
                f'waiting_lora_adapters="{w}"}} {at!r}' for r, w, at in sets]
    out += _gauge("inferlb_sim_oom_crashes_total", "OOM crashes of this emulated node (not a vLLM metric).",
                  lab, oom_crashes, "counter")
    return "\n".join(out) + "\n"


_HW_THERMAL_SLOWDOWN = 0x40   # NVML's clocks-event reason bit


def gpu_reading(name: str, gpu: GpuSpec, faults: FaultSpec, *, utilization: float, now: float,
                crashed: bool, boot: int = 0) -> dict[str, Any]:
    """The NVML-like JSON of one node's GPU; ``utilization`` 0..1 is the engine's recent busy share,
    ``boot`` counts restarts (crashes)."""
    util = max(0.0, min(1.0, utilization))
    uuid = "GPU-" + hashlib.blake2b(name.encode(), digest_size=16).hexdigest()
    throttle = ["hw_thermal_slowdown"] if faults.gpu_throttle else []
    temp = gpu.temp_idle_c + (gpu.temp_busy_c - gpu.temp_idle_c) * util + (15.0 if faults.gpu_throttle else 0.0)
    used = 0 if crashed else int(gpu.memory_total_mib * gpu.memory_utilization)
    xids = faults.gpu_xid_errors
    return {
        "agent": "inferlb-sim",
        "nvml": "ok",
        "reason": None,
        "driver_version": "inferlb-sim",
        "boot_id": f"{name}-{boot}",
        "time": now,
        "gpus": [{
            "index": 0,
            "uuid": uuid,
            "name": gpu.name,
            "memory_used_mib": used,
            "memory_total_mib": gpu.memory_total_mib,
            "utilization_gpu_pct": round(util * 100, 1),
            "utilization_memory_pct": round(util * 60, 1),
            "temperature_c": round(temp, 1),
            "power_w": round(gpu.power_idle_w + (gpu.power_limit_w - gpu.power_idle_w) * util, 1),
            "power_limit_w": gpu.power_limit_w,
            "throttle_reasons": throttle,
            "throttle_mask": _HW_THERMAL_SLOWDOWN if faults.gpu_throttle else 0,
            "ecc_errors": {"corrected": 0, "uncorrected": faults.gpu_ecc_uncorrected},
            "xid_errors": xids,
            "xid_last": 79 if xids else None,
            "lost": False,
            "unsupported": [],
            "errors": {},
        }],
        # Xid 79 ("fallen off the bus"); the latest 100, as the agent keeps them.
        "xid_events": [{"seq": i + 1, "gpu": 0, "xid": 79, "at": now} for i in range(max(0, xids - 100), xids)],
    }
