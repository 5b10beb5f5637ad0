"""Typed settings: ``INFERLB_*`` environment variables plus the fleet config file (YAML).

Contract: :func:`load_settings` returns a fully validated :class:`Settings` or raises
:class:`~inferlb.errors.ConfigError` whose message names the file, the key path
(``nodes[1].capacity_tokens``) and what is wrong; a name that no extension point knows (a routing
plugin, an actuator kind, a forecaster, a metrics format: :mod:`inferlb.plugins`) is its subclass
:class:`~inferlb.errors.PluginError`, located the same way. Nothing here is created at import time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from inferlb.config.admission import AdmissionPolicy, AdmissionSettings
from inferlb.config.autoscale import AutoscaleConfig
from inferlb.config.cluster import ClusterSettings
from inferlb.config.disaggregation import DisaggregationConfig, NodeRole, disaggregation_problems
from inferlb.config.discovery import DiscoveryConfig
from inferlb.config.health import HealthConfig
from inferlb.config.kvevents import KVEventsModel, KVEventsNode, KVIndexConfig
from inferlb.config.lora import LoraConfig, default_profile, lora_problems
from inferlb.config.netpolicy import Listener, NetworkPolicy, redact_url, url_problem
from inferlb.config.observability import ObservabilityConfig
from inferlb.config.rollout import RolloutConfig
from inferlb.config.tiers import TierPolicy, tier_problems
from inferlb.config.tls import ListenerTLS, NodeTLS
from inferlb.config.versions import VersionConfig, version_nodes, version_problems
from inferlb.errors import DEFAULT_RETRY_ON_STATUS, ConfigError, PluginError
from inferlb.routing.gate import EvaluationRequirement
from inferlb.routing.selector import NodeSelector, all_of, label_number

if TYPE_CHECKING:
    from inferlb.routing.profiles import Router

__all__ = [
    "FleetConfig",
    "ModelConfig",
    "NodeConfig",
    "RetryPolicy",
    "RoutingConfig",
    "SLOConfig",
    "Settings",
    "TimeoutConfig",
    "check_routing",
    "check_url",
    "fleet_from_mapping",
    "load_fleet_file",
    "load_settings",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _KeyPathError(ValueError):
    """A cross-field problem that knows its key path (``nodes[3].name``), so the error can name it."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        self.message = message
        super().__init__(message)


def check_url(v: str) -> str:
    """``v`` without a trailing slash if it is an http(s) URL with a host and, when given, a port
    1–65535; ValueError saying what is wrong otherwise."""
    shown = redact_url(v)   # never echo a password or a query token back into a message or a log
    try:
        parts = urlsplit(v)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"{shown!r} is not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{shown!r}: must start with http:// or https://")
    if not parts.hostname:
        raise ValueError(f"{shown!r}: no host")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"{shown!r}: port must be 1–65535")
    if any(c.isspace() for c in v):
        raise ValueError(f"{shown!r}: contains whitespace")
    return v.rstrip("/")


class ModelConfig(_Strict):
    """A model name clients ask for."""

    name: str
    max_context_tokens: int = Field(8192, gt=0)
    max_output_tokens: int = Field(4096, gt=0)
    default_max_tokens: int = Field(256, gt=0)   # output budget assumed when the client sends none
    fallbacks: list[str] = Field(default_factory=list)  # models tried when no node of this one can serve
    # Models a prompt over this one's context goes to, the first that fits (empty: ``fallbacks``).
    context_window_fallbacks: list[str] = Field(default_factory=list)
    version: str | None = None
    kind: Literal["llm", "embedding", "generic"] = "llm"
    upstream_name: str | None = None              # the name nodes know it by, if different
    tokenizer: str | None = None                  # path to a HF tokenizer.json (needs the tokenizers extra)
    # Node labels this model needs (routing/selector.py): {gpu: h100, gpu_memory_gib: ">= 40"}
    node_selector: NodeSelector | None = None
    # Versions with weights and the nodes serving each (versions): sticky A/B and canaries.
    versions: list[VersionConfig] = Field(default_factory=list)
    # Prefill on one node, decode on another (config/disaggregation.py); None: served whole.
    disaggregation: DisaggregationConfig | None = None
    # A model alias: each request goes to one of these models by its difficulty (config/tiers.py).
    tiers: TierPolicy | None = None
    # Served as a LoRA adapter on a base model (config/lora.py); None: not an adapter.
    lora: LoraConfig | None = None
    # Routing reads the engines' KV events for this model (config/kvevents.py); absent: off.
    kv_events: KVEventsModel | None = None


