"""Per-app :class:`Runtime` and per-request :class:`RequestScope`: what service operations act on.

The workflow data holds small JSON control values; everything else about a request (the audit
record being built, the routing decision, nodes tried) lives in its scope, outside the engine.

One home per per-request concept (every driver of the request process uses these: the gateway,
``tests/processes/harness.py`` and ``inferlb/bench/engine.py``):

- :func:`begin_request` builds the scope, its audit record and the process's start data
  (``request`` and ``tags``) from an :class:`IncomingRequest`;
- ``request/evaluate`` computes the output budget (:attr:`RequestScope.output_budget`) and the
  deadline (:attr:`RequestScope.deadline_at`, also ``RequestRecord.deadline_at``) once;
- ``routing/select`` records its pick in :attr:`RequestScope.decision`: that pick is the dispatch
  target (the ``routing`` variable is the process's copy, read by its conditions);
- :meth:`RequestScope.begin_attempt` starts one attempt against that target;
- ``request/evaluate`` resolves the model version (:attr:`RequestScope.version`: sticky by
  weight, or pinned by ``x-inferlb-model-version``); routing considers only its nodes and
  :meth:`RequestScope.upstream_model` is the model name dispatch sends to the node.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inferlb.admission.controller import AdmissionController
from inferlb.config.settings import FleetConfig, Settings
from inferlb.engine.request_ids import new_request_id
from inferlb.engine.tokens import TokenEstimator
from inferlb.fleet.state import Fleet
from inferlb.routing.disagg import PairDecision
from inferlb.routing.length import LengthEstimate, LengthPredictor
from inferlb.routing.prefix import block_hashes, text_key
from inferlb.routing.profiles import Router
from inferlb.routing.types import Decision
from inferlb.store.records import AttemptRecord, RequestRecord
from inferlb.tiers.router import TierRouter
from inferlb.types import Clock
from inferlb.versions.table import Version, VersionTable

if TYPE_CHECKING:
    from inferlb.kvevents.service import KVEventsService
    from inferlb.workflow.definition import ProcessDefinition

__all__ = ["IncomingRequest", "RequestScope", "Runtime", "Snapshot", "begin_request", "build_runtime"]


@dataclass
class IncomingRequest:
    """What the API layer hands over after validating the client's input."""

    endpoint: str                        # chat | completions | embeddings | responses | predict
    model: str
    body: dict[str, Any]                 # forwarded to the node (model name rewritten per attempt)
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    n: int = 1                           # choices asked for: admission and TPM count n × the output budget
    prompt_bytes: int = 0
    prompt_text: str | None = None
    tenant: str | None = None
    priority: str | None = None
    deadline_s: float | None = None
    request_id: str | None = None
    key_id: str | None = None            # the tenant key's public id (auth on); admission applies its limits
    session: str | None = None           # the x-session-id header (the body's ``user`` is the fallback)
    user: str | None = None              # the body's ``user`` or the x-session-id header: sticky version key
    model_version: str | None = None     # x-inferlb-model-version: a version pinned by the client
    hops: tuple[str, ...] = ()           # x-inferlb-hop: the gateways it passed before this one (engine/hops.py)


def _no_begin(record: RequestRecord) -> Awaitable[bool] | None:
    """No audit journal (benchmarks, tests of the core): nothing to do at a request's start."""
    return None


@dataclass
class Runtime:
    """Shared by all requests of one app (one event loop)."""

    settings: Settings
    fleet_cfg: FleetConfig
    fleet: Fleet
    router: Router
    estimator: TokenEstimator
    clock: Clock
    rng: random.Random
    admission: AdmissionController               # slots, queue, tenant limits, retry budget
    # The end-of-request hook (app.request_end: spend, admission release, audit, metrics, traces):
    # called exactly once per request, rejections included; never blocks, never raises.
    on_request_end: Callable[[RequestRecord], None]
    # The audit writer's start: queues a request's start entry for the write-ahead log and returns
    # what to await before the response's first byte (None: nothing); raises AuditUnavailable (503)
    # when the request could not be audited. Called once, at the top of Gateway.handle.
    begin: Callable[[RequestRecord], Awaitable[bool] | None] = field(default=_no_begin)
    # The learned profile's predictor lifecycle (routing/lifecycle.py); None for other profiles.
    learner: Any = None
    # Model versions and their weights in force (versions); rollouts change the weights.
    versions: VersionTable = field(default_factory=lambda: VersionTable([], []))
    # The output-length predictor (routing/length.py; routing.output_length), kept across reloads
    # (they replace the runtime's config, not its history); None: the declared budget is used.
    lengths: LengthPredictor | None = None
    # Model aliases with tiers (tiers/router.py): guard, learned model and counts, kept across reloads.
    tiers: TierRouter | None = None
    # The engines' KV events (inferlb/kvevents), kept across reloads; None: no model or node uses them.
    kv: KVEventsService | None = None


