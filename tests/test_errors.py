"""The one OpenAI error-body builder: the JSON body, the SSE error event and the exception envelope
are the same four fields."""

from __future__ import annotations

import json

from inferlb.errors import AuditUnavailable, ModelNotFound, error_body, error_event, error_json

FIELDS = {"message", "type", "param", "code"}


def test_the_body_has_exactly_the_openai_fields() -> None:
    body = error_body("bad", "invalid_request_error", "invalid_value", "messages")
    assert body == {"error": {"message": "bad", "type": "invalid_request_error", "param": "messages",
                              "code": "invalid_value"}}
    assert json.loads(error_json("bad", code="x")) == error_body("bad", "invalid_request_error", "x")


def test_the_sse_error_event_carries_the_same_body() -> None:
    event = error_event("cut", "server_error", "upstream_error")
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n\n") == 1
    assert json.loads(event[len(b"data: "):]) == error_body("cut", "server_error", "upstream_error")


def test_client_errors_render_through_the_builder() -> None:
    assert ModelNotFound("m").envelope() == error_body("The model 'm' does not exist", "invalid_request_error",
                                                       "model_not_found", "model")
    env = AuditUnavailable("journal full").envelope()
    assert set(env["error"]) == FIELDS
    assert env == error_body("journal full", "server_error", "audit_unavailable")
