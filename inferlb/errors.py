"""The one exception tree of inferlb.

Foreign errors (aiohttp, SQLAlchemy, SpiffWorkflow, pydantic, YAML) are mapped into this tree at
exactly one boundary each (``raise ... from exc``); nothing above that boundary catches a foreign
exception type.

Every class deriving from :class:`InferlbError` is drawn here under its parent. The trunk is
defined in this module; a leaf defined beside the one part that raises it names its module first
(a path under ``inferlb/``). ``tests/test_errors.py`` walks the package and fails on a class left
out, drawn under another parent or in another module.

::

    InferlbError
    ├── ConfigError                 bad settings or fleet file (file, key path, message)
    │   └── PluginError             an extension point's name resolves to nothing (plugins.py)
    ├── ProcessError                a BPMN process does not parse / validate / run
    │   ├── ProcessValidationError  found at start-up or by ``inferlb validate`` (element ids)
    │   └── WorkflowRuntimeError    a task raised while a request's instance ran
    ├── ClientError                 the client's request is wrong; carries the OpenAI envelope
    │   ├── InvalidRequest          400 invalid_request_error
    │   ├── ModelNotFound           404 model_not_found
    │   ├── PayloadTooLarge         413
    │   ├── Unauthorized            401 invalid_api_key (missing, unknown, revoked or expired key)
    │   ├── Forbidden               403 permission_denied (e.g. a tenant key on an admin route)
    │   ├── RateLimited             429 with Retry-After (e.g. repeated failed authentication)
    │   ├── AuditUnavailable        503 audit_unavailable with Retry-After (the audit journal is full)
    │   ├── NotFound                404 not_found (an admin route's object, e.g. an unknown node)
    │   ├── Conflict                409 (e.g. removing a node that is not drained)
    │   ├── Unavailable             503 (a live change that needs the database while it is away)
    │   ├── UnsupportedMediaType    api/edge.py: 415 (the body is not declared JSON, or is compressed)
    │   ├── ShuttingDown            api/edge.py: 503 server_shutting_down (the gateway drains)
    │   ├── AuditRecordNotFound     api/audit.py: 404 request_not_found
    │   ├── KeyNotFound             api/keys.py: 404 key_not_found
    │   ├── _Unavailable            api/keys.py: 503 store_unavailable (the key store is away)
    │   ├── AutoscaleOff            api/capacity.py: 404 autoscale_off (no autoscale: section)
    │   ├── MetricsDisabled         api/metrics.py: 404 metrics_disabled
    │   ├── AssetNotFound           api/dashboard.py: 404 not_found (no such dashboard asset)
    │   ├── LoopDetected            engine/hops.py: 508 loop_detected (the request came back to this gateway)
    │   ├── RolloutBusy             rollout/errors.py: 409 rollout_conflict (a second running rollout)
    │   ├── RolloutNotFound         rollout/errors.py: 404 rollout_not_found
    │   └── RolloutUnavailable      rollout/errors.py: 503 store_unavailable (nothing was applied)
    ├── UpstreamError               one attempt against a node failed (data for the retry logic)
    │   ├── UpstreamConnectError    could not connect / connection reset before a response
    │   ├── UpstreamTimeout         connect / first-token / idle / total timeout (``phase``)
    │   ├── UpstreamStatusError     the node answered a non-2xx status
    │   └── UpstreamProtocolError   malformed response / SSE from the node
    ├── StoreError                  the database failed or refused a write (the audit writer retries / spools)
    │   ├── FencedOut               cluster/election.py: a write under a lease another replica now holds
    │   ├── RolloutConflict         rollout/store.py: the model already has a running rollout
    │   └── StaleOverrides          store/overrides.py: another replica changed the node overrides meanwhile
    ├── PredictionFault             routing/learned.py: the predictor's answer is unusable (the router falls back)
    ├── IncompatibleState           routing/predictor_state.py: a saved predictor this gateway cannot use
    │                               (also a ValueError)
    ├── WatchGone                   discovery/kubernetes.py: the watch's resourceVersion is gone (410): list again
    ├── NodeCrashed                 simulator/driver.py: an emulated node lost the sequence (crash, OOM)
    ├── ModelServerError            modelserver/llamacpp.py: a real model server could not start
    └── OptionError                 simulator/openai_format.py: an emulated node's unusable sampling field
                                    (also a ValueError)

Internal exceptions stay outside the tree: each is raised and caught in the one module that defines
it, never crossing a module boundary, so no caller can meet it.

::

    _KeyPathError       config/settings.py: a cross-field check's problem with its key path, raised in a
                        pydantic validator (a ValueError); the loader turns it into a ConfigError
    _FileProblem        config/tls.py: a certificate, key or CA file that does not load (a ValueError);
                        each caller turns it into its own error naming the field at fault
    _RefusedAddress     fleet/netguard.py: a node's host name resolved only to addresses the network policy
                        refuses (an OSError raised from the resolver); aiohttp reports it as a connect error
    _TooLarge           health/probe.py: a probe body over ``max_body_bytes``; the probe records a
                        failed sample
    _Refused            server/protocol.py: an httptools.HttpParserError raised from a parser callback to
                        stop parsing; the protocol answers the refusal (431) itself
    _BadRequest         simulator/node.py: an emulated node's 4xx; its handler answers with the envelope
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from typing import Any

__all__ = [
    "DEFAULT_RETRY_ON_STATUS",
    "AuditUnavailable",
    "ClientError",
    "ConfigError",
    "Conflict",
    "Forbidden",
    "InferlbError",
    "InvalidRequest",
    "ModelNotFound",
    "NotFound",
    "PayloadTooLarge",
    "PluginError",
    "ProcessError",
    "ProcessValidationError",
    "RateLimited",
    "StoreError",
    "Unauthorized",
    "Unavailable",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamProtocolError",
    "UpstreamStatusError",
    "UpstreamTimeout",
    "WorkflowRuntimeError",
    "error_body",
    "error_event",
    "error_json",
]


def error_body(message: str, type: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """THE OpenAI error body, ``{"error": {"message", "type", "param", "code"}}``: every error a
    client gets (JSON answers, the SSE error event, the raw-socket 408/431) is built here."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_json(message: str, type: str = "invalid_request_error", code: str | None = None,
               param: str | None = None) -> bytes:
    """:func:`error_body` as JSON bytes (a response body)."""
    return json.dumps(error_body(message, type, code, param)).encode()