def _label_text(v: Any) -> Any:
    """A label written as a YAML number (``gpu_memory_gib: 80``) is kept as its text."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return f"{v:g}" if isinstance(v, float) else str(v)
    return v


class NodeConfig(_Strict):
    """One model server."""

    name: str
    url: str
    models: list[str]
    kind: Literal["vllm", "tgi", "sglang", "triton", "ollama", "llamacpp", "llamacpp-python", "openai",
                  "sim"] = "openai"
    capacity_tokens: int = Field(32768, gt=0)      # KV-cache / in-flight token budget
    max_concurrency: int = Field(64, gt=0)
    weight: float = Field(1.0, gt=0)
    labels: dict[str, Annotated[str, BeforeValidator(_label_text)]] = Field(default_factory=dict)
    price_per_hour: float = Field(0.0, ge=0)
    # The node's own key (never the client's), sent as a bearer token to it: either literally (fleet
    # file only; masked in every dump and repr) or, as operators add nodes live, ``api_key_env``: the
    # name of an environment variable holding it, read on each replica whenever this config is
    # validated (so at every apply; a replica without it serves the node keyless and says so:
    # live/fleet_admin.py apply_fleet). Neither key value is ever stored or shown.
    api_key: SecretStr | None = None
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256)
    # How an https node is reached: its CA, the gateway's client certificate (mTLS), the name to
    # check (config/tls.py); unset: the fleet's node_tls, else the system CAs.
    tls: NodeTLS | None = None
    # Which leg of a disaggregated request it runs (config/disaggregation.py): prefill, decode, both.
    role: NodeRole = "both"
    # Where its engine publishes KV events (config/kvevents.py); absent: none.
    kv_events: KVEventsNode | None = None
    _env_key: str | None = PrivateAttr(None)

    @model_validator(mode="before")
    @classmethod
    def _kind_defaults(cls, data: Any) -> Any:
        # llama-cpp-python's server decodes one request at a time behind a lock, and by default a
        # request that arrives while another streams cuts that stream short (its
        # interrupt_requests setting): one at a time is its real concurrency, and the gateway,
        # which routes each queued request to the first node that frees, is the better queue.
        if isinstance(data, dict) and data.get("kind") == "llamacpp-python" and "max_concurrency" not in data:
            return {**data, "max_concurrency": 1}
        return data

    @model_validator(mode="after")
    def _resolve_key(self) -> NodeConfig:
        if self.api_key is not None and self.api_key_env is not None:
            raise ValueError("set api_key or api_key_env, not both")
        if self.tls is not None and not self.url.startswith("https://"):
            raise ValueError(f"tls is set but the url {redact_url(self.url)!r} is not https://")
        if self.api_key_env is not None:
            self._env_key = os.environ.get(self.api_key_env) or None
        return self

    def credential(self) -> str | None:
        """The key to send to the node (the literal one, or the variable's value when it is set)."""
        return self.api_key.get_secret_value() if self.api_key is not None else self._env_key

    @property
    def missing_key_env(self) -> str | None:
        """``api_key_env`` when that variable is not set (or empty) on this replica, else None."""
        return self.api_key_env if self.api_key_env is not None and self._env_key is None else None

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_url(v)


class OutputLengthConfig(_Strict):
    """The output-length predictor (inferlb/routing/length.py): the budget routing, node load and
    the learned router's reservation count for a request, learned from finished requests'
    completion tokens. ``enabled: false``: the declared ``max_tokens``, else ``default_max_tokens``,
    as before. The client's ``max_tokens`` (or the default) still bounds timeouts, the context check
    and TPM limits: a prediction never shortens what a client may be sent."""

    enabled: bool = True
    budget: Literal["p50", "mean", "p90"] = "mean"
    min_samples: int = Field(20, ge=1)
    window: int = Field(2000, ge=2)


class RoutingConfig(_Strict):
    """Which routing profile runs, and its plugin parameters (see ``engine.routing.profiles``)."""

    profile: str = "token-aware"
    filters: list[str] | None = None
    scorers: dict[str, float] | None = None        # scorer type name -> weight
    picker: str | None = None
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)
    seed: int | None = None
    # Power-of-k sampling: how many random nodes of a model's pool a decision considers on a larger
    # fleet (0: every node; unset: the profile's default, 16 for all but round-robin).
    sample: int | None = Field(None, ge=0)
    # The latency predictor of a profile that learns (``learned``): routing/lifecycle.py LifecycleParams.
    predictor: dict[str, Any] = Field(default_factory=dict)
    # A live change of the routing policy must first pass an off-policy evaluation on the audit
    # trail (routing/gate.py, learned/policy_gate.py); None: changes apply without one.
    require_evaluation: EvaluationRequirement | None = None
    output_length: OutputLengthConfig = OutputLengthConfig()
    # the learned profile's reward bandit over profiles (routing/reward.py RewardParams; off by default)
    reward: dict[str, Any] = Field(default_factory=dict)

    def build_router(self, **overrides: Any) -> Router:
        """A new router of this config (``engine.routing.build_router`` with every field here);
        ``overrides`` replace or add keyword arguments (a seed, a clock, a lifecycle)."""
        from inferlb.routing.profiles import build_router

        kw: dict[str, Any] = {"filters": self.filters, "scorers": self.scorers, "picker": self.picker,
                              "params": self.params, "seed": self.seed, "sample": self.sample,
                              "predictor": self.predictor, "reward": self.reward or None, **overrides}
        return build_router(self.profile, **kw)


