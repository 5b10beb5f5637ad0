"""The sweeps of the node-health process: take nodes out (:func:`isolate`) and bring them back
(:func:`restore`). Both mutate a :class:`~inferlb.fleet.state.Fleet` on the event loop through its
transition methods (so every change is an audit event) and return the events they caused as JSON.

:func:`isolate` (after :func:`observe` stored the round's samples):

* probes: ``loading`` → state ``loading`` at once (a loading server gets no traffic);
  ``unhealthy_threshold`` consecutive failures → ``down``;
* GPU reports (:func:`~inferlb.fleet.rules.hardware_findings`): a new Xid, new
  uncorrected ECC errors, a lost GPU or failed row remapping → ``ejected`` for
  ``hardware.ejection_s`` (not limited by the ejection share, never offered in panic mode);
  throttling from ``hardware.drain_on`` → ``draining``;
* every ``outlier.interval_s``: Envoy's success-rate and failure-percentage rules per model, and
  the latency rule (like with like, against the node's own baseline and its peers); then the
  interval counters reset and every node that stayed healthy has its ejection multiplier
  decremented (Envoy).

Nodes an operator drained or removed (``held``, live/fleet_admin.py) are left alone by both.

:func:`restore`: a cooldown that ran out → ``healthy`` (no slow start); an ejection that ran out
→ ``half_open`` (or ``down`` / ``loading`` when the probes say so); ``down`` / ``loading`` with
``healthy_threshold`` good probes → ``healthy`` in slow start; ``draining`` whose throttling
cleared (or whose GPU report went stale: unknown is not throttling) → ``healthy`` in slow start.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from inferlb.fleet.node import NodeState
from inferlb.fleet.rules import (
    LatencyStats,
    failure_percentage_outliers,
    hardware_findings,
    latency_outliers,
    success_rate_outliers,
)
from inferlb.fleet.state import Fleet
from inferlb.node_types import NodeEvent, Sample

__all__ = ["RTT_ALPHA", "isolate", "observe", "outlier_sweep", "restore"]

_OUT_FOR_HEALTH = ("healthy", "cooldown", "half_open", "draining")


RTT_ALPHA = 0.2   # weight of the newest probe time in a node's round-trip EWMA


def observe(fleet: Fleet, samples: Iterable[dict[str, Any]]) -> int:
    """Keep each node's newest sample per source (and the last good metrics); returns how many.

    A probe that answered (any HTTP status: the network carried it) updates the node's round-trip
    estimate ``rtt_ms``, an EWMA (weight :data:`RTT_ALPHA` on the newest) of the probe's duration
    as the prober measured it (connect, when the keep-alive connection had to be made again, plus
    the request to the readiness path); a timeout or refused connect says nothing about distance
    and is left out (the probe rules take the node out instead)."""
    n = 0
    for raw in samples:
        s = Sample.from_json(raw)
        st = fleet.nodes.get(s.node)
        if st is None:
            continue
        old = st.samples.get(s.source)
        if old is None or s.taken_at >= old.taken_at:
            st.samples[s.source] = s
            fleet.touch(s.node)
            if s.source == "probe" and s.status is not None and s.latency_ms >= 0 \
                    and (old is None or s.taken_at > old.taken_at):   # the same sample twice counts once
                rtt = st.rtt_ms
                st.rtt_ms = s.latency_ms if rtt is None else (1 - RTT_ALPHA) * rtt + RTT_ALPHA * s.latency_ms
        if s.source == "metrics" and s.ok:
            st.load = s
        n += 1
    return n


def _events_since(fleet: Fleet, mark: int) -> list[dict[str, Any]]:
    evs: list[NodeEvent] = fleet.queued_events(mark)
    return [e.to_json() for e in evs]


def isolate(fleet: Fleet, assessment: dict[str, Any], *, unhealthy_threshold: int | None = None,
            hardware: bool = True, outliers: bool = True) -> list[dict[str, Any]]:
    cfg = fleet.health
    threshold = unhealthy_threshold or cfg.probe.unhealthy_threshold
    mark = fleet.events_queued()
    for name, a in (assessment.get("nodes") or {}).items():
        st = fleet.nodes.get(name)
        if st is None or st.held:    # an operator's drain or removal: only the operator brings it back
            continue
        _probe(fleet, st, a, threshold)
        if hardware:
            _hardware(fleet, st, a)
    if outliers:
        outlier_sweep(fleet)
    return _events_since(fleet, mark)


def _probe(fleet: Fleet, st: NodeState, a: dict[str, Any], threshold: int) -> None:
    verdict = a.get("probe")
    evidence = {"probe": verdict, "status": a.get("probe_status"), "error": a.get("probe_error")}
    if verdict == "ok":
        st.probe_successes += 1
        st.probe_failures = 0
    elif verdict == "fail":
        st.probe_failures += 1
        st.probe_successes = 0
    elif verdict == "loading":
        st.probe_failures = st.probe_successes = 0
        if st.state != "loading" and not (st.state == "ejected" and st.hardware_fault):
            st.slow_start_at = None
            fleet.transition(st, "loading", "the server reports it is loading (503 from its readiness probe)",
                             evidence)
        return
    if verdict == "fail" and st.probe_failures >= threshold and st.state in (*_OUT_FOR_HEALTH, "loading"):
        st.slow_start_at = None
        fleet.transition(st, "down", f"{st.probe_failures} consecutive failed probes: {a.get('probe_error')}",
                         {**evidence, "consecutive_probe_failures": st.probe_failures, "threshold": threshold})


def _hardware(fleet: Fleet, st: NodeState, a: dict[str, Any]) -> None:
    if a.get("gpu") != "ok":
        return
    findings, st.hw_baseline = hardware_findings(a["gpu_report"], st.hw_baseline, fleet.health.hardware)
    st.hw_findings = findings
    st.hw_at = fleet.clock.monotonic()
    ejects = [f for f in findings if f["action"] == "eject"]
    if ejects:
        if st.state == "ejected" and st.hardware_fault:
            # Still (or again) faulty while out: extend the ejection, no new count or event.
            st.ejected_until = max(st.ejected_until, fleet.clock.monotonic() + fleet.health.hardware.ejection_s)
            st.evidence = {**st.evidence, "latest_findings": ejects}
            return
        fleet.eject(st.cfg.name, "hardware: " + "; ".join(f["detail"] for f in ejects),
                    {"rule": "hardware", "source": a.get("gpu_source"), "findings": ejects}, hardware=True)
        return
    drains = [f for f in findings if f["action"] == "drain"]
    if drains and st.state in ("healthy", "cooldown", "half_open"):
        st.slow_start_at = None
        fleet.transition(st, "draining", "; ".join(f["detail"] for f in drains),
                         {"rule": "hardware", "source": a.get("gpu_source"), "findings": drains})


def outlier_sweep(fleet: Fleet, *, force: bool = False) -> list[str]:
    """Envoy's interval analysis; runs when ``outlier.interval_s`` passed (or ``force``). Returns
    the nodes it ejected."""
    cfg = fleet.health.outlier
    now = fleet.clock.monotonic()
    if not force and now - fleet.last_outlier_sweep < cfg.interval_s:
        return []
    fleet.last_outlier_sweep = now
    live = {n: st for n, st in fleet.nodes.items() if st.state in ("healthy", "cooldown")}
    stats = {n: (st.iv_requests, st.iv_successes) for n, st in live.items()}
    found: dict[str, dict[str, Any]] = {}
    for names in fleet.serving.values():
        group = {n: stats[n] for n in names if n in stats}
        if _enforced(fleet, cfg.enforcing_success_rate):
            for n, ev in success_rate_outliers(group, cfg).items():
                found.setdefault(n, ev)
        if _enforced(fleet, cfg.enforcing_failure_percentage):
            for n, ev in failure_percentage_outliers(group, cfg).items():
                found.setdefault(n, ev)
    _latency(fleet, live, found)
    ejected = []
    # Worst first, so the ejection share cap keeps the healthiest nodes in.
    for n, ev in sorted(found.items(), key=lambda kv: kv[1].get("success_rate", 100.0)):
        what = {"success_rate": f"success rate {ev.get('success_rate')}% under {ev.get('threshold')}%",
                "failure_percentage": f"{ev.get('failure_percent')}% of requests failed",
                "latency": f"{_MEASURES.get(ev.get('measure', ''), 'latency')} {ev.get('median_s')}s over "
                           f"{ev.get('factor')}× its baseline {ev.get('baseline_s')}s and "
                           f"{ev.get('peer_factor')}× its peers' median {ev.get('peer_median_s')}s"}[ev["rule"]]
        if fleet.eject(n, f"outlier: {what}", ev):
            ejected.append(n)
    for n, st in fleet.nodes.items():
        if n not in ejected and st.state in ("healthy", "cooldown") and st.backoff > 0:
            st.backoff -= 1   # Envoy: a host healthy for an interval sheds one step of its multiplier
        st.iv_requests = st.iv_successes = 0
        st.iv_ttft = []
        st.iv_tpot = []
    return ejected


_MEASURES = {"ttft": "time to first token (streamed)", "tpot": "time per output token (not streamed)"}


def _latency_stats(st: NodeState, measure: str) -> LatencyStats:
    samples = st.iv_ttft if measure == "ttft" else st.iv_tpot
    median = statistics.median(samples) if samples else None
    if measure == "ttft":
        return LatencyStats(median, len(samples), st.ttft_baseline, st.ttft_intervals)
    return LatencyStats(median, len(samples), st.tpot_baseline, st.tpot_intervals)


def _latency(fleet: Fleet, live: dict[str, NodeState], found: dict[str, dict[str, Any]]) -> None:
    """The latency rule per model (peers) and measure; then each node not found slow teaches its
    baselines with this interval's medians (an outlier interval teaches nothing)."""
    cfg = fleet.health.outlier
    slow: dict[str, dict[str, Any]] = {}
    for measure in ("ttft", "tpot"):
        stats = {n: _latency_stats(st, measure) for n, st in live.items()}
        for names in fleet.serving.values():
            group = {n: stats[n] for n in names if n in stats}
            for n, ev in latency_outliers(measure, group, cfg).items():
                slow.setdefault(n, ev)
    for n, ev in slow.items():
        if _enforced(fleet, cfg.enforcing_latency):
            found.setdefault(n, ev)
    for n, st in live.items():
        if n in slow:
            continue
        for measure in ("ttft", "tpot"):
            s = _latency_stats(st, measure)
            if s.median_s is None or s.requests < cfg.latency_request_volume:
                continue
            if measure == "ttft":
                st.ttft_baseline = s.median_s if st.ttft_baseline is None else 0.7 * st.ttft_baseline + 0.3 * s.median_s
                st.ttft_intervals += 1
            else:
                st.tpot_baseline = s.median_s if st.tpot_baseline is None else 0.7 * st.tpot_baseline + 0.3 * s.median_s
                st.tpot_intervals += 1


