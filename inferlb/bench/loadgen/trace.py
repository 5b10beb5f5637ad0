"""Recorded load: a trace file (JSONL, CSV, or inferlb's own audit export) → a request plan.

Contract: :func:`load_trace` returns requests sorted by time, the first at ``t = 0``. Columns are
found by name, with the audit trail's names accepted as aliases, so a page saved from
``GET /audit/requests`` (``{"data": [...], "next_cursor": ...}``), a JSON list of rows, or rows as
JSONL replay as they are:

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

Rows without token counts (a rejected request in the audit trail) are skipped and counted. What
cannot be a trace is a ``ValueError`` that says what was found, never an empty plan: a JSON document
of another shape, a JSONL line that is not an object, or rows of which none is a request.
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
    if suffix == ".csv":
        yield from csv.DictReader(io.StringIO(text))
        return
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            doc = json.loads(text)
        except ValueError:
            doc = None     # not one document: JSON lines, read below
        if doc is not None:
            yield from _document_rows(doc)
            return
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"line {i}: not JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise ValueError(f"line {i}: a JSON {type(obj).__name__}, not a row (an object)")
        yield obj


def _document_rows(doc: Any) -> list[Mapping[str, Any]]:
    """The rows of one JSON document: a list of rows, or a ``GET /audit/requests`` page."""
    rows = doc.get("data") if isinstance(doc, dict) else doc
    if isinstance(doc, dict) and not isinstance(rows, list):
        if "data" not in doc and not doc.keys() & {*_TIME, *_PROMPT, *_OUTPUT}:
            keys = ", ".join(sorted(map(str, doc))[:8]) or "none"
            raise ValueError(f"a JSON object without 'data' (keys: {keys}): expected a GET /audit/requests page "
                             "({\"data\": [...]}), a JSON list of rows, or JSON lines")
        if "data" in doc:
            raise ValueError(f"'data' is a JSON {type(rows).__name__}, not a list of rows")
        return [doc]   # one row, as JSON lines of one line
    if not isinstance(rows, list):
        raise ValueError(f"a JSON {type(doc).__name__}: expected a GET /audit/requests page, a list of rows, "
                         "or JSON lines")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise ValueError(f"row {bad}: a JSON {type(rows[bad]).__name__}, not a row (an object)")
    return rows


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
        mt = row.get("max_tokens")     # what the client declared, when the trace has it
        declared = int(mt) if isinstance(mt, (int, float)) and not isinstance(mt, bool) and mt >= 1 else None
        raw.append((tf, PlannedRequest(
            t=0.0, prompt_tokens=max(1, pi), output_tokens=oi, tenant=_first(row, ("tenant",)),
            priority=_first(row, ("priority",)), model=model or _first(row, _MODEL),
            stream=stream if s is None else s, max_tokens=declared)))
    raw.sort(key=lambda x: x[0])
    if limit is not None:
        raw = raw[:limit]
    if not raw:
        why = ", ".join(f"{k}: {v}" for k, v in sorted(info.skipped.items())) or "the trace is empty"
        raise ValueError(f"no request to replay: {info.rows} row(s) read ({why})")
    t0 = raw[0][0]
    span = raw[-1][0] - t0
    scale = 1.0 / time_scale
    if rate is not None and span > 0 and len(raw) > 1:
        scale = (len(raw) / rate) / span
    return [PlannedRequest(t=(tt - t0) * scale, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens,
                           tenant=r.tenant, priority=r.priority, model=r.model, stream=r.stream,
                           max_tokens=r.max_tokens) for tt, r in raw]


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
