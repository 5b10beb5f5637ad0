"""The SSE relay the gateway runs (split, check, usage, bounds) and the cheap usage / error
extraction (pure, no I/O)."""

from __future__ import annotations

import pytest

from inferlb.engine.sse import (
    SSERelay,
    Usage,
    check_payload,
    extract_error,
    extract_usage,
)
from inferlb.errors import UpstreamProtocolError
from inferlb.simulator.openai_format import ChunkTemplate, completion_body

STREAM = (
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}\n\n'
    b': keep-alive comment\n\n'
    b'event: message\nid: 7\nretry: 100\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"b"}}],"usage":null}\n\n'
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
    b"data: [DONE]\n\n"
)


def relay_all(relay: SSERelay, chunks: list[bytes]) -> bytes:
    return b"".join(relay.feed(c) for c in chunks) + relay.finish()


def test_any_chunking_forwards_the_same_events() -> None:
    r = SSERelay()
    whole = relay_all(r, [STREAM])
    assert whole == STREAM
    assert r.done and not r.incomplete and r.usage == Usage(3, 2) and r.content_events == 2
    for size in (1, 2, 3, 7, 64):
        r = SSERelay()
        assert relay_all(r, [STREAM[i:i + size] for i in range(0, len(STREAM), size)]) == whole
        assert r.done and r.usage == Usage(3, 2) and r.content_events == 2


def test_usage_only_chunk_is_hidden_when_the_client_did_not_ask() -> None:
    r = SSERelay(hide_usage=True)
    out = relay_all(r, [STREAM])
    assert b'"completion_tokens":2' not in out and out.endswith(b"data: [DONE]\n\n")
    assert r.usage == Usage(3, 2)   # still counted


@pytest.mark.parametrize("eol", [b"\r\n", b"\r", b"\n"])
def test_line_endings(eol: bytes) -> None:
    raw = STREAM.replace(b"\n", eol)
    whole = relay_all(SSERelay(), [raw])
    assert whole == relay_all(SSERelay(), [raw[i:i + 1] for i in range(len(raw))]) == STREAM


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    r = SSERelay()
    assert r.feed(b'data: {"a":1}\r') == b""
    assert r.feed(b"\n\r") == b""
    assert r.feed(b"\n") == b'data: {"a":1}\n\n'


def test_multiline_data_is_one_payload() -> None:
    r = SSERelay()
    assert r.feed(b'data:{"a":\ndata: 1}\n\n') == b'data:{"a":\ndata: 1}\n\n'
    assert r.content_events == 1


def test_unfinished_event_is_held_and_reported() -> None:
    r = SSERelay()
    assert r.feed(b'data: {"a":1}\n\ndata: {"b"') == b'data: {"a":1}\n\n'
    assert r.incomplete and not r.done


def test_line_without_field_is_a_protocol_error_after_the_good_events() -> None:
    r = SSERelay()
    with pytest.raises(UpstreamProtocolError, match="malformed SSE line"):
        r.feed(b'data: {"a":1}\n\n{"id": 1}\n\n')
    assert r.unsent == b'data: {"a":1}\n\n'


def test_in_band_error_event_is_a_protocol_error() -> None:
    r = SSERelay()
    with pytest.raises(UpstreamProtocolError, match="in-band error"):
        r.feed(b'data: {"error": {"message": "oom", "code": "internal_error"}}\n\n')


def test_event_size_is_bounded() -> None:
    # A node that never sends a blank line: the tail may not grow past the bound.
    r = SSERelay(max_event_bytes=100)
    with pytest.raises(UpstreamProtocolError, match="over 100 bytes"):
        for _ in range(20):
            r.feed(b"data: " + b"x" * 20)            # no line end at all
    r = SSERelay(max_event_bytes=100)
    with pytest.raises(UpstreamProtocolError, match="over 100 bytes"):
        for _ in range(20):
            r.feed(b"data: " + b"x" * 20 + b"\n")   # many lines, one event
    r = SSERelay(max_event_bytes=100)
    with pytest.raises(UpstreamProtocolError, match="over 100 bytes"):
        r.feed(b"data: {" + b"x" * 200 + b"}\n\n")   # one whole event in one chunk


def test_check_payload() -> None:
    check_payload(b"[DONE]")
    check_payload(b'{"a": 1}')
    for bad in (b'{"id": "x", "choi', b"hello", b"", b"[1]"):
        with pytest.raises(UpstreamProtocolError):
            check_payload(bad)