class RetryPolicy(_Strict):
    """Retry defaults; the BPMN process may override ``max_attempts`` with a task parameter.

    ``retry_on_status``: the upstream HTTP statuses after which the gateway tries another node
    (the dispatch outcome is ``retryable``); any other non-2xx status is ``fatal``.
    """

    max_attempts: int = Field(3, ge=1, le=10)
    base_backoff_s: float = Field(0.025, ge=0)     # Envoy's 25 ms
    max_backoff_s: float = Field(0.25, ge=0)       # Envoy's 10 × base
    retry_on_status: frozenset[int] = frozenset(DEFAULT_RETRY_ON_STATUS)

    @field_validator("retry_on_status")
    @classmethod
    def _statuses(cls, v: frozenset[int]) -> frozenset[int]:
        bad = sorted(s for s in v if not 400 <= s <= 599)
        if bad:
            raise ValueError(f"not an HTTP error status (400–599): {', '.join(map(str, bad))}")
        return v


class TimeoutConfig(_Strict):
    connect_s: float = Field(5.0, gt=0)
    first_token_s: float = Field(60.0, gt=0)
    idle_s: float = Field(30.0, gt=0)
    total_s: float = Field(600.0, gt=0)
    # A non-streamed answer arrives only when generation ends, so its wait for the first byte is
    # first_token_s + max_tokens × per_output_token_s (0.1 s = a slow 10 tokens/s), capped by total_s.
    per_output_token_s: float = Field(0.1, ge=0)
    # The least first-byte wait a node's own history can tighten the wait to (engine/first_byte.py):
    # raise it where a pause of the gateway's own host must not read as a hung node.
    first_byte_floor_s: float = Field(1.0, gt=0)


class SLOConfig(_Strict):
    """Per-model (or ``*``) latency objectives used by the SLA report."""

    model: str = "*"
    e2e_p95_s: float | None = Field(None, gt=0)
    ttft_p95_s: float | None = Field(None, gt=0)
    e2e_max_s: float | None = Field(None, gt=0)      # a request counts as "in SLO" when e2e ≤ this
    ttft_max_s: float | None = Field(None, gt=0)


