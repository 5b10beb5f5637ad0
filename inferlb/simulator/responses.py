"""A minimal OpenAI Responses API (``POST /v1/responses``), as vLLM serves it: text input, text
output, streamed (typed SSE events ending with ``response.completed``, no ``[DONE]``) or not.

Enough for a client (the OpenAI SDK's ``client.responses.create``) and the gateway's relay; tools,
reasoning items and stored responses are not emulated. Tokens are ``tok0 tok1 …`` like the other
endpoints; the first comes after the node's time to first token, then one every ``tpot_s``.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from aiohttp import web

from inferlb.simulator import openai_format as fmt
from inferlb.simulator.latency import LatencyModel

__all__ = ["prompt_tokens_of_input", "respond"]


def prompt_tokens_of_input(body: dict[str, Any]) -> int:
    """Estimated tokens of ``input`` (a string, or a list of messages / content parts)."""
    return fmt.prompt_tokens_of({"messages": _messages(body.get("input"))}, "chat")


def _messages(value: Any) -> list[dict[str, Any]]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list):
        return [m for m in value if isinstance(m, dict)]
    return []


def _response(rid: str, model: str, created: int, text: str, status: str,
              usage: dict[str, int] | None) -> dict[str, Any]:
    output = [] if status == "in_progress" else [{
        "type": "message", "id": "msg_" + rid[5:], "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }]
    return {"id": rid, "object": "response", "created_at": created, "status": status, "model": model,
            "output": output, "parallel_tool_calls": False, "tool_choice": "auto", "tools": [],
            "error": None, "incomplete_details": None, "usage": usage}


async def respond(request: web.Request, body: dict[str, Any], *, model: str, n: int, latency: LatencyModel,
                  created: int) -> web.StreamResponse:
    """Answer a validated Responses request with ``n`` output tokens."""
    prompt = prompt_tokens_of_input(body)
    rid = "resp_" + uuid.uuid4().hex
    text = "".join(fmt.token_text(i) for i in range(n))
    usage = {"input_tokens": prompt, "output_tokens": n, "total_tokens": prompt + n}
    await asyncio.sleep(latency.ttft_s(prompt))
    if body.get("stream") is not True:
        await asyncio.sleep(max(0, n - 1) * latency.tpot_s)
        done = _response(rid, model, created, text, "completed", usage)
        return web.Response(status=200, body=fmt.dumps(done), content_type="application/json")
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream",
                                                   "Cache-Control": "no-cache"})
    await resp.prepare(request)
    seq = 0

    async def event(kind: str, data: dict[str, Any]) -> None:
        nonlocal seq
        await resp.write(b"event: " + kind.encode() + b"\n" + fmt.sse({"type": kind, "sequence_number": seq, **data}))
        seq += 1

    await event("response.created", {"response": _response(rid, model, created, "", "in_progress", None)})
    for i in range(n):
        if i:
            await asyncio.sleep(latency.tpot_s)
        await event("response.output_text.delta", {"item_id": "msg_" + rid[5:], "output_index": 0,
                                                   "content_index": 0, "delta": fmt.token_text(i)})
    await event("response.completed", {"response": _response(rid, model, created, text, "completed", usage)})
    await resp.write_eof()
    return resp
