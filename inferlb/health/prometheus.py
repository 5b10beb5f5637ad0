"""Pure parsers of the Prometheus exposition text model servers and DCGM expose.

Each parser takes the text of one ``/metrics`` page and returns plain JSON-able data; it raises
:class:`ValueError` when the text is not exposition format (the prober turns that into a failed
sample). Parsing is done by ``prometheus_client.parser`` (the format's reference Python parser);
this module only knows which series mean what:

* vLLM: ``vllm:num_requests_running``, ``vllm:num_requests_waiting`` (summed over engines/models),
  KV-cache use from ``vllm:kv_cache_usage_perc`` (v1 engine) or the older
  ``vllm:gpu_cache_usage_perc`` (both a 0..1 fraction despite the name; the fullest engine wins);
  LoRA adapters from ``vllm:lora_requests_info``, a gauge whose value is the time it was last set
  and whose labels ``running_lora_adapters`` / ``waiting_lora_adapters`` (comma-separated adapter
  names) and ``max_lora`` are the state: vLLM sets a new label set each time the state changes,
  so the page holds old ones too and the newest sample (largest value) wins. ``lora`` is
  ``{"running": [...], "waiting": [...], "max_lora": int | None}`` (names sorted), None when the
  page has no such gauge (a server started without ``--enable-lora``).
* TGI: ``tgi_batch_current_size`` (running), ``tgi_queue_size`` (waiting); TGI exports no KV use.
* SGLang: ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage`` (0..1).
* DCGM exporter: per-GPU ``DCGM_FI_DEV_*`` fields, returned in the node agent's report shape.

Server results: ``{"format", "running", "waiting", "kv_usage"}`` with None for what the page lacks
(vLLM's also ``lora``).
Which function parses which format is the one table of formats,
:data:`inferlb.config.health.METRICS_PARSERS`, where a format of your own is added too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from inferlb.fleet.gpu import throttle_names

__all__ = ["parse_dcgm", "parse_sglang", "parse_tgi", "parse_vllm", "series"]

Series = tuple[str, dict[str, str], float]


def series(text: str) -> Iterator[Series]:
    """(name, labels, value) of every sample; ValueError when ``text`` is not exposition format."""
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                yield s.name, dict(s.labels), float(s.value)
    except ValueError:
        raise
    except Exception as exc:  # the parser's other failure modes (IndexError, KeyError, …) on garbage
        raise ValueError(f"not Prometheus exposition text: {type(exc).__name__}: {exc}") from exc


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


_LORA_INFO = "vllm:lora_requests_info"


def _names(text: str | None) -> list[str]:
    return sorted({n.strip() for n in (text or "").split(",") if n.strip()})


def _lora(labels: dict[str, str] | None) -> dict[str, Any] | None:
    """The LoRA state of a ``vllm:lora_requests_info`` sample's labels (see the module docstring)."""
    if labels is None:
        return None
    raw = labels.get("max_lora", "").strip()
    try:
        max_lora: int | None = int(float(raw)) if raw else None
    except ValueError:
        max_lora = None
    if max_lora is not None and max_lora < 0:
        max_lora = None
    return {"running": _names(labels.get("running_lora_adapters")),
            "waiting": _names(labels.get("waiting_lora_adapters")), "max_lora": max_lora}


class _Acc:
    """Sums and maxima by series name, ignoring NaN/Inf."""

    def __init__(self, text: str) -> None:
        self.sum: dict[str, float] = {}
        self.max: dict[str, float] = {}
        self.lora: dict[str, str] | None = None     # the newest vllm:lora_requests_info sample's labels
        lora_at = -math.inf
        seen_any = False
        for name, labels, value in series(text):
            seen_any = True
            v = _finite(value)
            if v is None:
                continue
            if name == _LORA_INFO:
                if v >= lora_at:
                    self.lora, lora_at = labels, v
                continue
            self.sum[name] = self.sum.get(name, 0.0) + v
            self.max[name] = max(self.max.get(name, v), v)
        if not seen_any and text.strip():
            raise ValueError("no samples in the metrics page")

    def count(self, name: str) -> int | None:
        v = self.sum.get(name)
        return None if v is None else max(0, round(v))

    def fraction(self, *names: str) -> float | None:
        for n in names:
            if n in self.max:
                return max(0.0, min(1.0, self.max[n]))
        return None