class FleetConfig(_Strict):
    """The fleet file: models, nodes, routing, retries, timeouts, SLOs."""

    models: list[ModelConfig]
    nodes: list[NodeConfig]
    routing: RoutingConfig = RoutingConfig()
    retry: RetryPolicy = RetryPolicy()
    timeouts: TimeoutConfig = TimeoutConfig()
    slos: list[SLOConfig] = Field(default_factory=list)
    observability: ObservabilityConfig = ObservabilityConfig()   # metrics labels, tracing, prices
    health: HealthConfig = HealthConfig()   # probes, scrapes, outlier ejection, slow start (health)
    admission: AdmissionPolicy = AdmissionPolicy()   # classes, queue, shedding, retry budget (admission)
    autoscale: AutoscaleConfig | None = None   # forecast → plan → actuate (autoscale); absent: off
    discovery: list[DiscoveryConfig] = Field(default_factory=list)   # nodes from Kubernetes (discovery)
    rollouts: RolloutConfig = RolloutConfig()   # canary rollouts: process, interval, default criteria (rollout)
    network_policy: NetworkPolicy = NetworkPolicy()   # where node URLs may point (config/netpolicy.py)
    # The tls block of every https node that has none of its own (config/tls.py).
    node_tls: NodeTLS | None = None
    kv_index: KVIndexConfig = KVIndexConfig()   # the KV-event-fed index's bounds (config/kvevents.py)
    # The gateway's own listeners, from the validation context (fleet_from_mapping's ``listeners``):
    # a node there would be the gateway itself.
    _listeners: tuple[Listener, ...] = PrivateAttr(())

    @model_validator(mode="before")
    @classmethod
    def _default_tls(cls, raw: Any) -> Any:
        """``node_tls`` given to each https node without a ``tls`` block of its own (a node
        opts out with ``tls: {}``: the system CAs)."""
        if not isinstance(raw, dict) or raw.get("node_tls") is None or not isinstance(raw.get("nodes"), list):
            return raw
        default = raw["node_tls"]
        nodes: list[Any] = []
        for n in raw["nodes"]:
            if isinstance(n, NodeConfig):
                if n.tls is None and n.url.startswith("https://"):
                    n = n.model_copy(update={"tls": NodeTLS.model_validate(default)})
            elif isinstance(n, dict) and n.get("tls") is None and str(n.get("url", "")).startswith("https://"):
                n = {**n, "tls": default}
            nodes.append(n)
        return {**raw, "nodes": nodes}

    @property
    def listeners(self) -> tuple[Listener, ...]:
        """The gateway listeners this fleet was checked against (none: not bound to a server)."""
        return self._listeners

    def url_problem(self, url: str) -> str | None:
        """Why this fleet's network policy refuses a node at ``url`` (config/netpolicy.py), or None."""
        return url_problem(url, self.network_policy, self._listeners)

    @model_validator(mode="before")
    @classmethod
    def _lora_profile(cls, raw: Any) -> Any:
        """A fleet with a LoRA model routes with ``lora-affinity`` unless told otherwise (config/lora.py)."""
        return default_profile(raw) if isinstance(raw, dict) else raw

    @model_validator(mode="after")
    def _policy(self, info: ValidationInfo) -> FleetConfig:
        listeners = (info.context or {}).get("listeners", ())
        self._listeners = tuple(Listener(h, int(p)) for h, p in listeners)
        for i, n in enumerate(self.nodes):
            why = self.url_problem(n.url)
            if why is not None:
                raise _KeyPathError(f"nodes[{i}].url", f"{redact_url(n.url)!r} refused by the network policy: {why}")
        for name, h in self.health.nodes.items():   # the prober fetches these too
            for key in ("metrics_url", "agent_url", "dcgm_url"):
                url = getattr(h, key)
                why = self.url_problem(url) if url is not None else None
                if why is not None:
                    raise _KeyPathError(f"health.nodes.{name}.{key}",
                                        f"{redact_url(url)!r} refused by the network policy: {why}")
        return self

    @model_validator(mode="after")
    def _kv_events(self) -> FleetConfig:
        for i, mc in enumerate(self.models):
            if mc.kv_events is not None and mc.kv_events.tokenizer == "model" and not mc.tokenizer:
                raise _KeyPathError(f"models[{i}].kv_events.tokenizer",
                                    f"model {mc.name!r}: tokenizer 'model' needs the model's tokenizer "
                                    "(a tokenizer.json path); 'emulator' for emulated nodes")
        return self

    @model_validator(mode="after")
    def _cross(self) -> FleetConfig:
        _unique("models", [m.name for m in self.models], "model")
        _unique("nodes", [n.name for n in self.nodes], "node")
        known = {m.name for m in self.models}
        for i, n in enumerate(self.nodes):
            for j, served in enumerate(n.models):
                if served not in known:
                    raise _KeyPathError(f"nodes[{i}].models[{j}]", f"unknown model {served!r}")
        for i, mc in enumerate(self.models):
            for key, names in (("fallbacks", mc.fallbacks), ("context_window_fallbacks", mc.context_window_fallbacks)):
                for j, f in enumerate(names):
                    if f not in known:
                        raise _KeyPathError(f"models[{i}].{key}[{j}]",
                                            f"model {mc.name!r} falls back to unknown model {f!r}")
        for i, pool in enumerate(self.autoscale.pools if self.autoscale is not None else ()):
            if pool.model not in known:
                raise _KeyPathError(f"autoscale.pools[{i}].model", f"unknown model {pool.model!r}")
        for i, d in enumerate(self.discovery):
            _check_template(f"discovery[{i}].node", d.node, known)
        for i, mc in enumerate(self.models):
            if mc.node_selector is not None:
                serving = [(j, n) for j, n in enumerate(self.nodes) if mc.name in n.models]
                _check_selector(f"models[{i}].node_selector", f"serving {mc.name!r}", mc.node_selector, serving)
        for i, mc in enumerate(self.models):   # a compared label that is no number first: the likelier typo
            serving = [(j, n) for j, n in enumerate(self.nodes) if mc.name in n.models]
            for j, v in enumerate(mc.versions):
                if v.selector is not None:
                    _check_selector(f"models[{i}].versions[{j}].selector", f"serving {mc.name!r}", v.selector,
                                    serving, need_one=False)
        problem = (version_problems(self.models, self.nodes) or disaggregation_problems(self.models, self.nodes)
                   or tier_problems(self.models, self.nodes) or lora_problems(self.models))
        if problem is not None:
            raise _KeyPathError(*problem)
        for i, mc in enumerate(self.models):
            for j, v in enumerate(mc.versions):
                if v.node_selector is not None:
                    _check_version_node_selector(f"models[{i}].versions[{j}].node_selector", mc, v, self.nodes)
        return self

    def model(self, name: str) -> ModelConfig | None:
        for m in self.models:
            if m.name == name:
                return m
        return None


