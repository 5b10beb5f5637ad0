"""Multi-turn chat sessions for the load generator: the plan (:func:`plan_sessions`), the same
sessions for a closed-loop run in the discrete-event simulator (:func:`session_plan`: each turn
leaves a seeded think time after the previous answer ended, :class:`~inferlb.simulator.des.closed.ClosedLoop`)
and the messages of one turn (:func:`chat_messages`).

Contract: pure and deterministic like :func:`.workload.plan`: the same workload, seed, rate and
duration give the same requests. Sessions start as a Poisson process at ``rate / mean turns`` (so
requests arrive at about ``rate``); a session's turns follow each other after exponential
``think_s`` gaps whatever happened to the previous answer (open loop). Texts are slices of one
seeded pool of words, chosen by a hash of (session, turn, role): equal keys give equal texts (a
system prompt is the same text in every session that uses it), different keys different ones,
and a system or user message of *N* tokens is *4N* bytes of text, as everywhere in the load
generator. An assistant turn resent in the history is the text an emulated node answers with for
the planned length (simulator/openai_format.py ``answer_text``: ``tok0 tok1 …``), so what the
client resends is what the node generated when the turn was answered in full (the load
generator checks that count), and the node's prefix cache, which keeps a finished answer's
blocks, can hit it; a turn sent before the previous answer arrived (open loop) or after it failed
resends that text all the same, which only a node that did generate it holds. That text is
longer than 4 bytes a token (5-7), and a turn's ``prompt_tokens`` counts it as the emulator and
the gateway do (bytes ÷ 4, rounded up, over all the messages). A real server answers with other
text, so against one the resent answers never match its cache (only the system prompt and the
earlier prompts do).
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Iterator
from typing import Any

from inferlb.bench.loadgen.workload import ChatTurn, PlannedRequest, Sessions, Workload, _pick, declared_max_tokens
from inferlb.simulator.des.closed import Session
from inferlb.simulator.latency import estimate_tokens
from inferlb.simulator.openai_format import answer_text

__all__ = ["chat_messages", "plan_sessions", "prompt_text", "session_plan", "text_for"]

_POOL_CHARS = 1 << 21      # 2 MiB of words: the longest prompt slice fits many times over
_WORDS = ("gateway", "token", "cache", "route", "node", "prefix", "model", "batch", "queue", "stream",
          "latency", "session", "prompt", "answer", "system", "kernel", "tensor", "decode", "prefill",
          "sample", "policy", "health", "budget", "replica", "shard", "vector", "weight", "layer")


@functools.cache
def _pool() -> str:
    rng = random.Random("inferlb-sessions-pool")
    parts: list[str] = []
    n = 0
    while n < _POOL_CHARS:   # bounded by the pool size
        w = rng.choice(_WORDS)
        parts.append(w)
        n += len(w) + 1
    return " ".join(parts)[:_POOL_CHARS]


def text_for(key: str, tokens: int) -> str:
    """``4 × tokens`` characters of pool text, the same for the same ``key``."""
    pool = _pool()
    size = min(4 * max(0, tokens), len(pool))
    h = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    at = h % (len(pool) - size + 1)
    return pool[at:at + size]


def chat_messages(turn: ChatTurn) -> list[dict[str, Any]]:
    """The messages of ``turn``: system prompt, the history, the new user message."""
    msgs: list[dict[str, Any]] = [{"role": "system", "content": text_for(f"system-{turn.system}", turn.system_tokens)}]
    last = len(turn.turns) - 1
    for j, (user, assistant) in enumerate(turn.turns):
        msgs.append({"role": "user", "content": text_for(f"{turn.session}-u{j}", user)})
        if j < last:
            msgs.append({"role": "assistant", "content": answer_text(assistant)})
    return msgs


def prompt_text(turn: ChatTurn) -> str:
    """The prompt text of ``turn`` as the gateway's validator joins it (message texts joined with
    newlines, api/validation.py) and the emulator's prefix cache reads it
    (simulator/openai_format.py ``prompt_text_of``): what the discrete-event simulator hashes."""
    return "\n".join(str(m["content"]) for m in chat_messages(turn))


def _mean_turns(s: Sessions, seed: int) -> float:
    rng = random.Random(f"{seed}:turns-mean")
    return sum(s.turns.sample(rng) for _ in range(2000)) / 2000


def _sessions(w: Workload, s: Sessions, *, seed: int, rate: float, duration_s: float,
              think_s: float) -> Iterator[tuple[float, list[PlannedRequest], list[float]]]:
    """Each session that starts within ``duration_s``, in start order: (start, every turn with its
    open-loop send time, the think time drawn after each turn, mean ``think_s``)."""
    starts = random.Random(f"{seed}:sessions")
    think = random.Random(f"{seed}:think")
    shapes = random.Random(f"{seed}:shapes")
    declares = random.Random(f"{seed}:max_tokens")
    system_tokens = [s.system_tokens.sample(shapes) for _ in range(s.system_prompts)]
    session_rate = rate / max(1.0, _mean_turns(s, seed))
    t = 0.0
    k = 0
    while True:   # bounded by the duration (a session starts after a positive gap)
        t += starts.expovariate(session_rate)
        if t >= duration_s:
            return
        k += 1
        sid = f"chat-{seed}-{k}"
        system = shapes.randrange(s.system_prompts)
        n = s.turns.sample(shapes)
        tenant, priority = _pick(shapes, w.tenants), _pick(shapes, w.priorities)
        stream = shapes.random() < w.stream
        turns: list[tuple[int, int]] = []
        asked = system_tokens[system]     # system and user messages: 4 bytes a token
        answered = 0                      # bytes of the resent answers
        at = t
        reqs: list[PlannedRequest] = []
        thinks: list[float] = []
        for _ in range(n):
            user, answer = s.user_tokens.sample(shapes), w.output_tokens.sample(shapes)
            declared = declared_max_tokens(w, answer, declares)
            answer = answer if declared is None else min(answer, declared)   # the history holds what was answered
            turns.append((user, answer))
            asked += user
            reqs.append(PlannedRequest(
                t=at, prompt_tokens=estimate_tokens(4 * asked + answered), output_tokens=answer,
                tenant=tenant, priority=priority, model=w.model, stream=stream,
                max_tokens=declared, chat=ChatTurn(sid, system, system_tokens[system], tuple(turns), s.send_session)))
            answered += len(answer_text(answer))
            gap = think.expovariate(1.0 / think_s)
            thinks.append(gap)
            at += gap
        yield t, reqs, thinks


def plan_sessions(w: Workload, s: Sessions, *, seed: int, rate: float, duration_s: float,
                  max_requests: int) -> list[PlannedRequest]:
    """The turns of the sessions that start within ``duration_s``, sent before it ends, by time
    (open loop: a turn leaves ``think_s`` after the previous one was *sent*)."""
    out: list[PlannedRequest] = []
    for _, reqs, _ in _sessions(w, s, seed=seed, rate=rate, duration_s=duration_s, think_s=s.think_s):
        if len(out) >= max_requests:
            break
        out.extend(r for r in reqs if r.t < duration_s)
    out.sort(key=lambda p: p.t)
    return out[:max_requests]


def session_plan(w: Workload, *, seed: int, rate: float, duration_s: float,
                 think_s: float | None = None) -> list[Session]:
    """The sessions of ``w`` for a closed-loop run (:class:`~inferlb.simulator.des.closed.ClosedLoop`):
    the same sessions, starts and turns as :func:`plan_sessions` for the same seed, rate and
    duration, every turn kept (the simulation cuts at its own ``stop_s``), and the think time
    after each answer drawn from the same seeded stream with mean ``think_s`` (default: the
    workload's), exponential. ``rate`` is in requests a second, as for the open-loop plan:
    sessions start at ``rate / mean turns``."""
    s = w.sessions
    if s is None:
        raise ValueError(f"workload {w.name!r} has no sessions")
    mean = s.think_s if think_s is None else think_s
    if not mean > 0:
        raise ValueError("think_s must be > 0")
    return [Session(start, reqs, thinks)
            for start, reqs, thinks in _sessions(w, s, seed=seed, rate=rate, duration_s=duration_s, think_s=mean)]
