"""The isolation rules as pure functions (no clock, no I/O): the fleet applies them.

* :func:`slow_start_factor`: Envoy slow start, ``max(min_weight, time_factor^(1/aggression))``
  with ``time_factor = max(t, 1 ms) / window`` (Envoy's code floors the age at 1 ms).
* :func:`ejection_seconds`: ``base × n`` capped at ``max(max, base)`` (Envoy ``max_ejection_time``).
* :func:`success_rate_outliers`: Envoy's statistical rule: hosts with ≥ ``request_volume``
  requests in the interval, only when at least ``minimum_hosts`` qualify; eject those whose success
  rate is below ``mean − stdev_factor × stdev``.
* :func:`failure_percentage_outliers`: hosts at or above a fixed failure percentage.
* :func:`latency_outliers`: one latency measure (streamed time to first token, or the time per
  output token of non-streamed answers: never mixed) judged in one interval, like with like. A node
  is an outlier only when its interval median is over ``latency_factor ×`` its own learned
  baseline AND over ``latency_peer_factor ×`` the median of its peers' medians in the same
  interval. The first condition spares a node that is simply a slower GPU; the second spares every
  node when the whole fleet is slow at once (the gateway itself saturated, or a traffic change),
  since nothing is gained by ejecting one of several equally slow nodes.
* :func:`hardware_findings`: what a GPU report says compared with the previous one (new Xid, new
  uncorrected ECC errors, a lost GPU, failed row remapping → eject; throttling or temperature →
  drain) and the baseline to keep for the next comparison.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, NamedTuple

from inferlb.config.health import HardwareConfig, OutlierConfig, SlowStartConfig
from inferlb.fleet.gpu import xid_name

__all__ = [
    "LatencyStats",
    "ejection_seconds",
    "failure_percentage_outliers",
    "hardware_findings",
    "latency_outliers",
    "slow_start_factor",
    "success_rate_outliers",
]


def slow_start_factor(elapsed_s: float, cfg: SlowStartConfig) -> float:
    """Share of its weight a node gets ``elapsed_s`` after it (re)joined; 1.0 once the window is over."""
    if cfg.window_s <= 0 or elapsed_s >= cfg.window_s:
        return 1.0
    time_factor = max(elapsed_s, 0.001) / cfg.window_s
    return max(cfg.min_weight_percent / 100.0, float(time_factor ** (1.0 / cfg.aggression)))


def ejection_seconds(ejections_in_a_row: int, cfg: OutlierConfig) -> float:
    cap = max(cfg.max_ejection_s, cfg.base_ejection_s)
    return round(min(cap, cfg.base_ejection_s * max(1, ejections_in_a_row)), 6)


def success_rate_outliers(stats: dict[str, tuple[int, int]], cfg: OutlierConfig) -> dict[str, dict[str, Any]]:
    """``stats``: node → (requests, successes) in the interval. Returns node → evidence."""
    rates = {n: 100.0 * ok / req for n, (req, ok) in stats.items() if req >= cfg.success_rate_request_volume}
    if len(rates) < cfg.success_rate_minimum_hosts:
        return {}
    mean = statistics.fmean(rates.values())
    stdev = statistics.pstdev(rates.values())
    threshold = mean - cfg.success_rate_stdev_factor * stdev
    return {n: {"rule": "success_rate", "success_rate": round(r, 3), "cluster_mean": round(mean, 3),
                "threshold": round(threshold, 3), "requests": stats[n][0]}
            for n, r in rates.items() if r < threshold}


def failure_percentage_outliers(stats: dict[str, tuple[int, int]], cfg: OutlierConfig
                                ) -> dict[str, dict[str, Any]]:
    qualified = {n: v for n, v in stats.items() if v[0] >= cfg.failure_percentage_request_volume}
    if len(qualified) < cfg.failure_percentage_minimum_hosts:
        return {}
    out = {}
    for n, (req, ok) in qualified.items():
        pct = 100.0 * (req - ok) / req
        if pct >= cfg.failure_percentage_threshold:
            out[n] = {"rule": "failure_percentage", "failure_percent": round(pct, 3),
                      "threshold": cfg.failure_percentage_threshold, "requests": req}
    return out


class LatencyStats(NamedTuple):
    """One node's figures for one latency measure: this interval's median and sample count, and
    the baseline learned from earlier intervals (with how many intervals taught it)."""

    median_s: float | None
    requests: int
    baseline_s: float | None
    intervals_learned: int


def latency_outliers(measure: str, stats: dict[str, LatencyStats], cfg: OutlierConfig
                     ) -> dict[str, dict[str, Any]]:
    """``stats``: node → its :class:`LatencyStats` for ``measure`` (``"ttft"`` or ``"tpot"``), the
    nodes being peers (they serve one model). Returns node → evidence for the outliers."""
    qualified = {n: s for n, s in stats.items()
                 if s.median_s is not None and math.isfinite(s.median_s) and s.requests >= cfg.latency_request_volume}
    out: dict[str, dict[str, Any]] = {}
    for n, s in qualified.items():
        assert s.median_s is not None
        if s.baseline_s is None or s.baseline_s <= 0 or s.intervals_learned < cfg.latency_baseline_intervals:
            continue
        if s.median_s <= cfg.latency_factor * s.baseline_s:
            continue
        peers = [p.median_s for m, p in qualified.items() if m != n and p.median_s is not None]
        if len(peers) < cfg.latency_minimum_peers:
            continue   # no peers to compare with: a slow node and a slow gateway look the same
        peer_median = statistics.median(peers)
        if s.median_s <= cfg.latency_peer_factor * peer_median:
            continue
        out[n] = {"rule": "latency", "measure": measure, "median_s": round(s.median_s, 6),
                  "baseline_s": round(s.baseline_s, 6), "factor": cfg.latency_factor,
                  "peer_median_s": round(peer_median, 6), "peer_factor": cfg.latency_peer_factor,
                  "peers": len(peers), "requests": s.requests}
    return out


def _gpu_key(g: dict[str, Any], i: int) -> str:
    return str(g.get("uuid") or g.get("index", i))


def _int(v: Any) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) else None


def hardware_findings(report: dict[str, Any], baseline: dict[str, Any] | None, cfg: HardwareConfig
                      ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Findings (``{"action": "eject"|"drain", "kind", "gpu", "detail"}``) and the new baseline.

    The first report of a node (``baseline`` None) only sets the baseline for *counters*: an Xid
    from before we watched is history, not news. A new agent process (``boot_id`` changed) makes
    every Xid it counted new. Conditions that hold *now* (lost GPU, failed row remapping,
    throttling) are findings on every report.
    """
    findings: list[dict[str, Any]] = []
    if report.get("nvml") != "ok":
        return findings, baseline or {}
    boot = report.get("boot_id")
    first = baseline is None
    prev_gpus: dict[str, Any] = {} if baseline is None else dict(baseline.get("gpus") or {})
    rebooted = not first and boot is not None and baseline is not None and baseline.get("boot_id") != boot
    events = [e for e in report.get("xid_events") or [] if isinstance(e, dict)]
    new_base: dict[str, Any] = {"boot_id": boot, "gpus": {}}
    for i, g in enumerate(report.get("gpus") or []):
        if not isinstance(g, dict):
            continue
        key = _gpu_key(g, i)
        idx = g.get("index", i)
        prev = {} if rebooted else dict(prev_gpus.get(key) or {})
        count, last = _int(g.get("xid_errors")), _int(g.get("xid_last"))
        unc = _int((g.get("ecc_errors") or {}).get("uncorrected"))
        seq = max((int(e.get("seq", 0)) for e in events if e.get("gpu") == idx), default=prev.get("seq", 0))
        new_base["gpus"][key] = {"xid_errors": count, "xid_last": last, "ecc_uncorrected": unc, "seq": seq}
        if g.get("lost"):
            findings.append({"action": "eject", "kind": "gpu_lost", "gpu": idx, "detail": f"GPU {idx} is lost"})
        if g.get("row_remap_failure"):
            findings.append({"action": "eject", "kind": "row_remap", "gpu": idx,
                             "detail": f"GPU {idx}: row remapping failed (uncorrectable memory)"})
        if not first or rebooted:
            xids: list[int] = []
            if count is not None:
                before = prev.get("xid_errors") if not rebooted else 0
                if before is not None and count > before:
                    new_events = [int(e["xid"]) for e in events
                                  if e.get("gpu") == idx and int(e.get("seq", 0)) > int(prev.get("seq", 0))]
                    xids = new_events or ([last] if last is not None else [0])
            elif last is not None and last != prev.get("xid_last"):
                xids = [last]
            acted = [x for x in xids if x not in cfg.xid_ignore]
            if xids and cfg.eject_on_xid and acted:
                findings.append({"action": "eject", "kind": "xid", "gpu": idx, "xids": xids,
                                 "detail": f"GPU {idx}: new {', '.join(xid_name(x) for x in acted)}"})
            elif xids:
                findings.append({"action": "none", "kind": "xid", "gpu": idx, "xids": xids,
                                 "detail": f"GPU {idx}: new {', '.join(xid_name(x) for x in xids)} (ignored)"})
            before_unc = prev.get("ecc_uncorrected") if not rebooted else 0
            if cfg.eject_on_uncorrected_ecc and unc is not None and before_unc is not None and unc > before_unc:
                findings.append({"action": "eject", "kind": "ecc", "gpu": idx,
                                 "detail": f"GPU {idx}: {unc - before_unc} new uncorrected ECC error(s)"})
        throttled = [r for r in (g.get("throttle_reasons") or []) if r in cfg.drain_on]
        if throttled:
            findings.append({"action": "drain", "kind": "throttle", "gpu": idx, "reasons": throttled,
                             "detail": f"GPU {idx} throttling: {', '.join(throttled)}"})
        temp = g.get("temperature_c")
        if cfg.max_temperature_c is not None and isinstance(temp, int | float) and temp > cfg.max_temperature_c:
            findings.append({"action": "drain", "kind": "temperature", "gpu": idx,
                             "detail": f"GPU {idx} at {temp} °C (max {cfg.max_temperature_c})"})
    return findings, new_base