@dataclass(frozen=True)
class Snapshot:
    """What a request starts on, swapped whole by a reload (live/manager.py): the runtime (its
    ``fleet_cfg`` and ``router``; the live fleet, admission and clock are shared by all snapshots),
    the request process (a ``ProcessDefinition``), and the effective config's version."""

    rt: Runtime
    process: ProcessDefinition
    config_version: str = ""


@dataclass
class RequestScope:
    """One request's context. ``deadline_at`` is on the monotonic clock."""

    rt: Runtime
    record: RequestRecord
    received_mono: float
    prompt_text: str | None = None
    deadline_at: float = 0.0
    model: str = ""                              # the model being routed now (changes on fallback)
    models_tried: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)
    attempts: int = 0
    max_attempts: int = 3
    decision: Decision | None = None             # the last routing decision; its pick is the dispatch target
    # A disaggregated model's pair (routing/disagg.py): its prefill leg runs before the dispatch
    # target (``decision``, the decode leg) is sent the request (engine/disagg.py). None: one node.
    pair: PairDecision | None = None
    output_budget: int = 0                       # output tokens, computed once by request/evaluate
    # What routing and the node's load count: the predictor's estimate (≤ output_budget), else the budget.
    output_estimate: int = 0
    length_estimate: LengthEstimate | None = None   # the predictor's estimate, to score it when the answer ends
    last_outcome: dict[str, Any] | None = None
    retry_after_s: float | None = None           # smallest Retry-After seen (for a final 429)
    # The last attempt was cut by the client's own deadline, not by a slow node: the answer then
    # says the deadline passed (504 deadline_exceeded), not that the node failed (engine/outcomes.py).
    deadline_cut: bool = False
    journaled: Awaitable[bool] | None = None     # the start entry's commit: awaited before the first byte
    # Affinity inputs, only when the router reads them (Router.prefix_blocks > 0): the prompt's
    # chained block hashes and the session's 64-bit key (routing/prefix.py).
    prefix: tuple[int, ...] = ()
    session_key: int | None = None
    version: Version | None = None               # the model version routed to now (None: unversioned model)
    version_pinned: bool = False                 # chosen by the client's header: never swapped for another
    user: str | None = None                      # the sticky key's user part (a fallback model's version too)
    tenant: str | None = None
    body: Mapping[str, Any] | None = None         # the client's body (not copied): a tier alias's classifier reads it
    tier: dict[str, Any] | None = None           # the tier choice of a model alias (tiers/router.py TierChoice)

    def upstream_model(self) -> str:
        """The model name the node is asked for: the version's ``upstream_name``, else the
        model's LoRA ``adapter`` (config/lora.py), else its ``upstream_name``, else the model's own
        name. The one place dispatch reads it from."""
        return self.upstream_model_for(self.version)

    def upstream_model_for(self, v: Version | None) -> str:
        """:meth:`upstream_model` were ``v`` the request's version (routing asks it of a fallback version)."""
        if v is not None and v.upstream_name:
            return v.upstream_name
        # The request's own config first: a reload may have dropped the model since it started.
        name = self.model or self.record.model_requested
        m = self.rt.fleet_cfg.model(name) or self.rt.fleet.models.get(name)
        if m is None:
            return self.record.model_requested
        return (m.lora.adapter if m.lora is not None else None) or m.upstream_name or m.name

    def begin_attempt(self) -> AttemptRecord:
        """Start the next attempt against the node the last routing decision picked.

        Counts the attempt, remembers the node as tried (routing skips it from now on) and appends
        its :class:`AttemptRecord` to the audit record; the decision that chose the node is kept
        with the attempt number in ``record.decisions``. Raises ValueError without a pick.
        """
        decision = self.decision
        if decision is None or decision.pick is None:
            raise ValueError("no routing decision picked a node for this attempt")
        node = decision.pick
        self.attempts += 1
        self.tried.append(node)
        rec = self.record
        # The record's number: a disaggregated pair's prefill leg is an attempt row of its own
        # (engine/disagg.py), so rows may outnumber ``attempts`` (which counts pairs).
        number = len(rec.attempts) + 1
        if rec.decisions and rec.decisions[-1].get("attempt") is None:
            rec.decisions[-1]["attempt"] = number
        attempt = AttemptRecord(number=number, node=node, model=self.model,
                                started_at=round(self.rt.clock.time(), 6))
        rec.attempts.append(attempt)
        return attempt


