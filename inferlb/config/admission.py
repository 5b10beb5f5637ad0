"""Admission configuration: the policy (fleet file, ``admission:``) and the secrets (environment).

Contract:

* :class:`AdmissionPolicy` is the ``admission:`` section of the fleet file. It is validated at
  start-up like the rest of the file: unknown keys are rejected, class names are unique, the
  default class and the unauthenticated ceiling name configured classes.
* :class:`AdmissionSettings` comes from ``INFERLB_AUTH``, ``INFERLB_ADMIN_KEY``,
  ``INFERLB_REDIS_URL`` and ``INFERLB_REDIS_PREFIX``: values that differ per deployment or are
  secret, so they never live in a file.
* Priority classes are listed highest first; a class's *rank* is its index (0 = most important).
  Lower ranks are served first from the queue, shed last, and keep their retries under saturation.

Nothing here imports the rest of the engine (``settings`` imports this module).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "DEFAULT_CLASSES",
    "AdmissionPolicy",
    "AdmissionSettings",
    "PriorityClass",
    "QueueConfig",
    "RetryBudgetConfig",
    "SaturationConfig",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PriorityClass(_Strict):
    """One priority class. ``deadline_s``: the deadline a request of this class gets when the client
    sends none. ``max_queue_wait_s``: how long it may wait in the gateway queue (0: never queued,
    rejected at once when its pool is saturated). ``retry_under_saturation``: whether its failed
    attempts may be retried while the pool is saturated (the lowest classes give theirs up)."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")
    deadline_s: float | None = Field(None, gt=0)
    max_queue_wait_s: float = Field(2.0, ge=0)
    retry_under_saturation: bool = True


DEFAULT_CLASSES: tuple[PriorityClass, ...] = (
    PriorityClass(name="critical", deadline_s=30.0, max_queue_wait_s=5.0),
    PriorityClass(name="interactive", deadline_s=60.0, max_queue_wait_s=2.0),
    PriorityClass(name="standard", deadline_s=120.0, max_queue_wait_s=2.0),
    PriorityClass(name="batch", deadline_s=600.0, max_queue_wait_s=1.0, retry_under_saturation=False),
)


class QueueConfig(_Strict):
    """The bounded gateway queue, one per model pool.

    Its bound follows the pool: ``size_factor`` × the pool's concurrency limit (at least
    ``min_size``, at most ``max_size``). Once the pool's mean service time is known, a request
    queues only when its expected wait (see the controller) fits ``wait_factor`` × that time, so
    what queueing adds stays near the unloaded latency (B6: accepted p99 ≤ 2× unloaded p99) and
    the size bound is a backstop: it binds before the first service time is measured or under a
    sudden burst, and evicting queued requests (a slow rejection) stays rare."""

    size_factor: float = Field(4.0, ge=0)
    min_size: int = Field(4, ge=0)
    max_size: int = Field(1024, ge=0)
    wait_factor: float = Field(1.0, gt=0)          # a wait ≤ this × the pool's mean service time
    # Queue only when the expected wait is ≤ this share of the allowed wait: the margin absorbs
    # bursts of higher classes, so a queued request is rarely shed later (a slow rejection).
    admit_margin: float = Field(0.5, gt=0, le=1)
    tick_s: float = Field(0.02, gt=0)              # expiry / re-check period while something waits


class SaturationConfig(_Strict):
    """When a model pool counts as saturated, from node snapshots.

    A pool admits at most ``concurrency_headroom`` × Σ ``max_concurrency`` of its healthy nodes at
    once. It is also saturated while every healthy node of it is *hot*: at ``max_concurrency``
    requests in flight, over its token capacity, with more than ``max_waiting`` requests waiting
    (scraped metrics) or KV-cache use at or above ``max_kv_usage``."""

    concurrency_headroom: float = Field(1.0, gt=0, le=4)
    max_waiting: int | None = Field(None, ge=0)
    max_kv_usage: float | None = Field(0.98, gt=0, le=1)