def _check_version_node_selector(path: str, mc: ModelConfig, v: VersionConfig, nodes: list[NodeConfig]) -> None:
    """Some node of version ``v`` meets its ``node_selector`` and, joined with it, the model's
    (its compared labels are numbers on the version's nodes: :func:`_check_selector`)."""
    assert v.node_selector is not None
    names = set(version_nodes(v, mc.name, nodes))
    mine = [(j, n) for j, n in enumerate(nodes) if n.name in names]
    _check_selector(path, f"of version {v.name!r} of {mc.name!r}", v.node_selector, mine)
    both = all_of(mc.node_selector, v.node_selector)
    if both is not None and mine and not any(both.matches(n.labels) for _, n in mine):
        why = "; ".join(f"{n.name}: {', '.join(both.missing(n.labels))}" for _, n in mine[:4])
        raise _KeyPathError(path, f"no node of version {v.name!r} of {mc.name!r} meets the model's and the "
                                  f"version's node_selector ({why})")


def _check_selector(path: str, what: str, sel: NodeSelector, serving: list[tuple[int, NodeConfig]], *,
                    need_one: bool = True) -> None:
    """At least one of the nodes ``serving`` (index in ``nodes``, node) meets ``sel`` (when
    ``need_one``), and every label ``sel`` compares as a number is a number on each of them (a typo
    there would silently rule the node out). ``what`` says which nodes, in the messages."""
    for t in sel.terms:
        if t.number is None:
            continue
        for j, n in serving:
            have = n.labels.get(t.label)
            if have is not None and label_number(have) is None:
                raise _KeyPathError(f"nodes[{j}].labels.{t.label}",
                                    f"{have!r} is not a number, but {path} compares it ({t})")
    if need_one and serving and not any(sel.matches(n.labels) for _, n in serving):
        why = "; ".join(f"{n.name}: {', '.join(sel.missing(n.labels))}" for _, n in serving[:4])
        raise _KeyPathError(path, f"no node {what} meets {sel.describe()} ({why})")


def _check_template(path: str, node: dict[str, Any], known: set[str]) -> None:
    """A discovery source's node template is a valid node entry (name and url aside) of known models."""
    try:
        cfg = NodeConfig.model_validate({**node, "name": "discovered", "url": "http://discovered.invalid"})
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = "unknown key" if first["type"] == "extra_forbidden" else str(first["msg"])
        raise _KeyPathError(f"{path}.{_key_path(tuple(first['loc']))}", msg) from None
    for j, served in enumerate(cfg.models):
        if served not in known:
            raise _KeyPathError(f"{path}.models[{j}]", f"unknown model {served!r}")


