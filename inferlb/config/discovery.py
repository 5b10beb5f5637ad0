"""The ``discovery:`` section of the fleet file: where nodes come from besides the file itself.

Contract: pure pydantic models (no I/O, no imports of the rest of the engine), strict like the rest
of the fleet file (unknown keys are errors, instances are frozen). The node template (``node:``)
is checked against the fleet's node schema and model list by ``FleetConfig`` (config/settings.py),
which names the key path (``discovery[0].node.capacity_tokens``).

::

    discovery:
      - kind: kubernetes
        namespace: inference
        service: llama-8b            # or label_selector: "app=llama,tier=gpu" (exactly one of them)
        port: http                   # the EndpointSlice port name (unset: the slice's only port)
        node:                        # every discovered pod becomes a node like this
          models: [llama-8b]
          kind: vllm
          capacity_tokens: 65536
          labels: {gpu: l4}
          price_per_hour: 0.8
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DiscoveryConfig", "KubernetesDiscoveryConfig"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KubernetesDiscoveryConfig(_Strict):
    """Nodes from the EndpointSlices (``discovery.k8s.io/v1``) of a Service, or of a label selector.

    Every ready endpoint (``conditions.ready`` true, not ``terminating``) becomes a node named
    ``name_prefix + pod name`` at ``scheme://address:port`` with the template's fields; one that
    turns not ready, terminating or disappears is drained, then removed once drained."""

    kind: Literal["kubernetes"] = "kubernetes"
    namespace: str = Field("default", min_length=1)
    service: str | None = Field(None, min_length=1)          # selects kubernetes.io/service-name=<service>
    label_selector: str | None = Field(None, min_length=1)   # any label selector over the EndpointSlices
    port: str | None = None              # EndpointSlice port name; unset: the slice must have exactly one port
    scheme: Literal["http", "https"] = "http"
    name_prefix: str = ""                # set it when two sources could see pods of the same name
    node: dict[str, Any]                 # a fleet-file node entry without name and url (models required)
    kubeconfig: str | None = None        # unset: the in-cluster service account
    context: str | None = None
    timeout_s: float = Field(10.0, gt=0)         # one list request; the connect of a watch
    watch_s: int = Field(300, ge=1)              # timeoutSeconds of one watch request (then it resumes)
    backoff_s: float = Field(1.0, gt=0)          # first wait after an API error, doubled per failure …
    max_backoff_s: float = Field(60.0, gt=0)     # … up to this
    settle_s: float = Field(1.0, gt=0)           # how often draining pods are checked for removal

    @model_validator(mode="after")
    def _one_selector(self) -> KubernetesDiscoveryConfig:
        if (self.service is None) == (self.label_selector is None):
            raise ValueError("give exactly one of service or label_selector")
        for key in ("name", "url"):
            if key in self.node:
                raise ValueError(f"node.{key}: set by discovery (pod name, endpoint address), not in the template")
        return self

    def selector(self) -> str:
        """The label selector over EndpointSlices: a Service's own label, or the configured one."""
        if self.service is not None:
            return f"kubernetes.io/service-name={self.service}"
        return str(self.label_selector)

    def label(self) -> str:
        """How logs, metrics and node events name this source."""
        return f"kubernetes:{self.namespace}/{self.service or self.label_selector}"


DiscoveryConfig = KubernetesDiscoveryConfig