def test_extract_usage() -> None:
    assert extract_usage(b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2}}') == Usage(3, 2)
    assert extract_usage(b'{"choices":[{"delta":{"content":"x"}}],"usage":null}') is None
    assert extract_usage(b'{"choices":[{"delta":{"content":"x"}}]}') is None
    # "usage" inside generated text is escaped, so it is never taken for the key.
    assert extract_usage(b'{"choices":[{"delta":{"content":"\\"usage\\": {\\"prompt_tokens\\": 9}"}}]}') is None
    assert extract_usage(b'{"usage": {"prompt_tokens": 5, "total_tokens": 5}}') == Usage(5, 0)  # embeddings
    u = extract_usage(completion_body(chat=True, rid="r", model="m", created=0, fingerprint="f",
                                      prompt_tokens=7, completion_tokens=4, finish_reason="length"))
    assert u == Usage(7, 4) and u.total_tokens == 11
    with pytest.raises(UpstreamProtocolError):
        extract_usage(b'{"usage": {"prompt_tokens": 3, "completion_')
    with pytest.raises(UpstreamProtocolError):
        extract_usage(b'{"usage": {"prompt_tokens": -1, "completion_tokens": 2}}')
    with pytest.raises(UpstreamProtocolError):
        extract_usage(b'{"usage": {"prompt_tokens": "3", "completion_tokens": 2}}')


def test_extract_error() -> None:
    assert extract_error(b'{"error": {"message": "boom", "type": "server_error"}}') == {
        "message": "boom", "type": "server_error"}
    assert extract_error(b'{"error": "boom"}') == {"message": "boom"}
    assert extract_error(b'{"choices":[{"delta":{"content":"\\"error\\""}}]}') is None
    assert extract_error(b'{"choices":[]}') is None


def emulator_stream(n: int, *, malformed_at: int | None = None) -> bytes:
    t = ChunkTemplate(chat=True, rid="r", model="m", created=0, fingerprint="f", include_usage=True)
    parts = [t.role()]
    parts += [t.malformed(i) if i == malformed_at else t.token(i) for i in range(n)]
    parts += [t.finish("length"), t.usage(3, n), t.done()]
    return b"".join(parts)


def test_relay_counts_content_and_finds_usage() -> None:
    raw = emulator_stream(5)
    r = SSERelay()
    out = relay_all(r, [raw[i:i + 13] for i in range(0, len(raw), 13)])
    assert out == raw and r.done
    assert r.content_events == 5   # the tokens: not the role chunk, the finish-only chunk nor the usage chunk
    assert r.usage == Usage(3, 5)


def test_relay_rejects_malformed_json() -> None:
    r = SSERelay()
    with pytest.raises(UpstreamProtocolError):
        relay_all(r, [emulator_stream(5, malformed_at=2)])
    assert r.content_events == 2   # the tokens relayed before the bad event


RESPONSES = (
    b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1","status":"in_progress",'
    b'"error":null,"usage":null}}\n\n'
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"tok0 "}\n\n'
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"tok1 "}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_1","status":'
    b'"completed","error":null,"usage":{"input_tokens":3,"output_tokens":2,"total_tokens":5}}}\n\n'
)


def test_responses_stream_ends_at_completed_with_its_usage() -> None:
    r = SSERelay(responses=True)
    assert relay_all(r, [RESPONSES[i:i + 9] for i in range(0, len(RESPONSES), 9)]) == RESPONSES
    assert r.done and r.content_events == 2 and r.usage == Usage(3, 2)
    cut = SSERelay(responses=True)
    relay_all(cut, [RESPONSES[:RESPONSES.index(b"event: response.completed")]])
    assert not cut.done and cut.content_events == 2


def test_responses_error_events_are_in_band_errors() -> None:
    for ev in (b'event: error\ndata: {"type":"error","code":"server_error","message":"boom"}\n\n',
               b'event: response.failed\ndata: {"type":"response.failed","response":{"error":{"code":"x"}}}\n\n'):
        with pytest.raises(UpstreamProtocolError, match="in-band"):
            SSERelay(responses=True).feed(ev)


# The closing chunks of llama-cpp-python 0.3.36's streams, as it sent them (chat: an empty delta;
# completions: an empty text), and vLLM's last-token chunk, which carries a token and the reason.
LLAMACPP_CHAT_END = (b'{"id": "chatcmpl-1", "model": "x", "created": 1, "object": "chat.completion.chunk", '
                     b'"choices": [{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"}]}')
