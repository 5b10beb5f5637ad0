"""Prometheus gauges of the autoscaler, read from the runner at scrape time.

* ``inferlb_autoscale_forecast_tokens_per_second{model}``: the forecast for the next step;
* ``inferlb_autoscale_actual_tokens_per_second{model}``: the last observed step;
* ``inferlb_autoscale_capacity_tokens_per_second{model}``: replicas in place × capacity at SLO;
* ``inferlb_autoscale_replicas{model,gpu,kind}``: ``kind`` = ``current`` | ``desired``;
* ``inferlb_autoscale_rounds{outcome}``: counter, ``ok`` | ``failed`` | ``standby``;
* ``inferlb_autoscale_actuation_failures``: counter of pools an actuator failed to change;
* ``inferlb_autoscale_leader``: 1 when this replica runs the rounds.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from inferlb.autoscale.runner import AutoscaleRunner

__all__ = ["AutoscaleCollector"]


class AutoscaleCollector(Collector):
    def __init__(self, runner: AutoscaleRunner) -> None:
        self.runner = runner

    def collect(self) -> Iterable[Metric]:
        r = self.runner
        fc = GaugeMetricFamily("inferlb_autoscale_forecast_tokens_per_second",
                               "Forecast load for the next step (tokens/s)", labels=["model"])
        act = GaugeMetricFamily("inferlb_autoscale_actual_tokens_per_second",
                                "Observed load of the last complete step (tokens/s)", labels=["model"])
        cap = GaugeMetricFamily("inferlb_autoscale_capacity_tokens_per_second",
                                "Replicas in place x capacity at SLO per replica (tokens/s)", labels=["model"])
        latest: dict[str, dict[str, object]] = {}
        for p in r.points:
            latest[str(p["model"])] = p
        for model, p in sorted(latest.items()):
            if isinstance(p.get("forecast"), int | float):
                fc.add_metric([model], float(p["forecast"]))  # type: ignore[arg-type]
            act.add_metric([model], float(p["actual"]))  # type: ignore[arg-type]
            cap.add_metric([model], float(p["capacity"]))  # type: ignore[arg-type]
        reps = GaugeMetricFamily("inferlb_autoscale_replicas", "Replicas per pool", labels=["model", "gpu", "kind"])
        for (model, gpu), v in sorted(r.replicas.items()):
            reps.add_metric([model, gpu, "current"], float(v["current"]))
            reps.add_metric([model, gpu, "desired"], float(v["desired"]))
        rounds = CounterMetricFamily("inferlb_autoscale_rounds", "Autoscale rounds by outcome", labels=["outcome"])
        rounds.add_metric(["ok"], float(r.rounds - r.failed_rounds))
        rounds.add_metric(["failed"], float(r.failed_rounds))
        rounds.add_metric(["standby"], float(r.standby_rounds))
        fails = CounterMetricFamily("inferlb_autoscale_actuation_failures",
                                    "Pools an actuator failed to change (retried next round)")
        fails.add_metric([], float(r.actuation_failures))
        leader = GaugeMetricFamily("inferlb_autoscale_leader", "1 when this replica runs the autoscale rounds")
        leader.add_metric([], 1.0 if r.leader() else 0.0)
        yield from (fc, act, cap, reps, rounds, fails, leader)