def _enforced(fleet: Fleet, percent: int) -> bool:
    return percent >= 100 or (percent > 0 and fleet.rng.random() * 100 < percent)


def restore(fleet: Fleet, *, healthy_threshold: int | None = None) -> list[dict[str, Any]]:
    cfg = fleet.health
    threshold = healthy_threshold or cfg.probe.healthy_threshold
    now = fleet.clock.monotonic()
    stale = cfg.stale_after_s
    mark = fleet.events_queued()
    for st in fleet.nodes.values():
        if st.held:
            continue
        probed = "probe" in st.samples
        if st.state == "cooldown" and now >= st.cooldown_until:
            fleet.to_healthy(st, "Retry-After elapsed", {"rule": "cooldown"}, slow_start=False,
                             at=st.cooldown_until)
        elif st.state == "ejected":
            early = (cfg.outlier.successful_probe_uneject and not st.hardware_fault and probed
                     and st.probe_successes >= threshold)
            if now < st.ejected_until and not early:
                continue
            at = min(now, st.ejected_until)
            last = st.samples.get("probe")
            if probed and st.probe_failures >= cfg.probe.unhealthy_threshold:
                fleet.transition(st, "down", f"ejection over but {st.probe_failures} probes failed in a row",
                                 {"consecutive_probe_failures": st.probe_failures}, at=at)
            elif last is not None and last.values.get("loading") and last.age(now) <= stale:
                fleet.transition(st, "loading", "ejection over; the server reports it is loading", at=at)
            elif cfg.circuit.half_open_requests > 0:
                st.hardware_fault = False
                fleet.transition(st, "half_open", f"ejection time elapsed: admitting "
                                 f"{cfg.circuit.half_open_requests} trial request(s)",
                                 {"rule": "circuit", "trial_requests": cfg.circuit.half_open_requests}, at=at)
            else:
                fleet.to_healthy(st, "ejection time elapsed", {"rule": "ejection"}, at=at)
        elif st.state in ("down", "loading") and st.probe_successes >= threshold:
            fleet.to_healthy(st, f"{st.probe_successes} good probe(s) in a row",
                             {"rule": "probe", "threshold": threshold})
        elif st.state == "draining":
            fresh = st.hw_at is not None and now - st.hw_at <= stale
            if not fresh or not any(f["action"] == "drain" for f in st.hw_findings):
                fleet.to_healthy(st, "GPU throttling cleared" if fresh else "GPU report stale: drain lifted",
                                 {"rule": "hardware"})
    return _events_since(fleet, mark)
