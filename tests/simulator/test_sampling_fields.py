"""The sampling fields a real server honours, answered by the emulator as vLLM answers them and read
back through the real openai SDK: ``n``, ``logprobs`` / ``top_logprobs``, completions ``echo`` and
``logprobs``, embeddings ``dimensions``; streamed and not."""

from __future__ import annotations

import base64
import math
import struct
from collections import defaultdict
from collections.abc import AsyncIterator

import openai
import pytest
from openai import AsyncOpenAI

from inferlb.simulator.emulator import SimFleet
from inferlb.simulator.spec import NodeSpec

MODEL = "m1"
TOKENS = ["tok0 ", "tok1 ", "tok2 "]


@pytest.fixture
async def client() -> AsyncIterator[AsyncOpenAI]:
    spec = NodeSpec(name="n1", models=[MODEL, "emb"], base_ttft_s=0.001, tpot_s=0.0005, default_output_tokens=3,
                    embedding_dim=64)
    async with SimFleet([spec]) as fleet, \
            AsyncOpenAI(base_url=fleet.url("n1") + "/v1", api_key="k", max_retries=0) as c:
        yield c


MSGS = [{"role": "user", "content": "hello"}]


async def test_chat_n_returns_n_indexed_choices(client: AsyncOpenAI) -> None:
    r = await client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=3, n=2)  # type: ignore[arg-type]
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.message.content == "".join(TOKENS) and c.finish_reason == "length" for c in r.choices)
    assert r.usage is not None and r.usage.completion_tokens == 6


async def test_chat_n_streamed_sends_every_choice(client: AsyncOpenAI) -> None:
    text: dict[int, str] = defaultdict(str)
    finish: dict[int, str | None] = {}
    usage = None
    stream = await client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=3, n=3,  # type: ignore[arg-type]
                                                  stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
        usage = chunk.usage or usage
    assert dict(text) == {0: "".join(TOKENS), 1: "".join(TOKENS), 2: "".join(TOKENS)}
    assert finish == {0: "length", 1: "length", 2: "length"}
    assert usage is not None and usage.completion_tokens == 9


async def test_chat_logprobs_have_the_token_logprob_top_logprobs_shape(client: AsyncOpenAI) -> None:
    r = await client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=3,  # type: ignore[arg-type]
                                             logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs
    assert lp is not None and lp.content is not None
    assert [e.token for e in lp.content] == TOKENS
    for e in lp.content:
        assert e.logprob < 0 and e.bytes == list(e.token.encode())
        assert len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == e.logprob > e.top_logprobs[1].logprob
    plain = await client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=3)  # type: ignore[arg-type]
    assert plain.choices[0].logprobs is None                 # not asked for: null, as before


async def test_chat_logprobs_streamed_one_entry_per_token(client: AsyncOpenAI) -> None:
    entries = []
    stream = await client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=3,  # type: ignore[arg-type]
                                                  logprobs=True, stream=True)
    async for chunk in stream:
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.content:
                entries += c.logprobs.content
    assert [e.token for e in entries] == TOKENS and all(e.top_logprobs == [] for e in entries)


async def test_completions_echo_prepends_the_prompt(client: AsyncOpenAI) -> None:
    r = await client.completions.create(model=MODEL, prompt="Say: ", max_tokens=3, echo=True, n=2)
    assert [(c.index, c.text) for c in r.choices] == [(0, "Say: " + "".join(TOKENS)), (1, "Say: " + "".join(TOKENS))]
    text = ""
    stream = await client.completions.create(model=MODEL, prompt="Say: ", max_tokens=3, echo=True, stream=True)
    async for chunk in stream:
        text += "".join(c.text for c in chunk.choices)
    assert text == "Say: " + "".join(TOKENS)
    plain = await client.completions.create(model=MODEL, prompt="Say: ", max_tokens=3)
    assert plain.choices[0].text == "".join(TOKENS)


async def test_completions_logprobs_shape_streamed_and_not(client: AsyncOpenAI) -> None:
    r = await client.completions.create(model=MODEL, prompt="Say: ", max_tokens=3, logprobs=2, echo=True)
    lp = r.choices[0].logprobs
    assert lp is not None
    assert lp.tokens == TOKENS and lp.token_logprobs is not None and all(v < 0 for v in lp.token_logprobs)
    assert lp.top_logprobs is not None
    assert all(len(t) == 2 and tok in t for t, tok in zip(lp.top_logprobs, TOKENS, strict=True))
    text = r.choices[0].text
    assert lp.text_offset is not None
    # the offsets point at the tokens, after the echoed prompt
    assert [text[o:o + len(t)] for o, t in zip(lp.text_offset, TOKENS, strict=True)] == TOKENS
    streamed: list[str] = []
    stream = await client.completions.create(model=MODEL, prompt="Say: ", max_tokens=3, logprobs=0, stream=True)
    async for chunk in stream:
        for c in chunk.choices:
            if c.logprobs is not None and c.logprobs.tokens:
                streamed += c.logprobs.tokens
                assert c.logprobs.top_logprobs is not None and len(c.logprobs.top_logprobs[0]) == 1
    assert streamed == TOKENS


async def test_embeddings_honour_dimensions(client: AsyncOpenAI) -> None:
    full = await client.embeddings.create(model="emb", input=["a", "b"])
    short = await client.embeddings.create(model="emb", input=["a", "b"], dimensions=8)
    b64 = await client.embeddings.create(model="emb", input="a", dimensions=8, encoding_format="base64")
    assert len(full.data[0].embedding) == 64
    assert [len(d.embedding) for d in short.data] == [8, 8]
    assert math.isclose(sum(v * v for v in short.data[0].embedding), 1.0, rel_tol=1e-6)
    ratio = short.data[0].embedding[0] / full.data[0].embedding[0]     # the same direction, truncated
    assert all(math.isclose(s, f * ratio, rel_tol=1e-6) for s, f in zip(short.data[0].embedding,
                                                                          full.data[0].embedding[:8], strict=True))
    raw = base64.b64decode(str(b64.data[0].embedding))   # asked for explicitly, the SDK leaves it encoded
    assert list(struct.unpack("<8f", raw)) == pytest.approx(short.data[0].embedding, rel=1e-6)


@pytest.mark.parametrize(("call", "param"), [
    ({"kind": "chat", "n": 0}, "n"),
    ({"kind": "chat", "logprobs": "yes"}, "logprobs"),
    ({"kind": "chat", "top_logprobs": 3}, "top_logprobs"),
    ({"kind": "chat", "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"kind": "completion", "logprobs": 99}, "logprobs"),
    ({"kind": "completion", "echo": True, "prompt": ["a", "b"]}, "echo"),
    ({"kind": "embedding", "dimensions": 65}, "dimensions"),
    ({"kind": "embedding", "dimensions": 0}, "dimensions"),
])
async def test_bad_sampling_fields_get_a_400_naming_the_field(client: AsyncOpenAI, call: dict[str, object],
                                                            param: str) -> None:
    kw = {k: v for k, v in call.items() if k != "kind"}
    with pytest.raises(openai.BadRequestError) as info:
        if call["kind"] == "chat":
            await client.chat.completions.create(model=MODEL, messages=MSGS, extra_body=kw)  # type: ignore[arg-type]
        elif call["kind"] == "completion":
            prompt = kw.pop("prompt", "x")
            await client.completions.create(model=MODEL, prompt=prompt, extra_body=kw)  # type: ignore[arg-type]
        else:
            await client.embeddings.create(model="emb", input="x", extra_body=kw)
    body = info.value.body
    assert isinstance(body, dict) and body.get("param") == param
