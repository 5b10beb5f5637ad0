"""Recorded load: a trace file (JSONL, CSV, or inferlb's own audit export) → a request plan.

Contract: :func:`load_trace` returns requests sorted by time, the first at ``t = 0``. Columns are
found by name, with the audit trail's names accepted as aliases, so a page saved from
``GET /audit/requests`` (``{"items": [...]}``) or its rows as JSONL replay as they are:

============== ==========================================================================
field          accepted names
============== ==========================================================================
time           ``timestamp``, ``t``, ``time``, ``received_at`` (seconds; epoch or offset)
prompt tokens  ``prompt_tokens``, ``input_tokens``, ``prompt_tokens_est``
output tokens  ``output_tokens``, ``completion_tokens``
tenant         ``tenant``
priority       ``priority``
model          ``model``, ``model_requested``
stream         ``stream`` (true/false/1/0; default: the caller's choice)
============== ==========================================================================

Rows without token counts (a rejected request in the audit trail) are skipped and counted.
``time_scale`` > 1 replays faster (2: twice the rate); ``rate`` rescales time to that mean rate.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from inferlb.bench.loadgen.workload import PlannedRequest

__all__ = ["TraceInfo", "load_trace", "parse_trace"]

_TIME = ("timestamp", "t", "time", "received_at")
_PROMPT = ("prompt_tokens", "input_tokens", "prompt_tokens_est")
_OUTPUT = ("output_tokens", "completion_tokens")
_MODEL = ("model", "model_requested")


class TraceInfo:
    """What loading a trace found: rows read, rows skipped (and why)."""

    def __init__(self) -> None:
        self.rows = 0
        self.skipped: dict[str, int] = {}

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1


def _first(row: Mapping[str, Any], names: tuple[str, ...]) -> Any:
    for n in names:
        v = row.get(n)
        if v is not None and v != "":
            return v
    return None


def _bool(v: Any) -> bool | None:
    if v is None or v == "":
        return None
    if isinstance(v, bool):
        return v
    return str(v).strip().lower() in ("1", "true", "yes")


def _rows(text: str, suffix: str) -> Iterable[Mapping[str, Any]]:
    stripped = text.lstrip()
    if suffix == ".csv":
        yield from csv.DictReader(io.StringIO(text))
        return
    if stripped.startswith("[") or (stripped.startswith("{") and '"items"' in stripped[:200]):
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None
        if isinstance(doc, list):
            yield from (r for r in doc if isinstance(r, dict))
            return
        if isinstance(doc, dict) and isinstance(doc.get("items"), list):
            yield from (r for r in doc["items"] if isinstance(r, dict))
            return
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"line {i}: not JSON ({exc})") from exc
        if isinstance(obj, dict):
            yield obj


def parse_trace(text: str, *, suffix: str = ".jsonl", stream: bool = True, model: str | None = None,
                time_scale: float = 1.0, rate: float | None = None, limit: int | None = None,
                info: TraceInfo | None = None) -> list[PlannedRequest]:
    """Parse trace text (see the module docstring); ``model`` replaces the trace's models."""
    if time_scale <= 0:
        raise ValueError("time_scale must be > 0")
    info = info or TraceInfo()
    raw: list[tuple[float, PlannedRequest]] = []
    for row in _rows(text, suffix):
        info.rows += 1
        t, p, o = _first(row, _TIME), _first(row, _PROMPT), _first(row, _OUTPUT)
        if t is None:
            info.skip("no time")
            continue
        if p is None or o is None:
            info.skip("no token counts")
            continue
        try:
            tf, pi, oi = float(t), int(float(p)), int(float(o))
        except (TypeError, ValueError):
            info.skip("not a number")
            continue
        if oi < 1:
            info.skip("no output tokens")
            continue
        s = _bool(row.get("stream"))
        raw.append((tf, PlannedRequest(
            t=0.0, prompt_tokens=max(1, pi), output_tokens=oi, tenant=_first(row, ("tenant",)),
            priority=_first(row, ("priority",)), model=model or _first(row, _MODEL),
            stream=stream if s is None else s)))
    raw.sort(key=lambda x: x[0])
    if limit is not None:
        raw = raw[:limit]
    if not raw:
        return []
    t0 = raw[0][0]
    span = raw[-1][0] - t0
    scale = 1.0 / time_scale
    if rate is not None and span > 0 and len(raw) > 1:
        scale = (len(raw) / rate) / span
    return [PlannedRequest(t=(tt - t0) * scale, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
                           tenant=r.tenant, priority=r.priority, model=r.model, stream=r.stream) for tt, r in raw]


def load_trace(path: Path, **kw: Any) -> list[PlannedRequest]:
    """Read and parse a trace file; ``ValueError`` names the file and the problem."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror})") from exc
    try:
        return parse_trace(text, suffix=path.suffix.lower(), **kw)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