LLAMACPP_TEXT_END = (b'{"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "x", "choices": '
                     b'[{"text": "", "index": 0, "logprobs": null, "finish_reason": "length"}]}')
VLLM_LAST_TOKEN = (b'{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" end"},'
                   b'"finish_reason":"stop"}]}')


@pytest.mark.parametrize(("end", "tokens"), [(LLAMACPP_CHAT_END, 3), (LLAMACPP_TEXT_END, 3), (VLLM_LAST_TOKEN, 4)])
def test_a_closing_chunk_with_no_content_is_not_a_token(end: bytes, tokens: int) -> None:
    token = b'{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}'
    raw = b"".join(b"data: " + e + b"\n\n" for e in (token, token, token, end)) + b"data: [DONE]\n\n"
    r = SSERelay()
    relay_all(r, [raw])
    assert r.done and r.content_events == tokens


@pytest.mark.parametrize(("end", "tokens"), [
    # the usual token chunk, with blanks around the colon: a token
    (b'{"choices":[{"index":0,"delta":{"content":"y"},"finish_reason" : null}]}', 4),
    # two choices, the last closing with an empty delta but the first still open: tokens
    (b'{"choices":[{"index":0,"delta":{},"finish_reason":null},{"index":1,"delta":{},"finish_reason":"stop"}]}', 4),
    # two choices both closing with no content: not a token
    (b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop"},{"index":1,"delta":{},"finish_reason":"length"}]}',
     3),
    # no finish_reason at all: a token
    (b'{"choices":[{"index":0,"delta":{"content":"y"}}]}', 4),
])
def test_finish_reason_is_read_from_the_end_with_the_same_answer(end: bytes, tokens: int) -> None:
    """``_carries_no_token`` looks for the last ``finish_reason`` first; a null one anywhere still
    makes the chunk a token's, as the whole-payload search did."""
    token = b'{"id":"c","choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}'
    raw = b"".join(b"data: " + e + b"\n\n" for e in (token, token, token, end)) + b"data: [DONE]\n\n"
    r = SSERelay()
    relay_all(r, [raw])
    assert r.done and r.content_events == tokens


def test_events_of_one_read_go_out_at_once_in_order_and_a_partial_one_waits() -> None:
    """Every whole event of a read is returned by that read's ``feed`` (nothing waits for more
    data); only the unfinished tail is held, and a usage chunk split across reads is parsed."""
    events = STREAM.split(b"\n\n")[:-1]
    first, second = events[0] + b"\n\n", events[1] + b"\n\n"
    usage_event = events[3] + b"\n\n"
    r = SSERelay()
    assert r.feed(first) == first                              # the first event: out on its own read
    cut = len(usage_event) // 2
    assert r.feed(second + usage_event[:cut]) == second        # whole event out, half of the next held
    assert r.incomplete and r.usage is None
    assert r.feed(usage_event[cut:] + b"data: [DONE]\n\n") == usage_event + b"data: [DONE]\n\n"
    assert r.usage == Usage(3, 2) and r.done and not r.incomplete


@pytest.mark.parametrize("hide_usage", [False, True])
def test_one_event_per_read_relays_as_one_read_of_all(hide_usage: bool) -> None:
    """The one-event read (a node's usual write) has its own path in ``_relay``: fed event by
    event, a stream gives the same bytes, counts, usage and hidden usage chunk as fed at once."""
    raw = emulator_stream(5)
    whole = SSERelay(hide_usage=hide_usage)
    at_once = relay_all(whole, [raw])
    each = SSERelay(hide_usage=hide_usage)
    one_by_one = relay_all(each, [e + b"\n\n" for e in raw.split(b"\n\n")[:-1]])
    assert one_by_one == at_once and (b'"choices":[]' in one_by_one) is not hide_usage
    assert (each.done, each.usage, each.content_events) == (whole.done, whole.usage, whole.content_events) \
        == (True, Usage(3, 5), 5)


def test_a_bad_event_alone_in_its_read_leaves_nothing_unsent() -> None:
    r = SSERelay()
    for ev in emulator_stream(5, malformed_at=2).split(b"\n\n")[:-1]:
        try:
            r.feed(ev + b"\n\n")
        except UpstreamProtocolError:
            break
    else:
        raise AssertionError("the malformed event must be refused")
    assert r.unsent == b"" and r.content_events == 2
    with pytest.raises(UpstreamProtocolError, match="over 8 bytes"):
        SSERelay(max_event_bytes=8).feed(b'data: {"a": 1}\n\n')
