"""``kubernetes``: sets ``spec.replicas`` through the **scale subresource** of each pool's workload.

Each pool names its workload (``pools[].workload``: ``deployment/NAME`` or ``statefulset/NAME``,
in ``pools[].namespace``): one Deployment / StatefulSet per model and GPU type (its pods pinned to
that GPU type by a node selector). The calls are the maintained ``kubernetes`` Python client's
``AppsV1Api.read_namespaced_{deployment,stateful_set}_scale`` and
``patch_namespaced_{deployment,stateful_set}_scale`` (a JSON merge patch of ``spec.replicas``,
the same request ``kubectl scale`` and the HPA make), run in a worker thread with the
actuator's ``timeout_s``. Needs the ``kubernetes`` extra (``pip install 'inferlb[kubernetes]'``).

* ``current``: each workload's ``spec.replicas`` (what is asked; pods still starting count, as
  they will serve after their cold start). A pool whose read fails is left out of the answer
  and the error is kept for the round's record.
* Scale-down: Kubernetes removes the pods; draining is the pod's own graceful termination
  (``preStop`` + ``terminationGracePeriodSeconds``, during which the model server finishes its
  requests and inferlb's node health marks it out). This actuator does not pick the victim pods.
* Any API error (``ApiException``: 403, 404, 409, 5xx) or timeout is that pool's failed result.

Authentication: ``actuator.kubeconfig`` (and ``context``) when set, else the in-cluster service
account (RBAC: ``get`` and ``patch`` on ``deployments/scale`` / ``statefulsets/scale``, granted
to the gateway's ServiceAccount by ``deploy/kubernetes/rbac.yaml``).
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

from inferlb.autoscale.actuator import PoolResult, guard_min
from inferlb.autoscale.planner import Plan
from inferlb.config.autoscale import AutoscaleConfig, PoolConfig

__all__ = ["KubernetesActuator", "build_api_client"]


def build_api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """An ``ApiClient`` from a kubeconfig file, else from the in-cluster service account."""
    config = importlib.import_module("kubernetes.config")
    client = importlib.import_module("kubernetes.client")
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    config.load_incluster_config()
    return client.ApiClient()


def _error(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if status is not None:
        body = str(getattr(exc, "body", "") or "")
        return f"kubernetes API {status} {reason or ''}: {body[:300]}".strip()
    return f"{type(exc).__name__}: {exc}"[:500]


class KubernetesActuator:
    name = "kubernetes"

    def __init__(self, cfg: AutoscaleConfig, api_client: Any | None = None) -> None:
        self.cfg = cfg
        self.pools = {(p.model, p.gpu): p for p in cfg.pools}
        if api_client is None:
            api_client = build_api_client(cfg.actuator.kubeconfig, cfg.actuator.context)
        self.api_client = api_client
        self.apps = importlib.import_module("kubernetes.client").AppsV1Api(api_client)
        self.timeout_s = cfg.actuator.timeout_s
        self.read_errors: dict[tuple[str, str], str] = {}

    def _target(self, pool: PoolConfig) -> tuple[str, str]:
        kind, _, name = (pool.workload or "").partition("/")
        return ("deployment" if kind == "deployment" else "stateful_set"), name

    def _read(self, pool: PoolConfig) -> int:
        kind, name = self._target(pool)
        fn = getattr(self.apps, f"read_namespaced_{kind}_scale")
        scale = fn(name, pool.namespace, _request_timeout=self.timeout_s)
        return int(scale.spec.replicas or 0)

    def _patch(self, pool: PoolConfig, replicas: int) -> int:
        kind, name = self._target(pool)
        fn = getattr(self.apps, f"patch_namespaced_{kind}_scale")
        scale = fn(name, pool.namespace, {"spec": {"replicas": replicas}}, _request_timeout=self.timeout_s,
                   _content_type="application/merge-patch+json", field_manager="inferlb-autoscaler")
        return int(scale.spec.replicas or 0)

    async def current(self) -> dict[tuple[str, str], int]:
        out: dict[tuple[str, str], int] = {}
        self.read_errors = {}
        for key, pool in self.pools.items():
            try:
                out[key] = await asyncio.to_thread(self._read, pool)
            except Exception as exc:   # the round records it; the pool is not planned blind
                self.read_errors[key] = _error(exc)
        return out

    async def apply(self, plan: Plan) -> list[PoolResult]:
        out = []
        for d in plan.changes:
            pool = self.pools.get(d.key)
            if pool is None:
                continue
            want = guard_min(d, self.pools)
            kind, name = self._target(pool)
            where = f"{pool.namespace}/{kind.replace('_', '')}/{name}"
            try:
                after = await asyncio.to_thread(self._patch, pool, want)
            except Exception as exc:
                out.append(PoolResult(d.model, d.gpu, d.current, want, None, False, _error(exc), where))
                continue
            out.append(PoolResult(d.model, d.gpu, d.current, want, after, after == want,
                                  None if after == want else f"the API answered replicas={after}", where))
        return out

    async def close(self) -> None:
        close = getattr(self.api_client, "close", None)
        if callable(close):
            await asyncio.to_thread(close)
