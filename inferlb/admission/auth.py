"""Tenant keys and identity, without the web framework: the core the FastAPI guards of
``api/auth.py`` call.

Contract:

* :func:`bearer_token` takes the token out of an ``Authorization`` header value.
* :func:`matches` compares a token with a configured secret in constant time (SHA-256 of both,
  then :func:`hmac.compare_digest`), so its timing says nothing about the secret.
* :func:`refusal` is what every failed authentication answers: a 401 in the OpenAI envelope, the
  same whatever was wrong; failures are limited per client address (``auth_failures_per_minute``,
  then 429 with ``Retry-After``) so keys cannot be guessed at line rate.
* :func:`identify` turns the headers' values and the key into the request's tenant, priority class
  and deadline: the tenant is the key's (the ``x-inferlb-tenant`` header is only a label when auth
  is off); the class is the ``x-inferlb-priority`` header or the default class, capped at the key's
  ceiling (or ``unauthenticated_ceiling``); an unknown class name is a 400; without a client
  deadline the class's default deadline applies.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from pydantic import SecretStr

from inferlb.admission.controller import AdmissionController
from inferlb.admission.keys import ApiKey
from inferlb.config.admission import AdmissionPolicy
from inferlb.errors import InvalidRequest, ModelNotFound, RateLimited, Unauthorized

__all__ = ["Identity", "bearer_token", "identify", "matches", "refusal"]


def bearer_token(header: str | None) -> str | None:
    """The token of ``Authorization: Bearer <token>``; None when absent or another scheme."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _digest(s: str) -> bytes:
    return hashlib.sha256(s.encode("utf-8", "surrogatepass")).digest()


def matches(token: str, secret: SecretStr | None) -> bool:
    """``token`` is ``secret`` (constant time; False when no secret is configured)."""
    return secret is not None and hmac.compare_digest(_digest(token), _digest(secret.get_secret_value()))


def refusal(ctl: AdmissionController, source: str, message: str | None = None) -> Unauthorized:
    """The 401 for a failed authentication from ``source`` (the peer address); raises
    RateLimited (429) once that address has failed too often."""
    d = ctl.auth_failures.check_and_take(source, rpm=ctl.policy.auth_failures_per_minute, tpm=None, tokens=0,
                                         now=ctl.clock.time())
    if not d.ok:
        raise RateLimited("Too many failed authentication attempts from this address",
                          retry_after_s=d.retry_after_s)
    return Unauthorized(message) if message else Unauthorized()


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


def identify(policy: AdmissionPolicy, key: ApiKey | None, tenant: str | None, priority: str | None,
             deadline_s: float | None) -> Identity:
    """Resolve the request's identity (see the module docstring)."""
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