def parse_vllm(text: str) -> dict[str, Any]:
    a = _Acc(text)
    return {"format": "vllm", "running": a.count("vllm:num_requests_running"),
            "waiting": a.count("vllm:num_requests_waiting"),
            "kv_usage": a.fraction("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "lora": _lora(a.lora)}


def parse_tgi(text: str) -> dict[str, Any]:
    a = _Acc(text)
    return {"format": "tgi", "running": a.count("tgi_batch_current_size"), "waiting": a.count("tgi_queue_size"),
            "kv_usage": None}


def parse_sglang(text: str) -> dict[str, Any]:
    a = _Acc(text)
    return {"format": "sglang", "running": a.count("sglang:num_running_reqs"),
            "waiting": a.count("sglang:num_queue_reqs"), "kv_usage": a.fraction("sglang:token_usage")}


def parse_llamacpp(text: str) -> dict[str, Any]:
    """llama.cpp's llama-server (``--metrics``): requests decoding, requests deferred (waiting for a
    slot), and the KV-cache fill ratio where the build still reports it."""
    a = _Acc(text)
    return {"format": "llamacpp", "running": a.count("llamacpp:requests_processing"),
            "waiting": a.count("llamacpp:requests_deferred"), "kv_usage": a.fraction("llamacpp:kv_cache_usage_ratio")}


# DCGM field → (report key, converter). FB values are MiB, power W, temperature °C.
_DCGM_FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_FB_USED": "memory_used_mib",
    "DCGM_FI_DEV_FB_FREE": "_fb_free",
    "DCGM_FI_DEV_FB_RESERVED": "_fb_reserved",
    "DCGM_FI_DEV_GPU_UTIL": "utilization_gpu_pct",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "utilization_memory_pct",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "power_limit_w",
    "DCGM_FI_DEV_XID_ERRORS": "_xid",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "_ecc_uncorrected",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "_ecc_corrected",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "_throttle",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "_throttle",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "_row_remap_failure",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "uncorrectable_remapped_rows",
}


def parse_dcgm(text: str) -> dict[str, Any]:
    """A DCGM exporter page as a node-agent report: ``{"nvml": "ok", "source": "dcgm", "gpus": [...]}``.

    GPUs are keyed by the ``gpu`` label (index) and carry ``UUID`` / ``modelName``. DCGM reports
    the *last* Xid (0 = none) rather than a count, so ``xid_errors`` is None and ``xid_last`` is
    the value; the isolation rule treats a change of ``xid_last`` as a new Xid.
    """
    gpus: dict[str, dict[str, Any]] = {}
    seen_any = False
    for name, labels, value in series(text):
        seen_any = True
        # The parser appends "_total" to counter samples whose family name lacks it
        # (DCGM declares "…_VOL_TOTAL counter").
        key = _DCGM_FIELDS.get(name) or (_DCGM_FIELDS.get(name[:-6]) if name.endswith("_total") else None)
        if key is None:
            continue
        idx = labels.get("gpu") or labels.get("UUID") or "0"
        g = gpus.setdefault(idx, {"index": int(idx) if idx.isdigit() else len(gpus),
                                  "uuid": labels.get("UUID"), "name": labels.get("modelName")})
        v = _finite(value)
        if v is not None:
            g[key] = v
    if not seen_any and text.strip():
        raise ValueError("no samples in the metrics page")
    out = []
    for g in sorted(gpus.values(), key=lambda x: int(x["index"])):
        used, free, reserved = g.get("memory_used_mib"), g.pop("_fb_free", None), g.pop("_fb_reserved", 0.0)
        g["memory_total_mib"] = used + free + reserved if used is not None and free is not None else None
        xid = g.pop("_xid", None)
        g["xid_errors"] = None
        g["xid_last"] = int(xid) if xid else None
        unc, cor = g.pop("_ecc_uncorrected", None), g.pop("_ecc_corrected", None)
        g["ecc_errors"] = {"corrected": None if cor is None else int(cor),
                           "uncorrected": None if unc is None else int(unc)}
        mask = g.pop("_throttle", None)
        g["throttle_reasons"] = throttle_names(int(mask)) if mask is not None else None
        g["row_remap_failure"] = bool(g.pop("_row_remap_failure", 0.0))
        out.append(g)
    return {"nvml": "ok", "source": "dcgm", "gpus": out}
