"""inferlb in front of a real LLM: llama.cpp (llama-cpp-python's server) serving SmolLM2-135M-Instruct
on the CPU, two servers as separate processes, ``inferlb serve`` as a third, the OpenAI SDK as the
client, real HTTP between all of them (marker ``real_engine``; CI requires it: INFERLB_REQUIRE_ENGINE=1
makes a missing engine a failure, tests/support.py need_real_engine).

What each test pins is what the real server does, which the emulator had wrong or never did:
usage only in non-streamed answers, a finish-only closing chunk, a chat template's fixed prompt
tokens, its own 400 for a context overflow, a lock that a /v1/models probe would wait on. Timings
are never asserted (the CPU is shared): the learned speeds are checked against the same stream
as the client saw it, and the saturation comparison is benchmarks/real_engine.py's.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from inferlb.modelserver.llamacpp import LlamaServer
from tests.support import ROOT, free_port, need_real_engine

pytestmark = pytest.mark.real_engine

MODEL, ALIAS = "smol", "smollm2"
STORY = [{"role": "user", "content": "Tell me a story about a dragon who lives in a lighthouse."}]
GUARD_S = 90.0   # bound on every wait for a process or a state (never a duration asserted)


@dataclass
class Stack:
    servers: dict[str, LlamaServer]
    base: str          # the gateway's public listener
    admin: str         # its admin listener (loopback, no key)
    log: Path

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key="unused", max_retries=0, timeout=GUARD_S)

    def fleet(self) -> dict[str, dict[str, Any]]:
        r = httpx.get(self.admin + "/admin/fleet", timeout=10)
        assert r.status_code == 200, r.text
        return {n["name"]: n for n in r.json()["nodes"]}

    def audit(self, rid: str) -> dict[str, Any]:
        """The request's audit row once it is written (bounded)."""
        def row() -> dict[str, Any] | None:
            r = httpx.get(f"{self.admin}/audit/requests/{rid}", timeout=10)
            return r.json() if r.status_code == 200 else None
        return until(f"audit row {rid}", row)


def until(what: str, probe: Callable[[], Any]) -> Any:
    """Poll ``probe`` until it returns something truthy; fails after GUARD_S."""
    end = time.monotonic() + GUARD_S
    while True:
        got = probe()
        if got:
            return got
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.1)   # waiting on another process's state, bounded by GUARD_S