def begin_request(rt: Runtime, req: IncomingRequest, *, engine: str | None = None
                  ) -> tuple[RequestScope, dict[str, Any]]:
    """The request's scope (with its audit record) and the process's start data.

    The start data is ``{"request": {...}, "tags": {}}`` as processes/README.md describes it; this
    is the only place that builds it, and of the request's affinity inputs: when the router reads
    them (``rt.router.prefix_blocks`` > 0), the prompt text's first block hashes and the session
    key (the ``x-session-id`` header, else the body's ``user``), both hashed here, once.
    """
    rid = req.request_id or new_request_id()
    rec = RequestRecord(request_id=rid, received_at=round(rt.clock.time(), 6), endpoint=req.endpoint,
                        model_requested=req.model, tenant=req.tenant, stream=req.stream, engine=engine)
    scope = RequestScope(rt=rt, record=rec, received_mono=rt.clock.monotonic(), prompt_text=req.prompt_text,
                         user=req.user, tenant=req.tenant, body=req.body)
    blocks = rt.router.prefix_blocks
    if blocks:
        if req.prompt_text:
            scope.prefix = block_hashes(req.prompt_text, blocks)
        user = req.body.get("user")
        session = req.session if req.session else user if isinstance(user, str) and user else None
        if session is not None:
            scope.session_key = text_key(session)
    data: dict[str, Any] = {
        "request": {"id": rid, "endpoint": req.endpoint, "model": req.model, "stream": req.stream,
                    "tenant": req.tenant, "priority": req.priority, "max_tokens": req.max_tokens,
                    "n": req.n, "prompt_bytes": req.prompt_bytes, "deadline_s": req.deadline_s,
                    "key_id": req.key_id, "model_version": req.model_version},
        "tags": {},
    }
    return scope, data


def build_runtime(
    settings: Settings,
    fleet_cfg: FleetConfig,
    *,
    clock: Clock,
    end: Callable[[AdmissionController], Callable[[RequestRecord], None]],
    seed: int | None = None,
    begin: Callable[[RequestRecord], Awaitable[bool] | None] | None = None,
    admission_cls: type[AdmissionController] = AdmissionController,
    versions: VersionTable | None = None,
    tiers: TierRouter | None = None,
) -> Runtime:
    """Wire fleet, router, estimator and admission for one app (or one test); ``end`` makes the
    end-of-request hook from the admission controller (``functools.partial(app.request_end, ...)``);
    ``admission_cls``: the cluster's controller when several replicas share Redis (cluster)."""
    r = fleet_cfg.routing
    router = r.build_router(seed=r.seed if seed is None else seed, clock=clock.time)
    estimator = TokenEstimator()
    for m in fleet_cfg.models:
        if m.tokenizer:
            estimator.use_tokenizer(m.name, m.tokenizer)
    fleet = Fleet(fleet_cfg, clock)
    versions = versions if versions is not None else VersionTable.from_fleet(fleet_cfg)
    admission = admission_cls(fleet_cfg.admission, fleet, clock, max_inflight=settings.max_inflight,
                              env=settings.admission)
    ol = r.output_length
    lengths = LengthPredictor(budget=ol.budget, min_samples=ol.min_samples, window=ol.window) if ol.enabled else None
    return Runtime(settings=settings, fleet_cfg=fleet_cfg, fleet=fleet, router=router, estimator=estimator,
                   clock=clock, rng=random.Random(seed), on_request_end=end(admission), admission=admission,
                   begin=begin or _no_begin, learner=getattr(router, "lifecycle", None), versions=versions,
                   lengths=lengths, tiers=tiers if tiers is not None else TierRouter(clock))