def _unique(key: str, names: list[str], what: str) -> None:
    first: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in first:
            raise _KeyPathError(f"{key}[{i}].name", f"duplicate {what} name {name!r} (also {key}[{first[name]}])")
        first[name] = i


def check_routing(cfg: FleetConfig) -> None:
    """Build the configured router once (pure, no I/O) so an unknown profile, plugin or parameter
    is a ConfigError at load time, with its key path, not at start-up inside the app."""
    router = cfg.routing.build_router()
    if not router.uses_selector:
        for i, m in enumerate(cfg.models):
            if m.node_selector is not None:
                raise ConfigError(f"model {m.name!r} has a node_selector, but routing.filters leaves out "
                                  f"'node-selector', so it would be ignored", path=f"models[{i}].node_selector")
            for j, v in enumerate(m.versions):
                if v.node_selector is not None:
                    raise ConfigError(f"version {v.name!r} of model {m.name!r} has a node_selector, but "
                                      f"routing.filters leaves out 'node-selector', so it would be ignored",
                                      path=f"models[{i}].versions[{j}].node_selector")


class Settings(BaseSettings):
    """Process-wide settings from ``INFERLB_*`` variables (and keyword arguments in tests)."""

    model_config = SettingsConfigDict(env_prefix="INFERLB_", extra="forbid")

    host: str = "127.0.0.1"
    port: int = 8080
    config: Path | None = None                      # fleet YAML
    database_url: str = "sqlite:///inferlb.db"
    engine: Literal["auto", "spiff", "compiled"] = "auto"
    processes_dir: Path | None = None               # default: the shipped processes/
    request_process: str = "inference_request.bpmn"
    journal_dir: Path = Path("inferlb-journal")
    max_body_bytes: int = 4 * 1024 * 1024
    max_json_depth: int = 64
    max_inflight: int = 4096                         # gateway-wide hard cap on requests in flight
    audit_batch_size: int = 256
    audit_flush_interval_s: float = 0.2
    # -- audit durability (store/writer.py, wal.py, db.py) --
    audit_db_timeout_s: float = Field(10.0, gt=0)            # one database call; past it the batch is spooled
    database_connect_timeout_s: int = Field(5, ge=1)          # PostgreSQL connect_timeout
    database_statement_timeout_ms: int = Field(5000, ge=0)    # PostgreSQL statement_timeout (0: none)
    database_busy_timeout_ms: int = Field(5000, ge=0)         # SQLite busy_timeout
    audit_sqlite_synchronous: Literal["normal", "full"] = "normal"   # full: an fsync per commit (OS-crash durable)
    audit_wal_commit_interval_s: float = Field(0.005, ge=0)   # group commit: at most one fsync per interval
    audit_wal_commit_linger_s: float = Field(0.03, ge=0)      # a group nobody waits on gathers this long
    audit_max_records: int = Field(100_000, gt=0)             # high-water mark: records queued + spooled
    audit_max_bytes: int = Field(256 * 1024 * 1024, gt=0)     # high-water mark: spool file size
    audit_on_full: Literal["closed", "open"] = "closed"       # past the mark: 503 audit_unavailable, or serve
    # -- audit retention and day partitions (store/maintenance.py, retention.py); on the leader replica --
    audit_retention_days: float | None = Field(None, gt=0)    # INFERLB_AUDIT_RETENTION_DAYS; unset: keep everything
    audit_maintenance_interval_s: float = Field(3600.0, gt=0)  # how often partitions-ahead + pruning run
    log_level: str = "INFO"
    fleet: FleetConfig | None = None                 # set directly in tests / demo instead of a file
    # INFERLB_AUTH, INFERLB_ADMIN_KEY, INFERLB_REDIS_URL, INFERLB_REDIS_PREFIX (config/admission.py)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    # INFERLB_CLUSTER_MODE, _LEASE_S, _RENEW_S, _LEADER_LEASE_S, _REPLICA_ID (config/cluster.py)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)

    def cluster_on(self) -> bool:
        """Whether this replica joins a cluster: ``INFERLB_CLUSTER_MODE=on``, or ``auto`` with
        ``INFERLB_REDIS_URL`` set (and ``INFERLB_LIMITS`` not ``memory``)."""
        a = self.admission
        return self.cluster.mode != "off" and bool(a.redis_url) and a.limits != "memory"

    # HTTP edge and shutdown (server, api/edge.py)
    http_header_timeout_s: float = Field(10.0, gt=0)    # whole request head, else 408 / close
    http_body_timeout_s: float = Field(30.0, gt=0)      # whole request body after the head, else 408
    http_max_header_bytes: int = Field(16 * 1024, ge=1024)   # request line + headers, else 431
    http_max_headers: int = Field(100, ge=1)            # header count, else 431
    drain_timeout_s: float = Field(25.0, ge=0)          # SIGTERM: in-flight requests finish within this
    # The admin listener (server/listeners.py): unset port = the public port + 1; 0 = no admin listener.
    admin_host: str = "127.0.0.1"                       # INFERLB_ADMIN_HOST
    admin_port: int | None = Field(None, ge=0, le=65535)   # INFERLB_ADMIN_PORT
    # INFERLB_TLS_* (config/tls.py): the public listener serves HTTPS with a certificate. The admin
    # listener (INFERLB_ADMIN_TLS): auto = HTTPS too when its host is not loopback; on; off.
    tls: ListenerTLS = Field(default_factory=ListenerTLS)
    admin_tls: Literal["auto", "on", "off"] = "auto"       # INFERLB_ADMIN_TLS
    public_docs: bool = False   # INFERLB_PUBLIC_DOCS: /docs and /openapi.json open while auth is on (api/auth.py)
    # Browser origins allowed by CORS (comma-separated in INFERLB_CORS_ALLOW_ORIGINS); none by default.
    cors_allow_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)

    @field_validator("cors_allow_origins", mode="before")
    @classmethod
    def _origins(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [o.strip() for o in v.split(",") if o.strip()]
        return v
    # A request that has passed this many inferlb gateways is refused 508 (engine/hops.py).
    max_hops: int = Field(4, ge=1, le=64)            # INFERLB_MAX_HOPS
    # The OpenAI routes' input caps and the scrape token (api).
    max_n: int = Field(8, ge=1, le=128)              # INFERLB_MAX_N: most choices ('n') per request
    metrics_token: SecretStr | None = None           # INFERLB_METRICS_TOKEN: a bearer token for /metrics only
    # Live changes (live/manager.py): how soon a replica notices a node change or a rollout step made
    # by another replica or process (INFERLB_OVERRIDES_POLL_S). Every poll_s it asks its revision
    # watch (store/revision_watch.py), which needs no thread and no SQL: the SQLite file's
    # stat, or PostgreSQL NOTIFY (a change then applies at once); the revision is read only when
    # the watch says the database moved, and in any case every overrides_reread_s
    # (INFERLB_OVERRIDES_REREAD_S), the safety net for what the watch cannot see.
    overrides_poll_s: float = Field(1.0, gt=0)       # INFERLB_OVERRIDES_POLL_S
    overrides_reread_s: float = Field(30.0, gt=0)    # INFERLB_OVERRIDES_REREAD_S
    # The garbage collector of `inferlb serve` / `demo`, set once the server has started
    # (server/gc_tuning.py: why, and the measured effect on the p99).
    gc_freeze: bool = True                           # INFERLB_GC_FREEZE: start-up objects out of every collection
    gc_gen0_threshold: int = Field(10_000, ge=0)     # INFERLB_GC_GEN0_THRESHOLD: 0 keeps the interpreter's (700)

    # `inferlb serve --workers N` (server/workers.py): N gateway processes on one port, sharing
    # limits and health as replicas of one cluster; "auto": one per usable core. 1 (the default):
    # one process, no supervisor, exactly as before.
    workers: int | Literal["auto"] = Field(1)        # INFERLB_WORKERS

    @field_validator("workers")
    @classmethod
    def _workers(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 256:
            raise ValueError("must be 1 to 256, or auto")
        return v

    def worker_count(self) -> int:
        """How many worker processes ``serve`` runs: ``workers``, or for ``auto`` the cores this
        process may run on."""
        if self.workers == "auto":
            return max(1, len(os.sched_getaffinity(0)))
        return self.workers

    def admin_listen_port(self) -> int:
        """The admin listener's port: ``INFERLB_ADMIN_PORT``, else the public port + 1; 0 = off."""
        if self.admin_port is not None:
            return self.admin_port
        return self.port + 1 if self.port else 0

    def listeners(self) -> tuple[Listener, ...]:
        """This gateway's own listen addresses, public and admin (no node URL may point back at them)."""
        admin = self.admin_listen_port()
        own = (Listener(self.host, self.port),)
        return (*own, Listener(self.admin_host, admin)) if admin else own

    def resolved_fleet(self) -> FleetConfig:
        """The fleet: the inline one, or the file named by ``config``, checked against this
        gateway's listeners (:meth:`listeners`)."""
        if self.fleet is not None:
            if self.fleet.listeners == self.listeners():
                return self.fleet
            return fleet_from_mapping(self.fleet.model_dump(), source="fleet", listeners=self.listeners())
        if self.config is None:
            raise ConfigError("no fleet configured: pass --config FILE or set INFERLB_CONFIG")
        return load_fleet_file(self.config, listeners=self.listeners())


def _key_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def load_fleet_file(path: Path | str, *, listeners: tuple[Listener, ...] = ()) -> FleetConfig:
    """Parse and validate a fleet YAML file, or raise ConfigError naming file and key path
    (``listeners``: :func:`fleet_from_mapping`)."""
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", source=str(p)) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {_yaml_problem(exc)}", source=str(p)) from exc
    return fleet_from_mapping(raw, source=str(p), listeners=listeners)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """``exc`` in words, with its line and column, but without the copy of the offending line that
    PyYAML's own message quotes: that line may hold a node's ``api_key``, and this message goes
    into the reload answer, the logs and the start-up error."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return str(exc)   # a ReaderError: a character code and a position, nothing of the text
    parts = []
    for what, mark in ((exc.context, exc.context_mark), (exc.problem, exc.problem_mark)):
        if what:
            parts.append(f"{what} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else what)
    return "; ".join(parts) or type(exc).__name__


def fleet_from_mapping(raw: Any, *, source: str = "<config>", listeners: tuple[Listener, ...] = ()
                       ) -> FleetConfig:
    """A validated fleet from a parsed file (ConfigError naming ``source`` and the key path otherwise).
    ``listeners``: the gateway's own host:port pairs, which no node URL may name."""
    if not isinstance(raw, dict):
        raise ConfigError("the top level must be a mapping with models: and nodes:", source=source)
    try:
        cfg = FleetConfig.model_validate(raw, context={"listeners": listeners})
    except ValidationError as exc:
        first = exc.errors()[0]
        msg = first["msg"]
        path = _key_path(tuple(first["loc"]))
        err = (first.get("ctx") or {}).get("error")
        if isinstance(err, _KeyPathError):
            msg, path = err.message, err.path
        elif isinstance(err, ValueError) and isinstance(err.__cause__, PluginError):
            # a field naming a plugin (config/plugin_field.py): the loader's own error, located
            raise err.__cause__.located(source=source, path=path) from exc
        elif isinstance(err, ValueError):
            msg = str(err)
        elif first["type"] == "extra_forbidden":
            msg = "unknown key"
        raise ConfigError(msg, source=source, path=path) from exc
    try:
        check_routing(cfg)
    except PluginError as exc:
        raise exc.located(source=source, path=exc.path or "routing") from exc
    except ConfigError as exc:
        raise ConfigError(exc.message, source=source, path=exc.path or "routing") from exc
    return cfg


# Variables that once existed and asked for something inferlb does not do: turned on, they are an
# error that says why, rather than silently ignored (turned off, they match what inferlb does).
_REMOVED_ENV = {
    "INFERLB_STORE_PROMPTS": "removed: inferlb never stores prompt or completion text (the audit record "
                             "keeps sizes and token counts only); unset it",
}


def load_settings(**overrides: Any) -> Settings:
    """Settings from the environment, with ``overrides`` taking precedence; ConfigError on error."""
    for name, why in _REMOVED_ENV.items():
        if os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off"):
            raise ConfigError(why, source="environment", path=name)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(first["msg"], source="environment", path="INFERLB_" + _key_path(
            tuple(first["loc"])).upper()) from exc
