"""One pool of one model for the autoscaler's option tests (the skill gate, the level-shift guard,
the rise path, the upper-band release): its config, its capacity and a forecaster the test controls."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from inferlb.autoscale.capacity import Capacity
from inferlb.autoscale.forecast import Forecast
from inferlb.config.autoscale import AutoscaleConfig

STEP = 300.0
CAP = {("m", "l4"): Capacity("m", "l4", 100.0, "prior", "")}


def one_pool(**over: object) -> AutoscaleConfig:
    raw: dict[str, object] = {"interval_s": 60, "step_s": STEP, "target_utilisation": 0.5,
                              "scale_down_stabilisation_s": 300, "forecaster": "reactive",
                              "pools": [{"model": "m", "gpu": "l4", "min": 1, "max": 100, "cold_start_s": 300,
                                         "price_per_hour": 0.8}]}
    raw.update(over)
    return AutoscaleConfig.model_validate(raw)


class Fixed:
    """A forecaster that answers ``values(history)`` (or a constant): the test decides how good it is."""

    name = "fixed"

    def __init__(self, values: float | Callable[[Sequence[float]], float]) -> None:
        self.values = values

    def forecast(self, history: Sequence[float], horizon: int, season: int) -> Forecast:
        v = self.values(history) if callable(self.values) else self.values
        return Forecast(tuple(float(v) for _ in range(horizon)), self.name)
