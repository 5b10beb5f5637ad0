"""Who is asking: the tenant-key dependency, the admin-key guard, and priority/deadline resolution.

Contract:

* :func:`authenticate` (a FastAPI dependency on the OpenAI routes) does nothing while auth is off.
  With auth on it reads ``Authorization: Bearer <key>``, looks the key up in constant time
  (:meth:`KeyCache.lookup`) and stores the :class:`ApiKey` on ``request.state.api_key``; a missing
  or invalid key is a 401 in the OpenAI envelope, the same one whatever was wrong with it. Failed
  attempts are limited per client address (``auth_failures_per_minute``, then 429 with
  ``Retry-After``) so keys cannot be guessed at line rate. Nothing of a 401 is audited: an
  unauthenticated caller must not be able to fill the audit trail.
* :func:`require_admin` guards the admin API: the admin key (``INFERLB_ADMIN_KEY``, compared in
  constant time) passes; a valid tenant key gets 403; anything else 401; with no admin key
  configured every call gets 403. :func:`require_admin_when_auth` applies it only while tenant
  auth is on (the other admin and audit routes stay open in the auth-off demo); the dashboard's
  data route (``/dashboard/node-states``) is guarded by it too.
* :func:`require_metrics_reader` guards ``/metrics`` (its labels name tenants): open while auth
  is off and no metrics token is set; otherwise the admin key or the metrics token
  (``INFERLB_METRICS_TOKEN``, for a Prometheus scrape job that should not hold the admin key)
  passes, a tenant key gets 403, anything else 401 (limited per address like every failure).
* :func:`identify` turns headers and the key into the request's tenant, priority class and
  deadline: the tenant is the key's (the ``x-inferlb-tenant`` header is only a label when auth is
  off); the class is the ``x-inferlb-priority`` header or the default class, capped at the key's
  ceiling (or ``unauthenticated_ceiling``); an unknown class name is a 400; without a client
  deadline the class's default deadline applies.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from fastapi import Request
from pydantic import SecretStr

from ..errors import Forbidden, InvalidRequest, ModelNotFound, RateLimited, Unauthorized
from .controller import AdmissionController
from .keys import ApiKey

__all__ = ["Identity", "authenticate", "bearer_token", "controller_of", "identify", "require_admin",
           "require_admin_when_auth", "require_metrics_reader"]


def controller_of(request: Request) -> AdmissionController:
    ctl: AdmissionController = request.app.state.admission
    return ctl


def bearer_token(request: Request) -> str | None:
    raw = request.headers.get("authorization")
    if not raw:
        return None
    scheme, _, token = raw.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _source(request: Request) -> str:
    # The peer address; X-Forwarded-For is not trusted (it would let a caller pick its bucket).
    return request.client.host if request.client is not None else "?"


def _refuse(request: Request, ctl: AdmissionController, message: str | None = None) -> Unauthorized:
    d = ctl.auth_failures.check_and_take(_source(request), rpm=ctl.policy.auth_failures_per_minute, tpm=None, tokens=0,
                           now=ctl.clock.time())
    if not d.ok:
        raise RateLimited("Too many failed authentication attempts from this address",
                          retry_after_s=d.retry_after_s)
    return Unauthorized(message) if message else Unauthorized()


async def authenticate(request: Request) -> None:
    """Dependency of the OpenAI routes; see the module docstring."""
    ctl = controller_of(request)
    request.state.api_key = None
    if not ctl.auth_on:
        return
    token = bearer_token(request)
    if token is None:
        raise _refuse(request, ctl, "You didn't provide an API key: send it as 'Authorization: Bearer sk-gw-…'")
    key = ctl.keys.lookup(token, ctl.clock.time())
    if key is None:
        raise _refuse(request, ctl)
    request.state.api_key = key


def _digest(s: str) -> bytes:
    return hashlib.sha256(s.encode("utf-8", "surrogatepass")).digest()


async def require_admin(request: Request) -> None:
    """Dependency of the admin API; see the module docstring."""
    ctl = controller_of(request)
    admin = ctl.env.admin_key
    token = bearer_token(request)
    if admin is None:
        raise Forbidden("The admin API is disabled: set INFERLB_ADMIN_KEY", code="admin_disabled")
    if token is not None and _matches(token, admin):
        return
    if token is not None and ctl.keys.lookup(token, ctl.clock.time()) is not None:
        raise Forbidden("Tenant API keys cannot use the admin API")
    raise _refuse(request, ctl, "An admin key is required: 'Authorization: Bearer <INFERLB_ADMIN_KEY>'")


async def require_admin_when_auth(request: Request) -> None:
    """:func:`require_admin`, but only while tenant authentication is on."""
    if controller_of(request).auth_on:
        await require_admin(request)


def _matches(token: str, secret: SecretStr | None) -> bool:
    return secret is not None and hmac.compare_digest(_digest(token), _digest(secret.get_secret_value()))


async def require_metrics_reader(request: Request) -> None:
    """Dependency of ``/metrics``; see the module docstring."""
    ctl = controller_of(request)
    settings = getattr(request.app.state, "settings", None)
    scrape: SecretStr | None = getattr(settings, "metrics_token", None)
    if not ctl.auth_on and scrape is None:
        return
    token = bearer_token(request)
    admin = ctl.env.admin_key
    if token is not None:
        if _matches(token, scrape) or _matches(token, admin):
            return
        if ctl.keys.lookup(token, ctl.clock.time()) is not None:
            raise Forbidden("Tenant API keys cannot read /metrics: use the admin key or INFERLB_METRICS_TOKEN")
    if admin is None and scrape is None:
        raise Forbidden("Metrics are protected while auth is on: set INFERLB_METRICS_TOKEN or INFERLB_ADMIN_KEY",
                        code="metrics_token_unset")
    raise _refuse(request, ctl, "A metrics token or the admin key is required: "
                                "'Authorization: Bearer <INFERLB_METRICS_TOKEN>'")


@dataclass(frozen=True)
class Identity:
    """The request's tenant, priority class, deadline and key."""

    tenant: str | None
    priority: str
    deadline_s: float | None
    key: ApiKey | None = None

    @property
    def key_id(self) -> str | None:
        return self.key.id if self.key is not None else None

    def check_model(self, model: str) -> None:
        """404 for a model the key may not use: the same answer as for a model that does not exist."""
        if self.key is not None and not self.key.allows_model(model):
            raise ModelNotFound(model)


def identify(request: Request, tenant: str | None, priority: str | None, deadline_s: float | None) -> Identity:
    """Resolve the request's identity (see the module docstring)."""
    ctl = controller_of(request)
    policy = ctl.policy
    key: ApiKey | None = getattr(request.state, "api_key", None)
    if priority is not None and policy.rank(priority) is None:
        names = ", ".join(c.name for c in policy.classes)
        raise InvalidRequest(f"x-inferlb-priority: unknown priority class {priority!r} (classes: {names})",
                             param="x-inferlb-priority", code="invalid_priority")
    wanted = priority or policy.default_class
    ceiling = key.priority_ceiling if key is not None else policy.unauthenticated_ceiling
    rank = policy.rank(wanted) or 0
    if ceiling is not None:
        cap = policy.rank(ceiling)
        rank = max(rank, cap if cap is not None else len(policy.classes) - 1)  # unknown ceiling: lowest
    cls = policy.classes[rank]
    if deadline_s is None:
        deadline_s = cls.deadline_s
    return Identity(tenant=key.tenant if key is not None else tenant, priority=cls.name, deadline_s=deadline_s,
                    key=key)

