"""OpenTelemetry traces built from finished records, read back with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from inferlb.config.observability import TracingConfig
from inferlb.config.settings import fleet_from_mapping
from inferlb.observability.tracing import build_tracer
from inferlb.simulator.emulator import SimFleet
from inferlb.store.records import AttemptRecord, RequestRecord
from tests.support import fast_specs, fleet_for, running_gateway, settings_for

pytest.importorskip("opentelemetry.sdk.trace", reason="tracing needs the otel extra")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

T = 1_767_225_600.0


def _memory() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def test_one_trace_per_record_with_attempt_spans() -> None:
    provider, exporter = _memory()
    tracer = build_tracer(TracingConfig(), provider)
    assert tracer is not None
    rec = RequestRecord(
        request_id="abc", received_at=T, endpoint="chat", model_requested="llama", model_served="llama-small",
        tenant="acme", node="gpu-b", priority="interactive", stream=True, status="ok", http_status=200,
        admitted_at=T + 0.001, routed_at=T + 0.002, first_byte_at=T + 0.3, last_byte_at=T + 1.5,
        prompt_tokens=12, completion_tokens=40, workflow_path=["start", "evaluate", "dispatch", "end"],
        attempts=[AttemptRecord(1, "gpu-a", "llama", T + 0.003, T + 0.1, "retryable", 503, "upstream_status"),
                  AttemptRecord(2, "gpu-b", "llama-small", T + 0.12, T + 1.5, "ok", 200, None, T + 0.3)])
    tracer.emit(rec)
    spans = {s.name + (f"#{s.attributes.get('inferlb.attempt.number')}" if s.kind == SpanKind.CLIENT else ""): s
             for s in exporter.get_finished_spans()}
    assert set(spans) == {"chat llama", "inferlb.admission", "inferlb.routing", "chat llama#1",
                          "chat llama-small#2"}
    root = spans["chat llama"]
    assert root.kind == SpanKind.SERVER and root.parent is None
    assert root.start_time == round(T * 1e9) and root.end_time == round((T + 1.5) * 1e9)
    attrs = dict(root.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "llama"
    assert attrs["gen_ai.response.model"] == "llama-small"
    assert attrs["gen_ai.usage.input_tokens"] == 12 and attrs["gen_ai.usage.output_tokens"] == 40
    assert attrs["inferlb.request_id"] == "abc" and tuple(attrs["inferlb.workflow.path"])[-1] == "end"
    for name in ("inferlb.admission", "inferlb.routing", "chat llama#1", "chat llama-small#2"):
        child = spans[name]
        assert child.parent is not None and child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
    failed = spans["chat llama#1"]
    assert failed.status.status_code == StatusCode.ERROR and failed.attributes["error.type"] == "upstream_status"
    assert failed.attributes["http.response.status_code"] == 503 and failed.attributes["inferlb.node"] == "gpu-a"
    assert spans["chat llama-small#2"].status.status_code == StatusCode.UNSET


def test_failed_request_is_an_error_and_client_errors_are_not() -> None:
    provider, exporter = _memory()
    tracer = build_tracer(TracingConfig(), provider)
    assert tracer is not None
    tracer.emit(RequestRecord(request_id="a", received_at=T, endpoint="completions", model_requested="m",
                              status="no_healthy_upstream", http_status=503, error_class="no_healthy_upstream",
                              last_byte_at=T + 0.01))
    tracer.emit(RequestRecord(request_id="b", received_at=T, endpoint="embeddings", model_requested="m",
                              status="rejected_invalid", http_status=400, error_class="invalid_value",
                              last_byte_at=T + 0.01))
    a, b = exporter.get_finished_spans()
    assert a.name == "text_completion m" and a.status.status_code == StatusCode.ERROR
    assert a.attributes["error.type"] == "no_healthy_upstream"
    assert b.name == "embeddings m" and b.status.status_code == StatusCode.UNSET


def test_off_unless_configured() -> None:
    assert build_tracer(TracingConfig()) is None
    assert build_tracer(TracingConfig(enabled=True, exporter="none")) is not None


async def test_gateway_emits_a_trace_per_request(tmp_path: Path) -> None:
    async with SimFleet(fast_specs()) as sim:
        urls = {n: node.url for n, node in sim.nodes.items()}
        raw = fleet_for(urls).model_dump()
        raw["observability"] = {"tracing": {"enabled": True, "exporter": "none"}}
        async with running_gateway(settings_for(tmp_path, fleet_from_mapping(raw))) as (base, app):
            exporter = InMemorySpanExporter()
            app.state.observability.tracer.provider.add_span_processor(SimpleSpanProcessor(exporter))
            client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=3)
            stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "s"}],
                                                          max_tokens=3, stream=True)
            async for _ in stream:
                pass
            # The stream's record is submitted when the server's generator finishes, just after the
            # client read [DONE]: wait for that condition (bounded), not for time.
            for _ in range(500):
                roots = [s for s in exporter.get_finished_spans() if s.parent is None]
                if len(roots) == 2:
                    break
                await asyncio.sleep(0.01)
            assert [r.name for r in roots] == ["chat m", "chat m"]
            assert all(r.attributes["gen_ai.usage.output_tokens"] == 3 for r in roots)
            attempts = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CLIENT]
            assert len(attempts) == 2
