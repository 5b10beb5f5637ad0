"""The FastAPI guards: tenant keys on the OpenAI routes, the admin key, the metrics reader.

The key checks themselves (constant-time comparison, the per-address failure limit, identity
resolution) are :mod:`inferlb.admission.auth`; these guards read the request and the
app-wide objects through :mod:`.deps`.

Contract:

* :func:`authenticate` (on the OpenAI routes) does nothing while auth is off. With auth on it reads
  ``Authorization: Bearer <key>``, looks the key up in constant time (:meth:`KeyCache.lookup`;
  a key the cache does not know is looked up in the database first, bounded:
  :meth:`AdmissionController.find_key`) and stores the :class:`ApiKey` on ``request.state.api_key``;
  a missing or invalid key is a 401 in the OpenAI envelope, the same one whatever was wrong with
  it (limited per client address, then 429).
  Nothing of a 401 is audited: an unauthenticated caller must not be able to fill the audit trail.
  While the key cache is expired (the database away past ``admission.keys_max_stale_s``) the
  answer is 503 ``keys_unavailable`` instead.
* :func:`require_admin` guards the admin plane (every ``/admin``, ``/audit``, ``/reports`` route and
  the dashboard's data routes), whatever ``INFERLB_AUTH`` says. With an admin key configured
  (``INFERLB_ADMIN_KEY``) it is required on both listeners: the key (compared in constant time)
  passes, a valid tenant key gets 403, anything else 401 (limited per address like every failure).
  With none configured the admin listener (:mod:`inferlb.server.listeners`, loopback only) serves
  the routes to anyone who reaches it, and the public listener answers them 404 exactly as it
  answers an unknown path, so the admin plane cannot be told from nothing there.
* :func:`require_docs_reader` guards ``/docs`` and ``/openapi.json``: open while tenant auth is
  off or ``INFERLB_PUBLIC_DOCS`` is set; otherwise :func:`require_admin`'s rule.
* :func:`require_metrics_reader` guards ``/metrics`` (its labels name tenants): open while auth
  is off and no metrics token is set; otherwise the admin key or the metrics token
  (``INFERLB_METRICS_TOKEN``, for a Prometheus scrape job that should not hold the admin key)
  passes, a tenant key gets 403, anything else 401 (limited per address like every failure).
* :func:`identity` is the request's :class:`~inferlb.admission.auth.Identity` from its
  headers' values and the key :func:`authenticate` stored.
"""

from __future__ import annotations

from fastapi import Request
from pydantic import SecretStr

from inferlb.admission.auth import Identity, bearer_token, identify, matches, refusal
from inferlb.admission.controller import AdmissionController
from inferlb.admission.keys import ApiKey
from inferlb.api.deps import AdmissionDep, SettingsDep
from inferlb.errors import Forbidden, NotFound, Unauthorized, Unavailable
from inferlb.server.listeners import ADMIN, listener_of

__all__ = ["authenticate", "identity", "require_admin", "require_docs_reader", "require_metrics_reader"]


def _refuse(request: Request, ctl: AdmissionController, message: str | None = None) -> Unauthorized:
    # The peer address; X-Forwarded-For is not trusted (it would let a caller pick its bucket).
    return refusal(ctl, request.client.host if request.client is not None else "?", message)


async def authenticate(request: Request, ctl: AdmissionDep) -> None:
    """Dependency of the OpenAI routes; see the module docstring."""
    request.state.api_key = None
    if not ctl.auth_on:
        return
    token = bearer_token(request.headers.get("authorization"))
    if token is None:
        raise _refuse(request, ctl, "You didn't provide an API key: send it as 'Authorization: Bearer sk-gw-…'")
    key = await ctl.find_key(token)
    if key is None:
        if ctl.keys.expired is not None:   # not the caller's fault: the keys cannot be checked now
            raise Unavailable(f"API keys cannot be checked right now ({ctl.keys.expired}); retry later",
                              code="keys_unavailable", retry_after_s=5.0)
        raise _refuse(request, ctl)
    request.state.api_key = key


async def require_admin(request: Request, ctl: AdmissionDep) -> None:
    """Dependency of the admin plane; see the module docstring."""
    admin = ctl.env.admin_key
    if admin is None:
        if listener_of(request.scope) == ADMIN:
            return
        # The same 404 as an unknown path (app.py's handler of starlette's HTTPException).
        raise NotFound("Not Found")
    token = bearer_token(request.headers.get("authorization"))
    if token is not None and matches(token, admin):
        return
    if token is not None and ctl.keys.lookup(token, ctl.clock.time()) is not None:
        raise Forbidden("Tenant API keys cannot use the admin API")
    raise _refuse(request, ctl, "An admin key is required: 'Authorization: Bearer <INFERLB_ADMIN_KEY>'")


async def require_docs_reader(request: Request, ctl: AdmissionDep, settings: SettingsDep) -> None:
    """Dependency of ``/docs`` and ``/openapi.json``; see the module docstring."""
    if ctl.auth_on and not settings.public_docs:
        await require_admin(request, ctl)


async def require_metrics_reader(request: Request, ctl: AdmissionDep, settings: SettingsDep) -> None:
    """Dependency of ``/metrics``; see the module docstring."""
    scrape: SecretStr | None = settings.metrics_token
    if not ctl.auth_on and scrape is None:
        return
    token = bearer_token(request.headers.get("authorization"))
    admin = ctl.env.admin_key
    if token is not None:
        if matches(token, scrape) or matches(token, admin):
            return
        if ctl.keys.lookup(token, ctl.clock.time()) is not None:
            raise Forbidden("Tenant API keys cannot read /metrics: use the admin key or INFERLB_METRICS_TOKEN")
    if admin is None and scrape is None:
        raise Forbidden("Metrics are protected while auth is on: set INFERLB_METRICS_TOKEN or INFERLB_ADMIN_KEY",
                        code="metrics_token_unset")
    raise _refuse(request, ctl, "A metrics token or the admin key is required: "
                                "'Authorization: Bearer <INFERLB_METRICS_TOKEN>'")


def identity(request: Request, ctl: AdmissionController, tenant: str | None, priority: str | None,
             deadline_s: float | None) -> Identity:
    """The request's identity: the key :func:`authenticate` stored, and the headers' values."""
    key: ApiKey | None = getattr(request.state, "api_key", None)
    return identify(ctl.policy, key, tenant, priority, deadline_s)
