"""Build the discovery sources of a running gateway (called from ``create_app``'s lifespan only).

One :class:`~.source.KubernetesDiscovery` per ``discovery:`` entry of the fleet file, handing its
nodes to :meth:`LiveConfig.set_discovered <inferlb.live.manager.LiveConfig.set_discovered>` and
reading node states from the live fleet; their Prometheus collector on the app's registry.
"""

from __future__ import annotations

from typing import Any

from inferlb.config.settings import FleetConfig
from inferlb.discovery.metrics import DiscoveryCollector
from inferlb.discovery.source import KubernetesDiscovery
from inferlb.errors import ConfigError
from inferlb.fleet.state import Fleet
from inferlb.live.manager import LiveConfig
from inferlb.types import Clock

__all__ = ["build_discovery"]


def build_discovery(fleet_cfg: FleetConfig, *, live: LiveConfig, fleet: Fleet, clock: Clock,
                    registry: Any = None) -> list[KubernetesDiscovery]:
    """The sources, their API clients made from each one's kubeconfig or the in-cluster service
    account; ConfigError naming ``discovery[i]`` when that cannot be done (no ``kubernetes``
    package, no kubeconfig, not in a cluster)."""
    from inferlb.discovery.kubernetes import EndpointSliceClient

    def states() -> dict[str, str]:
        return {name: st.state for name, st in fleet.nodes.items()}

    out = []
    for i, cfg in enumerate(fleet_cfg.discovery):
        try:
            client = EndpointSliceClient(cfg)
        except ImportError as exc:
            raise ConfigError(f"Kubernetes discovery needs the kubernetes package (pip install "
                              f"'inferlb[kubernetes]'): {exc}", path=f"discovery[{i}]") from exc
        except Exception as exc:   # kubernetes.config.ConfigException, a kubeconfig that cannot be read
            where = f"kubeconfig {cfg.kubeconfig}" if cfg.kubeconfig else "the in-cluster service account"
            raise ConfigError(f"cannot configure the Kubernetes client from {where}: {exc}",
                              path=f"discovery[{i}]") from exc
        out.append(KubernetesDiscovery(cfg, apply=live.set_discovered, node_states=states, clock=clock,
                                       client=client))
    if registry is not None and out:
        registry.register(DiscoveryCollector(out))
    return out