def error_event(message: str, type: str = "server_error", code: str | None = None) -> bytes:
    """:func:`error_body` as one SSE event (``data: {...}``), the in-band error of a stream."""
    return b"data: " + error_json(message, type, code) + b"\n\n"


# Upstream statuses worth another node by default (the fleet file's ``retry.retry_on_status``). 500
# is one: a model server's internal error (an engine fault, a crashed worker) is the node's, and
# another node usually answers; the retry budget (admission) still bounds the attempts.
DEFAULT_RETRY_ON_STATUS: tuple[int, ...] = (429, 500, 502, 503, 504)


class InferlbError(Exception):
    """Base of every error inferlb raises on purpose."""


class ConfigError(InferlbError):
    """Invalid settings or fleet file.

    ``str(err)`` names the file, the key path (``nodes[2].url``) and what is wrong, so an operator
    can fix the file without reading a traceback.
    """

    def __init__(self, message: str, *, source: str | None = None, path: str | None = None) -> None:
        self.source = source
        self.path = path
        self.message = message
        where = ": ".join(p for p in (source, path) if p)
        super().__init__(f"{where}: {message}" if where else message)


class PluginError(ConfigError):
    """A name given to an extension point (a routing plugin, a predictor, an actuator …) is neither
    one of its built-ins nor a ``module:attr`` that loads (:mod:`inferlb.plugins`).

    ``point`` is the extension point (``"actuator"``), ``name`` what was asked for and ``known`` the
    built-in names; the message says all three and why the name did not load.
    """

    def __init__(self, message: str, *, point: str, name: str, known: tuple[str, ...] = (),
                 source: str | None = None, path: str | None = None) -> None:
        self.point = point
        self.name = name
        self.known = known
        super().__init__(message, source=source, path=path)

    def located(self, *, source: str | None = None, path: str | None = None) -> PluginError:
        """The same error said of ``source`` (a file) at key ``path`` (each kept when not given)."""
        return PluginError(self.message, point=self.point, name=self.name, known=self.known,
                           source=source or self.source, path=path or self.path)


class ProcessError(InferlbError):
    """A BPMN process cannot be used."""


