"""The blocking half of Kubernetes discovery: list and watch EndpointSlices with the maintained
``kubernetes`` client (``DiscoveryV1Api.list_namespaced_endpoint_slice`` and ``watch.Watch``).

Runs in a worker thread only (discovery/source.py calls it through ``asyncio.to_thread``):

* :meth:`EndpointSliceClient.list`: the slices and the list's ``resourceVersion``;
* :meth:`EndpointSliceClient.watch`: one watch request from a ``resourceVersion``
  (``allowWatchBookmarks``, ``timeoutSeconds`` = ``watch_s``, a client read timeout a little past
  it), handing each event to a callback; returns the last ``resourceVersion`` when the server
  ends the watch. A ``410 Gone`` (the version is too old: an ``ERROR`` event or the status of the
  request) raises :class:`WatchGone`: the caller lists again. Any other failure raises as it is.

The pure code in discovery/slices.py reads each event's ``raw_object`` (the API's JSON,
camelCase keys; ``deserialize=False`` is not used: the client's 410 handling needs the default).
Needs the ``kubernetes`` extra (``pip install 'inferlb[kubernetes]'``).
"""

from __future__ import annotations

import importlib
import json
import threading
from collections.abc import Callable
from typing import Any

from inferlb.config.discovery import KubernetesDiscoveryConfig
from inferlb.errors import InferlbError

__all__ = ["EndpointSliceClient", "WatchGone", "api_error"]

GONE = 410


class WatchGone(InferlbError):
    """The watch's resourceVersion is gone (HTTP 410): list again."""


def api_error(exc: BaseException) -> str:
    """One line for logs and status: ``kubernetes API 403 Forbidden: …`` or the exception."""
    status = getattr(exc, "status", None)
    if status is not None:
        body = str(getattr(exc, "body", "") or "")
        return f"kubernetes API {status} {getattr(exc, 'reason', '') or ''}: {body[:300]}".strip().rstrip(":")
    return f"{type(exc).__name__}: {exc}"[:500]


def build_api_client(kubeconfig: str | None, context: str | None) -> Any:
    """An ``ApiClient`` from a kubeconfig file, else from the in-cluster service account."""
    config = importlib.import_module("kubernetes.config")
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig, context=context)
    config.load_incluster_config()
    return importlib.import_module("kubernetes.client").ApiClient()


class EndpointSliceClient:
    def __init__(self, cfg: KubernetesDiscoveryConfig, api_client: Any | None = None) -> None:
        self.cfg = cfg
        self.api_client = api_client if api_client is not None else build_api_client(cfg.kubeconfig, cfg.context)
        self.api = importlib.import_module("kubernetes.client").DiscoveryV1Api(self.api_client)
        self._watch_mod = importlib.import_module("kubernetes.watch")
        self._stopped = threading.Event()
        self._watch: Any = None

    def list(self) -> tuple[list[dict[str, Any]], str | None]:
        resp = self.api.list_namespaced_endpoint_slice(self.cfg.namespace, label_selector=self.cfg.selector(),
                                                       _request_timeout=self.cfg.timeout_s, _preload_content=False)
        try:
            doc = json.loads(resp.data)
        finally:
            resp.release_conn()
        return list(doc.get("items") or []), (doc.get("metadata") or {}).get("resourceVersion")

    def watch(self, resource_version: str | None, on_event: Callable[[str, dict[str, Any]], None]) -> str | None:
        rv = resource_version
        w = self._watch = self._watch_mod.Watch()
        if self._stopped.is_set():
            return rv
        try:
            for event in w.stream(self.api.list_namespaced_endpoint_slice, self.cfg.namespace,
                                  label_selector=self.cfg.selector(), resource_version=rv,
                                  timeout_seconds=self.cfg.watch_s, allow_watch_bookmarks=True,
                                  _request_timeout=(self.cfg.timeout_s, self.cfg.watch_s + 30)):
                obj = event.get("raw_object") or {}
                if event.get("type") == "ERROR":   # Watch raises for these itself; kept for safety
                    if obj.get("code") == GONE:
                        raise WatchGone(str(obj.get("message", "")))
                    raise RuntimeError(f"watch error: {obj.get('reason')}: {obj.get('message')}")
                new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                if new_rv:
                    rv = str(new_rv)
                on_event(str(event.get("type")), obj)
                if self._stopped.is_set():
                    break
        except Exception as exc:
            if getattr(exc, "status", None) == GONE:
                raise WatchGone(api_error(exc)) from exc
            raise
        finally:
            self._watch = None
        return rv

    def stop(self) -> None:
        """Ends a running watch (from any thread): the next event, or the socket shut down now."""
        self._stopped.set()
        w = self._watch
        if w is not None:
            w.stop()

    def close(self) -> None:
        self.stop()
        close = getattr(self.api_client, "close", None)
        if callable(close):
            close()
