"""Actuators: where a plan goes. ``dry-run`` (record only), ``local`` (emulated nodes joined to the
gateway's fleet), ``kubernetes`` (scale subresource), ``webhook`` (POST the plan), or one of your
own. The contract is in :mod:`.actuator`.

The kinds are one table, :data:`inferlb.config.autoscale.ACTUATORS` (kind → ``"module:attr"``,
checked when the fleet file loads); a kind's target is a factory ``(cfg, ctx) -> Actuator`` where
``ctx`` is the :class:`ActuatorContext` the composition root hands over (the ``local`` one needs its
fleet port and node launcher). The built-ins' factories are here and import their actuator's
module only when chosen. :func:`build_actuator` resolves the configured kind and calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from inferlb.autoscale.actuator import Actuator
from inferlb.autoscale.actuator_dryrun import DryRunActuator
from inferlb.config.autoscale import ACTUATORS, AutoscaleConfig
from inferlb.types import Clock

__all__ = ["ActuatorContext", "build_actuator", "make_dry_run", "make_kubernetes", "make_local", "make_webhook"]


@dataclass(frozen=True)
class ActuatorContext:
    """What an actuator factory may use besides the config: the clock, the fleet port and node
    launcher (``local``), the GPU label and prices, a Kubernetes API client (None: from the config)."""

    clock: Clock
    port: Any = None
    launcher: Any = None
    gpu_label: str = "gpu"
    gpu_prices: dict[str, float] | None = field(default=None)
    api_client: Any = None


def make_dry_run(cfg: AutoscaleConfig, ctx: ActuatorContext) -> Actuator:
    return DryRunActuator(cfg)


def make_local(cfg: AutoscaleConfig, ctx: ActuatorContext) -> Actuator:
    """``local`` without a launcher is a ConfigError-worthy ValueError."""
    if ctx.port is None or ctx.launcher is None:
        raise ValueError("actuator local needs a node launcher: it runs under `inferlb demo --autoscale`")
    from inferlb.autoscale.actuator_local import LocalActuator

    return LocalActuator(cfg, ctx.port, ctx.launcher, clock=ctx.clock, gpu_label=ctx.gpu_label,
                         gpu_prices=ctx.gpu_prices)


def make_kubernetes(cfg: AutoscaleConfig, ctx: ActuatorContext) -> Actuator:
    from inferlb.autoscale.actuator_kubernetes import KubernetesActuator

    return KubernetesActuator(cfg, ctx.api_client)


def make_webhook(cfg: AutoscaleConfig, ctx: ActuatorContext) -> Actuator:
    from inferlb.autoscale.actuator_webhook import WebhookActuator

    return WebhookActuator(cfg)


def build_actuator(cfg: AutoscaleConfig, *, clock: Clock, port: Any = None, launcher: Any = None,
                   gpu_label: str = "gpu", gpu_prices: dict[str, float] | None = None,
                   api_client: Any = None) -> Actuator:
    """The configured actuator (``cfg.actuator.kind`` through :data:`ACTUATORS`); PluginError when
    the kind does not resolve, ValueError for ``local`` without a launcher."""
    factory = ACTUATORS.load(cfg.actuator.kind)
    ctx = ActuatorContext(clock, port, launcher, gpu_label, gpu_prices, api_client)
    actuator: Actuator = factory(cfg, ctx)
    return actuator