class RetryBudgetConfig(_Strict):
    """Retries per model pool ≤ ``ratio`` × requests over the last ``window_s`` seconds, or
    ``min_retries`` in that window when that is more (isolated failures at low traffic still get
    their retry). SRE's 10 % per-client ratio; Envoy's ``min_retry_concurrency`` plays the floor."""

    ratio: float = Field(0.1, ge=0, le=1)
    min_retries: int = Field(10, ge=0)
    window_s: float = Field(10.0, gt=0)


class AdmissionPolicy(_Strict):
    """The fleet file's ``admission:`` section. ``enabled: false`` turns admission control off
    (no queue, no shedding, no tenant limits, no retry budget; only ``INFERLB_MAX_INFLIGHT``)."""

    enabled: bool = True
    auth: bool = False                              # require tenant keys (or INFERLB_AUTH=on)
    classes: list[PriorityClass] = Field(default_factory=lambda: list(DEFAULT_CLASSES))
    default_class: str = "standard"
    unauthenticated_ceiling: str | None = None      # highest class a request without a key may ask for
    queue: QueueConfig = QueueConfig()
    saturation: SaturationConfig = SaturationConfig()
    retry_budget: RetryBudgetConfig = RetryBudgetConfig()
    auth_failures_per_minute: int = Field(60, ge=1)  # per client address; then 429 (OWASP API2)
    # Token buckets hold this many seconds of a key's rate: 60 lets a whole minute's quota go at
    # once (the usual RPM semantics); less smooths a tenant's bursts so it cannot crowd out others.
    limit_burst_s: float = Field(60.0, gt=0, le=3600)
    keys_refresh_s: float = Field(5.0, gt=0)        # key cache reload (revocations by another process)
    # The database away: keys are served from the cache this long after its last load, then
    # authenticated requests get 503 keys_unavailable (a revoked key must not live for ever).
    keys_max_stale_s: float = Field(300.0, gt=0)
    # A key the cache does not know is looked up in the database before the 401 (one created a
    # moment ago on another replica), at most this many lookups a second for the whole gateway
    # (random keys cannot hammer the database); an unknown digest is not looked up again for
    # keys_miss_ttl_s (a secret cannot exist before it is created, so waiting hides nothing);
    # 0 look-ups a second: the cache alone answers (new keys arrive with the reload).
    keys_miss_checks_per_s: float = Field(10.0, ge=0)
    keys_miss_ttl_s: float = Field(60.0, gt=0)
    redis_sync_s: float = Field(0.05, gt=0)         # limit-bucket exchange with Redis

    @model_validator(mode="after")
    def _names(self) -> AdmissionPolicy:
        names = [c.name for c in self.classes]
        if not names:
            raise ValueError("admission.classes needs at least one class")
        if len(set(names)) != len(names):
            raise ValueError("admission.classes: class names must be unique")
        for what, value in (("default_class", self.default_class),
                            ("unauthenticated_ceiling", self.unauthenticated_ceiling)):
            if value is not None and value not in names:
                raise ValueError(f"admission.{what} {value!r} is not a configured class ({', '.join(names)})")
        return self

    def rank(self, name: str | None) -> int | None:
        """The rank of class ``name`` (0 = highest), or None when it is not a configured class."""
        for i, c in enumerate(self.classes):
            if c.name == name:
                return i
        return None

    def cls(self, name: str | None) -> PriorityClass:
        """Class ``name``, or the default class when ``name`` is unknown."""
        r = self.rank(name)
        return self.classes[r if r is not None else self.rank(self.default_class) or 0]


class AdmissionSettings(BaseSettings):
    """Deployment values from the environment: ``INFERLB_AUTH`` (on/off), ``INFERLB_ADMIN_KEY``
    (guards the admin API), ``INFERLB_REDIS_URL`` (shared limits across gateway replicas) and
    ``INFERLB_REDIS_PREFIX`` (namespace of every Redis key inferlb writes)."""

    model_config = SettingsConfigDict(env_prefix="INFERLB_", extra="ignore")

    auth: bool = False
    admin_key: SecretStr | None = None
    redis_url: str | None = None
    redis_prefix: str = "inferlb:"
    limits: Literal["auto", "memory", "redis"] = "auto"   # auto: redis when a URL is set