class ProcessValidationError(ProcessError):
    """Problems found while validating a process; ``problems`` lists ``(element_id, message)``."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = "; ".join(f"{eid}: {msg}" for eid, msg in problems)
        super().__init__(f"{source}: {lines}")


class WorkflowRuntimeError(ProcessError):
    """A task of a running instance raised; ``task_id`` is the BPMN element id."""

    def __init__(self, task_id: str, message: str) -> None:
        self.task_id = task_id
        super().__init__(f"task {task_id}: {message}")


class ClientError(InferlbError):
    """The client's request is wrong. Rendered as the OpenAI error envelope with ``status``."""

    status: int = 400
    type: str = "invalid_request_error"
    headers: dict[str, str] | None = None     # extra response headers (e.g. Retry-After)

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        self.message = message
        self.param = param
        self.code = code
        super().__init__(message)

    def envelope(self) -> dict[str, Any]:
        """The OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""
        return error_body(self.message, self.type, self.code, self.param)


class InvalidRequest(ClientError):
    """400: the body or a field is invalid."""


class ModelNotFound(ClientError):
    """404: the model is not served by this gateway."""

    status = 404

    def __init__(self, model: str) -> None:
        super().__init__(f"The model '{model}' does not exist", param="model", code="model_not_found")


class PayloadTooLarge(ClientError):
    """413: the body is over the configured size cap."""

    status = 413


class Unauthorized(ClientError):
    """401: no key, or not a valid one. One message for every invalid key, so the answer never
    tells whether a key exists, was revoked or expired."""

    status = 401

    def __init__(self, message: str = "Incorrect API key provided", *, code: str = "invalid_api_key") -> None:
        super().__init__(message, code=code)


class Forbidden(ClientError):
    """403: a valid key that may not do this (a tenant key on an admin route)."""

    status = 403

    def __init__(self, message: str, *, code: str = "permission_denied") -> None:
        super().__init__(message, code=code)


class RateLimited(ClientError):
    """429 raised before a request's process starts; carries ``Retry-After`` (whole seconds)."""

    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: float, code: str = "rate_limit_exceeded") -> None:
        super().__init__(message, code=code)
        self.headers = {"retry-after": str(max(1, math.ceil(retry_after_s)))}


class AuditUnavailable(ClientError):
    """503 raised before a request's process starts: its audit record could not be kept (the
    audit journal is past its high-water mark or cannot be written), so it is not served."""

    status = 503
    type = "server_error"

    def __init__(self, message: str, *, retry_after_s: float = 5.0) -> None:
        super().__init__(message, code="audit_unavailable")
        self.headers = {"retry-after": str(max(1, math.ceil(retry_after_s)))}


class NotFound(ClientError):
    """404: an admin route's object does not exist (an unknown node)."""

    status = 404

    def __init__(self, message: str, *, param: str | None = None, code: str = "not_found") -> None:
        super().__init__(message, param=param, code=code)


class Conflict(ClientError):
    """409: the change conflicts with the current state (a node not drained, the last node of a model)."""

    status = 409

    def __init__(self, message: str, *, param: str | None = None, code: str = "conflict") -> None:
        super().__init__(message, param=param, code=code)


class Unavailable(ClientError):
    """503: a live change needs a part that is away (the database holding the node overrides)."""

    status = 503
    type = "server_error"

    def __init__(self, message: str, *, code: str = "unavailable", retry_after_s: float = 1.0) -> None:
        super().__init__(message, code=code)
        self.headers = {"retry-after": str(max(1, math.ceil(retry_after_s)))}


class UpstreamError(InferlbError):
    """One attempt against one node failed. ``retryable`` says whether another node may be tried."""

    retryable: bool = True
    error_class: str = "upstream_error"

    def __init__(self, message: str, *, node: str | None = None) -> None:
        self.node = node
        super().__init__(message)

    def retryable_under(self, retry_on_status: Collection[int]) -> bool:
        """Whether another node may be tried under the fleet's ``retry.retry_on_status``; only a
        status error depends on it."""
        return self.retryable


class UpstreamConnectError(UpstreamError):
    """Connection refused, reset or DNS failure before any response."""

    error_class = "connect_error"


class UpstreamTimeout(UpstreamError):
    """A timeout fired; ``phase`` is ``connect``, ``first_token``, ``idle`` or ``total``."""

    error_class = "timeout"

    def __init__(self, message: str, *, phase: str, node: str | None = None) -> None:
        self.phase = phase
        super().__init__(message, node=node)


class UpstreamStatusError(UpstreamError):
    """The node answered ``status``. ``retryable`` uses the default statuses
    (:data:`DEFAULT_RETRY_ON_STATUS`); the gateway asks :meth:`retryable_under` with the fleet's
    ``retry.retry_on_status``."""

    error_class = "upstream_status"

    def __init__(
        self,
        status: int,
        body: bytes = b"",
        *,
        retry_after_s: float | None = None,
        node: str | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.retry_after_s = retry_after_s
        self.retryable = status in DEFAULT_RETRY_ON_STATUS
        super().__init__(f"upstream answered HTTP {status}", node=node)

    def retryable_under(self, retry_on_status: Collection[int]) -> bool:
        return self.status in retry_on_status


class UpstreamProtocolError(UpstreamError):
    """The node sent something that is not a valid response."""

    error_class = "protocol_error"


class StoreError(InferlbError):
    """The audit database failed; the writer keeps the batch and retries or spools it."""
