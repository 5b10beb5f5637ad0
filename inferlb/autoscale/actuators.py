"""Actuators: where a plan goes. ``dry-run`` (record only), ``local`` (emulated nodes joined to the
gateway's fleet), ``kubernetes`` (scale subresource), ``webhook`` (POST the plan). The contract is
in :mod:`.base`; :func:`build_actuator` picks one from the config (the ``local`` one needs a fleet
port and a node launcher, injected by the composition root)."""

from __future__ import annotations

from typing import Any

from inferlb.autoscale.actuator import Actuator
from inferlb.autoscale.actuator_dryrun import DryRunActuator
from inferlb.config.autoscale import AutoscaleConfig
from inferlb.types import Clock

__all__ = ["build_actuator"]


def build_actuator(cfg: AutoscaleConfig, *, clock: Clock, port: Any = None, launcher: Any = None,
                   gpu_label: str = "gpu", gpu_prices: dict[str, float] | None = None,
                   api_client: Any = None) -> Actuator:
    """The configured actuator. ``local`` without a launcher is a ConfigError-worthy ValueError."""
    kind = cfg.actuator.kind
    if kind == "local":
        if port is None or launcher is None:
            raise ValueError("actuator local needs a node launcher: it runs under `inferlb demo --autoscale`")
        from inferlb.autoscale.actuator_local import LocalActuator

        return LocalActuator(cfg, port, launcher, clock=clock, gpu_label=gpu_label, gpu_prices=gpu_prices)
    if kind == "kubernetes":
        from inferlb.autoscale.actuator_kubernetes import KubernetesActuator

        return KubernetesActuator(cfg, api_client)
    if kind == "webhook":
        from inferlb.autoscale.actuator_webhook import WebhookActuator

        return WebhookActuator(cfg)
    return DryRunActuator(cfg)
