"""OpenTelemetry traces built from finished audit records (the ``otel`` extra; off unless configured).

Contract:

* :func:`build_tracer` returns None when ``tracing.enabled`` is false, and raises
  :class:`~inferlb.errors.ConfigError` when it is true but opentelemetry-sdk is missing.
  The tracer provider is the app's own (never the process-global one), so two apps, or a test's
  in-memory exporter, never see each other's spans.
* :meth:`RecordTracer.emit` turns ONE record into spans after the request ended: nothing runs per
  token or per chunk, and the request path never waits on an exporter (the batch span processor
  exports off-thread). Timestamps come from the record, so spans line up with the audit trail.
* Span tree (names follow the GenAI semantic conventions, ``{operation} {model}``)::

      chat llama-3-8b                (SERVER; received → last byte)
      ├── inferlb.admission          (received → admitted)
      ├── inferlb.routing            (admitted → routed)
      ├── chat llama-3-8b            (CLIENT; attempt 1 on its node)
      └── chat llama-3-8b            (CLIENT; attempt 2, a retry or a fallback)

  Attributes: ``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``, ``error.type``,
  ``http.response.status_code``, and ``inferlb.*`` (request id, node, tenant, priority, status,
  model version, attempt number and outcome, the BPMN path). Spans of failed requests and
  attempts have status ERROR; a client's own error (bad input, disconnect) does not.
* The BPMN tasks are not timed one by one (only the record's phase timestamps exist), so the
  process is represented by the phase spans plus ``inferlb.workflow.path`` on the root span.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferlb.config.observability import TracingConfig
from inferlb.errors import ConfigError
from inferlb.store.records import AttemptRecord, RequestRecord

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = ["OPERATION_NAMES", "RecordTracer", "build_tracer"]

# gen_ai.operation.name per gateway endpoint (the semantic conventions' well-known values).
OPERATION_NAMES = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings",
                   "predict": "predict"}
_CLIENT_STATUSES = frozenset({"rejected_invalid", "client_closed"})


def _ns(t: float) -> int:
    return round(t * 1e9)


class RecordTracer:
    """Emits one trace per finished request record."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry import trace

        self.provider = provider
        self._trace = trace
        self._tracer = provider.get_tracer("inferlb")

    def emit(self, rec: RequestRecord) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        op = OPERATION_NAMES.get(rec.endpoint, rec.endpoint)
        ends = [a.ended_at for a in rec.attempts if a.ended_at is not None]
        end = rec.last_byte_at if rec.last_byte_at is not None else max(ends, default=rec.received_at)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": op,
            "gen_ai.request.model": rec.model_requested,
            "inferlb.request_id": rec.request_id,
            "inferlb.status": rec.status,
            "inferlb.stream": rec.stream,
            "inferlb.attempts": len(rec.attempts),
            "inferlb.workflow.path": list(rec.workflow_path),
        }
        optional = {
            "gen_ai.response.model": rec.model_served, "gen_ai.usage.input_tokens": rec.prompt_tokens,
            "gen_ai.usage.output_tokens": rec.completion_tokens, "http.response.status_code": rec.http_status,
            "inferlb.node": rec.node, "inferlb.tenant": rec.tenant, "inferlb.priority": rec.priority,
            "inferlb.model_version": rec.model_version, "inferlb.engine": rec.engine,
        }
        attrs.update({k: v for k, v in optional.items() if v is not None})
        failed = rec.status != "ok" and rec.status not in _CLIENT_STATUSES
        if rec.status != "ok" and rec.error_class:
            attrs["error.type"] = rec.error_class
        root = self._tracer.start_span(f"{op} {rec.model_requested}", kind=SpanKind.SERVER,
                                       start_time=_ns(rec.received_at), attributes=attrs)
        if failed:
            root.set_status(Status(StatusCode.ERROR, rec.status))
        ctx = self._trace.set_span_in_context(root)
        phases = (("inferlb.admission", rec.received_at, rec.admitted_at),
                  ("inferlb.routing", rec.admitted_at, rec.routed_at))
        for name, t0, t1 in phases:
            if t0 is not None and t1 is not None and t1 >= t0:
                self._tracer.start_span(name, context=ctx, start_time=_ns(t0)).end(end_time=_ns(t1))
        for a in rec.attempts:
            self._attempt(ctx, op, a, end)
        root.end(end_time=_ns(max(end, rec.received_at)))

    def _attempt(self, ctx: Any, op: str, a: AttemptRecord, fallback_end: float) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        attrs: dict[str, Any] = {"gen_ai.operation.name": op, "gen_ai.request.model": a.model,
                                 "inferlb.node": a.node, "inferlb.attempt.number": a.number,
                                 "inferlb.attempt.outcome": a.outcome}
        if a.http_status is not None:
            attrs["http.response.status_code"] = a.http_status
        if a.error_class:
            attrs["error.type"] = a.error_class
        span = self._tracer.start_span(f"{op} {a.model}", context=ctx, kind=SpanKind.CLIENT,
                                       start_time=_ns(a.started_at), attributes=attrs)
        if a.outcome not in ("ok", "client_closed"):
            span.set_status(Status(StatusCode.ERROR, a.error_class or a.outcome))
        end = a.ended_at if a.ended_at is not None else fallback_end
        span.end(end_time=_ns(max(end, a.started_at)))

    def shutdown(self) -> None:
        self.provider.shutdown()


def build_tracer(cfg: TracingConfig, provider: TracerProvider | None = None) -> RecordTracer | None:
    """The configured tracer, or None when tracing is off. ``provider`` overrides (tests)."""
    if provider is not None:
        return RecordTracer(provider)
    if not cfg.enabled:
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise ConfigError("observability.tracing.enabled needs the otel extra: pip install 'inferlb[otel]'",
                          source="fleet config", path="observability.tracing.enabled") from exc
    exporter: SpanExporter | None
    if cfg.exporter == "console":
        exporter = ConsoleSpanExporter()
    elif cfg.exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise ConfigError("the otlp exporter needs opentelemetry-exporter-otlp-proto-http "
                              "(pip install 'inferlb[otel]')", source="fleet config",
                              path="observability.tracing.exporter") from exc
        exporter = OTLPSpanExporter()   # endpoint and headers from the standard OTEL_EXPORTER_OTLP_* variables
    else:
        exporter = None
    tp = TracerProvider(resource=Resource.create({"service.name": cfg.service_name}),
                        sampler=ParentBased(TraceIdRatioBased(cfg.sample_ratio)))
    if exporter is not None:
        tp.add_span_processor(BatchSpanProcessor(exporter))
    return RecordTracer(tp)
