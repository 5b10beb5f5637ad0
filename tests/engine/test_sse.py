"""The incremental SSE decoder and the cheap usage / error extraction (pure, no I/O)."""

from __future__ import annotations

import json

import pytest

from inferlb.engine.errors import UpstreamProtocolError
from inferlb.engine.sse import (
    SSEDecoder,
    StreamScanner,
    Usage,
    check_payload,
    extract_error,
    extract_usage,
)
from inferlb.simulator.openai_format import ChunkTemplate, completion_body

STREAM = (
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"a"}}],"usage":null}\n\n'
    b': keep-alive comment\n\n'
    b'event: message\nid: 7\nretry: 100\n'
    b'data: {"id":"c1","choices":[{"index":0,"delta":{"content":"b"}}],"usage":null}\n\n'
    b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
    b"data: [DONE]\n\n"
)


def feed_all(decoder: SSEDecoder, chunks: list[bytes]) -> list[bytes]:
    out: list[bytes] = []
    for c in chunks:
        out.extend(decoder.feed(c))
    out.extend(decoder.close())
    return out


def test_any_chunking_gives_the_same_payloads() -> None:
    whole = feed_all(SSEDecoder(), [STREAM])
    assert len(whole) == 4 and whole[-1] == b"[DONE]"
    assert json.loads(whole[0])["choices"][0]["delta"]["content"] == "a"
    bytewise = feed_all(SSEDecoder(), [STREAM[i:i + 1] for i in range(len(STREAM))])
    assert bytewise == whole
    for size in (2, 3, 7, 64):
        assert feed_all(SSEDecoder(), [STREAM[i:i + size] for i in range(0, len(STREAM), size)]) == whole


@pytest.mark.parametrize("eol", [b"\r\n", b"\r", b"\n"])
def test_line_endings(eol: bytes) -> None:
    raw = STREAM.replace(b"\n", eol)
    whole = feed_all(SSEDecoder(), [raw])
    bytewise = feed_all(SSEDecoder(), [raw[i:i + 1] for i in range(len(raw))])
    assert whole == bytewise == feed_all(SSEDecoder(), [STREAM])


def test_crlf_split_across_chunks_is_one_line_end() -> None:
    d = SSEDecoder()
    assert d.feed(b"data: x\r") == []
    assert d.feed(b"\n\r") == []
    assert d.feed(b"\n") == [b"x"]


def test_multiline_data_and_no_space() -> None:
    assert feed_all(SSEDecoder(), [b"data:one\ndata: two\n\n"]) == [b"one\ntwo"]


def test_unfinished_event_is_dropped_and_reported() -> None:
    d = SSEDecoder()
    assert d.feed(b'data: {"a":1}\n\ndata: {"b"') == [b'{"a":1}']
    assert d.pending
    assert d.close() == []
    assert not d.pending


def test_line_without_field_is_a_protocol_error() -> None:
    with pytest.raises(UpstreamProtocolError, match="malformed SSE line"):
        SSEDecoder().feed(b'{"id": 1}\n\n')


def test_event_size_is_bounded() -> None:
    d = SSEDecoder(max_event_bytes=100)
    with pytest.raises(UpstreamProtocolError, match="over 100 bytes"):
        d.feed(b"data: " + b"x" * 200)
    d = SSEDecoder(max_event_bytes=100)
    with pytest.raises(UpstreamProtocolError):
        for _ in range(20):
            d.feed(b"data: " + b"x" * 20 + b"\n")  # many lines, one event


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


def test_scanner_counts_and_finds_usage() -> None:
    raw = emulator_stream(5)
    for strict in (False, True):
        s = StreamScanner(strict_json=strict)
        for i in range(0, len(raw), 13):
            s.feed(raw[i:i + 13])
        s.close()
        assert s.done and s.complete
        assert s.events == 1 + 5 + 1 + 1  # role, tokens, finish, usage
        assert s.usage == Usage(3, 5)


def test_scanner_rejects_malformed_json() -> None:
    with pytest.raises(UpstreamProtocolError):
        StreamScanner().feed(emulator_stream(5, malformed_at=2))
    # A corruption in the middle passes the cheap check; strict mode parses and catches it.
    raw = b'data: {"choices": [}\n\n'
    StreamScanner().feed(raw)
    with pytest.raises(UpstreamProtocolError):
        StreamScanner(strict_json=True).feed(raw)


def test_scanner_error_event_and_data_after_done() -> None:
    s = StreamScanner()
    s.feed(b'data: {"error": {"message": "oom", "code": "internal_error"}}\n\n')
    assert s.error == {"message": "oom", "code": "internal_error"} and not s.complete
    s = StreamScanner()
    with pytest.raises(UpstreamProtocolError, match="after"):
        s.feed(b"data: [DONE]\n\ndata: {}\n\n")
