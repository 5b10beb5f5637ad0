"""inferlb/jsoncodec.py: orjson's output means what the standard library's did, and whatever
encoded or decoded before still does (the fallback)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from inferlb.jsoncodec import dumps, loads

DOCS: list[Any] = [
    {"model": "m", "messages": [{"role": "user", "content": "héllo ✓ 😀"}], "max_tokens": 32, "stream": True},
    {"nested": {"a": [1, 2.5, -3e-7, None, True, False, ""]}, "k": 1e300},
    [], {}, "text", 0, 12345678901234567890123,            # an int beyond 64 bits: the fallback writes it
    {1: "int key", "s": "str key"},
]


@pytest.mark.parametrize("doc", DOCS)
def test_dumps_is_compact_json_that_means_the_same(doc: Any) -> None:
    out = dumps(doc)
    assert isinstance(out, bytes)
    assert json.loads(out) == json.loads(json.dumps(doc))
    assert b", " not in out and b": " not in out   # compact


def test_a_lone_surrogate_falls_back_to_ascii_escapes() -> None:
    out = dumps({"t": "a\ud800b"})
    assert out == b'{"t":"a\\ud800b"}'
    assert json.loads(out) == {"t": "a\ud800b"}


def test_default_is_applied_by_either_encoder() -> None:
    class Odd:
        def __str__(self) -> str:
            return "odd"

    assert json.loads(dumps({"x": Odd()}, default=str)) == {"x": "odd"}
    assert json.loads(dumps({"x": Odd(), "big": 2**70}, default=str)) == {"x": "odd", "big": 2**70}
    with pytest.raises(TypeError):
        dumps({"x": Odd()})


def test_non_finite_floats_become_null() -> None:
    assert json.loads(dumps({"a": math.nan, "b": math.inf})) == {"a": None, "b": None}


@pytest.mark.parametrize("raw", [b'{"a": 1, "a": 2}', b'{"n": NaN}', b'{"i": Infinity}',
                                 b'{"big": 123456789012345678901234}', '{"t": "é"}', b'[1, 2]',
                                 memoryview(b'{"m": 1}')])
def test_loads_decodes_what_the_standard_library_decodes(raw: Any) -> None:
    want = json.loads(bytes(raw) if isinstance(raw, memoryview) else raw)
    got = loads(raw)
    if isinstance(want, dict) and "n" in want:
        assert math.isnan(got["n"])
    else:
        assert got == want


@pytest.mark.parametrize("raw", [b"", b"{", b'{"a":}', b"\xff\xfe", "nope"])
def test_loads_rejects_what_the_standard_library_rejects(raw: Any) -> None:
    with pytest.raises(ValueError):
        loads(raw)