def fleet_file(path: Path, servers: dict[str, LlamaServer]) -> Path:
    def model(name: str) -> dict[str, Any]:
        # The context is the gateway's view (8,192); the servers hold 2,048, so the engine's own
        # context check is the one a long prompt meets.
        return {"name": name, "upstream_name": ALIAS, "max_context_tokens": 8192, "default_max_tokens": 16,
                "max_output_tokens": 512}

    path.write_text(yaml.safe_dump({
        # "smol-cal": the same servers under a second name, whose token estimate starts untrained.
        "models": [model(MODEL), model("smol-cal")],
        "nodes": [{"name": n, "url": s.url, "models": [MODEL, "smol-cal"], "kind": "llamacpp-python"}
                  for n, s in servers.items()],
        "routing": {"profile": "token-aware", "seed": 1},
        "timeouts": {"connect_s": 2.0, "first_token_s": 60.0, "idle_s": 30.0, "total_s": 120.0},
        "health": {"interval_s": 0.5, "slow_start": {"window_s": 60.0}},
    }))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    need_real_engine()
    tmp = tmp_path_factory.mktemp("real-engine")
    servers = {n: LlamaServer(port=free_port(), alias=ALIAS, n_ctx=2048, threads=1, log_path=tmp / f"{n}.log")
               for n in ("n0", "n1")}
    port, admin_port = free_port(), free_port()
    log = tmp / "gateway.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "INFERLB_DATABASE_URL": f"sqlite:///{tmp / 'audit.db'}", "INFERLB_JOURNAL_DIR": str(tmp / "journal"),
           "INFERLB_ADMIN_PORT": str(admin_port), "INFERLB_AUDIT_FLUSH_INTERVAL_S": "0.05"}
    gateway: subprocess.Popen[bytes] | None = None
    try:
        for s in servers.values():
            s.start(timeout_s=GUARD_S)
        with log.open("wb") as out:
            fleet = fleet_file(tmp / "fleet.yaml", servers)
            gateway = subprocess.Popen(
                [sys.executable, "-m", "inferlb.cli.main", "serve", "--config", str(fleet), "--port", str(port)],
                cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT)
        st = Stack(servers, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{admin_port}", log)

        def ready() -> bool:
            assert gateway is not None and gateway.poll() is None, log.read_text()
            with contextlib.suppress(httpx.TransportError):
                return httpx.get(st.base + "/readyz", timeout=2).status_code == 200
            return False
        until("gateway ready", ready)
        until("both nodes healthy", lambda: all(n["state"] == "healthy" for n in st.fleet().values()))
        yield st
    finally:
        if gateway is not None and gateway.poll() is None:
            gateway.terminate()
            try:
                gateway.wait(timeout=15)
            except subprocess.TimeoutExpired:
                gateway.kill()
        for s in servers.values():
            s.stop()


def direct(server: LlamaServer, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The same request straight to the engine (its own word on token counts)."""
    r = httpx.post(server.url + path, json={**body, "model": ALIAS}, timeout=GUARD_S)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def test_chat_and_completions_streamed_and_not_carry_real_text_and_the_engines_counts(stack: Stack) -> None:
    c = stack.client()
    # Non-streamed: the audit row holds the engine's own usage, equal to what it tells a direct caller.
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=STORY, max_tokens=8, temperature=0)
    chat = raw.parse()
    text = chat.choices[0].message.content or ""
    assert len(text.split()) >= 2 and chat.choices[0].finish_reason == "length"
    row = stack.audit(raw.headers["x-request-id"])
    mine = direct(stack.servers["n0"], "/v1/chat/completions", {"messages": STORY, "max_tokens": 8, "temperature": 0})
    assert chat.usage is not None
    assert (row["prompt_tokens"], row["completion_tokens"]) == (chat.usage.prompt_tokens, 8)
    assert row["prompt_tokens"] == mine["usage"]["prompt_tokens"] and mine["usage"]["completion_tokens"] == 8
    assert row["status"] == "ok" and row["node"] in stack.servers

    raw = c.completions.with_raw_response.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
    comp = raw.parse()
    assert comp.choices[0].text.strip() and comp.usage is not None
    row = stack.audit(raw.headers["x-request-id"])
    mine = direct(stack.servers["n1"], "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8,
                                                             "temperature": 0})
    assert (row["prompt_tokens"], row["completion_tokens"]) == (mine["usage"]["prompt_tokens"], 8)

    # Streamed: the engine sends no usage (even when asked), so the gateway counts the tokens it
    # relayed; its closing chunk names only the finish_reason and is not one of them.
    for kind in ("chat", "completions"):
        if kind == "chat":
            sraw = c.chat.completions.with_raw_response.create(
                model=MODEL, messages=STORY, max_tokens=8, temperature=0, stream=True,
                stream_options={"include_usage": True})
            chunks = list(sraw.parse())
            pieces = [ch.choices[0].delta.content for ch in chunks if ch.choices and ch.choices[0].delta.content]
        else:
            sraw = c.completions.with_raw_response.create(model=MODEL, prompt="Once upon a time", max_tokens=8,
                                                          temperature=0, stream=True)
            chunks = list(sraw.parse())
            pieces = [ch.choices[0].text for ch in chunks if ch.choices and ch.choices[0].text]
        assert "".join(pieces).strip(), kind
        assert all(ch.usage is None for ch in chunks), "llama-cpp-python began to send usage in streams"
        row = stack.audit(sraw.headers["x-request-id"])
        assert row["status"] == "ok" and row["stream"] is True
        assert row["completion_tokens"] == len(pieces) == 8, kind
        assert row["prompt_tokens"] is None and row["prompt_tokens_est"] >= 1   # no usage: estimated only


def _words(n: int, seed: int) -> str:
    vocab = ("the", "river", "carries", "light", "past", "quiet", "stones", "while", "engineers", "measure",
             "tokens", "and", "latency", "across", "a", "fleet", "of", "patient", "servers")
    return " ".join(vocab[(seed * 7 + i * 3) % len(vocab)] for i in range(n))


def test_the_prompt_token_estimate_converges_on_the_real_tokenizer(stack: Stack) -> None:
    # Short and long chat prompts in turn: a server's template adds ~30 tokens to each, so only a
    # fitted line (engine/tokens.py) can be right for both. Estimated before the answer, counted by it.
    c = stack.client()
    errors: list[float] = []
    for i, n in enumerate([1, 300, 4, 120, 2, 600, 10, 40, 1, 300, 4, 120, 2, 600]):
        raw = c.chat.completions.with_raw_response.create(
            model="smol-cal", messages=[{"role": "user", "content": _words(n, i)}], max_tokens=1)
        raw.parse()
        row = stack.audit(raw.headers["x-request-id"])
        errors.append(abs(row["prompt_tokens_est"] - row["prompt_tokens"]) / row["prompt_tokens"])
    before, after = sum(errors[:2]) / 2, sum(errors[-4:]) / 4
    print(f"prompt-token estimate error: first two {before:.1%}, last four {after:.1%}, all {errors}")
    assert before > 0.5          # untrained: 4 bytes a token, no template
    assert after < 0.10          # trained on 10 answers of the same server


def test_learned_decode_speed_and_first_token_times_come_from_the_real_streams(stack: Stack) -> None:
    # Each stream a node serves moves its learned decode speed (an EWMA of the speeds the gateway
    # measured on its streams): learned from these real timings, not a prior. No speed is compared
    # with a wall-clock figure: on a shared machine both sides move together, by any factor.
    c = stack.client()
    before = {n: v["tokens_per_s"] for n, v in stack.fleet().items()}
    served: set[str] = set()
    for _ in range(6):
        raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=STORY, max_tokens=24, stream=True)
        pieces = [ch for ch in raw.parse() if ch.choices and ch.choices[0].delta.content]
        if len(pieces) > 2:
            served.add(stack.audit(raw.headers["x-request-id"])["node"])
    nodes = stack.fleet()
    assert served
    rows = httpx.get(stack.admin + "/audit/requests", params={"limit": 500}, timeout=10).json()["data"]
    for name in served:
        learned = nodes[name]["tokens_per_s"]
        assert learned is not None and learned > 0 and learned != before[name], (name, before[name], learned)
        # The node's time to first token (an average of its streams' first bytes, each timed from
        # the attempt's start): never more than the longest the audit trail holds for that node's
        # streams, each timed from the gateway's receipt (so no less).
        ttft = nodes[name]["ttft_s"]
        seen_ms = [r["ttft_ms"] for r in rows if r["node"] == name and r["stream"] and r["ttft_ms"] is not None]
        assert ttft is not None and 0 < ttft * 1000 <= max(seen_ms), (name, ttft, seen_ms)


def test_the_engines_own_errors_reach_the_client_as_it_said_them_and_are_not_retried(stack: Stack) -> None:
    # 3,000 words fit the gateway's 8,192-token view but not the servers' 2,048: llama.cpp's own 400.
    c = stack.client()
    with pytest.raises(openai.BadRequestError) as info:
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hello " * 3000}],
                                  max_tokens=8)
    err = info.value
    assert err.status_code == 400 and err.code == "context_length_exceeded"
    assert "2048" in err.message and err.param == "messages"
    row = stack.audit(err.response.headers["x-request-id"])
    assert row["status"] == "upstream_rejected" and row["attempt_count"] == 1   # a client error: no retry
    assert all(n["state"] == "healthy" for n in stack.fleet().values())       # and nobody's fault


def test_a_server_killed_mid_stream_is_one_error_event_then_ejected_then_rejoins_through_slow_start(
        stack: Stack) -> None:
    c = stack.client()
    raw = c.chat.completions.with_raw_response.create(model=MODEL, messages=STORY, max_tokens=400, stream=True)
    rid = raw.headers["x-request-id"]
    it = iter(raw.parse())
    got = [next(it) for _ in range(3)]
    busy = [n for n, v in stack.fleet().items() if v["inflight_requests"] > 0]
    assert len(busy) == 1 and got
    victim, other = busy[0], next(n for n in stack.servers if n != busy[0])
    stack.servers[victim].kill()
    with pytest.raises(openai.APIError):   # the SDK raises on the stream's error event
        for _ in it:
            pass
    row = stack.audit(rid)
    assert row["status"] == "upstream_error_midstream" and row["node"] == victim
    assert row["completion_tokens"] >= 2 and row["attempt_count"] == 1   # no retry after the first byte

    until(f"{victim} out of rotation", lambda: stack.fleet()[victim]["state"] in ("down", "ejected"))
    for _ in range(3):   # traffic moves
        raw2 = c.chat.completions.with_raw_response.create(model=MODEL, messages=STORY, max_tokens=2)
        raw2.parse()
        assert stack.audit(raw2.headers["x-request-id"])["node"] == other

    stack.servers[victim].start(timeout_s=GUARD_S)   # the same port: it comes back
    back = until(f"{victim} back", lambda: (v := stack.fleet()[victim])["state"] == "healthy" and v)
    assert back["slow_start_factor"] is not None and back["slow_start_factor"] < 1.0


def test_inferlb_demo_with_the_real_model_answers_through_the_gateway(tmp_path: Path) -> None:
    need_real_engine()
    port, admin_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "INFERLB_ADMIN_PORT": str(admin_port)}
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "inferlb.cli.main", "demo", "--model-server", "llamacpp",
                                 "--port", str(port)], cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        def banner() -> bool:
            assert proc.poll() is None, log.read_text()
            return "inferlb demo is ready" in log.read_text()
        until("the demo's banner", banner)
        text = log.read_text()
        assert "llama.cpp nodes: http://127.0.0.1:" in text and "rollout start" not in text
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                               timeout=GUARD_S)
        answer = client.chat.completions.create(model="demo-llm", messages=[{"role": "user", "content": "Hello!"}],
                                                max_tokens=16)
        assert (answer.choices[0].message.content or "").strip() and answer.usage is not None
        assert answer.usage.completion_tokens >= 1
    finally:
        proc.send_signal(2)   # Ctrl-C: a normal stop that also stops its llama.cpp servers
        assert proc.wait(timeout=30) == 0, log.read_text()
