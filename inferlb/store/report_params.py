"""Parameters of the audit and report queries: times, the window, filters, grouping, buckets, cursors.

Contract:

* Times in and out are epoch seconds (floats, µs precision); the time window is ``since``
  inclusive, ``until`` exclusive, on ``received_at``. :func:`parse_time` turns user input (epoch
  seconds, ISO-8601, or a look-back like ``15m`` / ``24h`` / ``7d``) into that.
* Bad values raise :class:`~inferlb.errors.InvalidRequest` naming the parameter, so the API
  answers 400.
* :func:`parse_group_by` and :func:`parse_bucket` validate those two parameters for every report
  (the SLA report of :mod:`.sla` and the cost report of :mod:`.ledger`); a window may hold at most
  :data:`MAX_BUCKETS`.
* The audit list's cursor (:mod:`.queries`) is an opaque url-safe token of the last row's position.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement

from inferlb.errors import InvalidRequest
from inferlb.store.schema import REQUESTS

__all__ = [
    "GROUP_BY",
    "MAX_BUCKETS",
    "bucket_of",
    "check_buckets",
    "group_columns",
    "parse_bucket",
    "parse_group_by",
    "parse_time",
    "time_window",
]

MAX_BUCKETS = 10_000
GROUP_BY = ("model", "version", "node", "tenant", "priority", "stream", "served")
_MAX_EPOCH = 253_402_300_800.0  # 10000-01-01: beyond what ISO-8601 can name
_MAX_FILTER_LEN = 512
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_time(value: str | float | None, *, param: str, now: float | None = None) -> float | None:
    """Epoch seconds from epoch seconds, ISO-8601 (naive means UTC) or ``<n>[smhdw]`` ago."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        text = value.strip()
        m = _DURATION.match(text)
        if m:
            base = time.time() if now is None else now
            t = base - float(m.group(1)) * _UNIT_S[m.group(2)]
        else:
            try:
                t = float(text)
            except ValueError:
                try:
                    dt = datetime.fromisoformat(text)
                except ValueError:
                    raise InvalidRequest(
                        f"'{param}' must be epoch seconds, ISO-8601 or a look-back like 24h",
                        param=param, code="invalid_time") from None
                t = (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
    else:
        t = float(value)
    if not math.isfinite(t) or not 0 <= t < _MAX_EPOCH:
        raise InvalidRequest(f"'{param}' is out of range", param=param, code="invalid_time")
    return t


def _check_window(since: float | None, until: float | None) -> None:
    for name, t in (("since", since), ("until", until)):
        if t is not None and (not math.isfinite(t) or not 0 <= t < _MAX_EPOCH):
            raise InvalidRequest(f"'{name}' is out of range", param=name, code="invalid_time")
    if since is not None and until is not None and since > until:
        raise InvalidRequest("'since' is after 'until'", param="since", code="invalid_time")


def _check_filter(value: str | None, param: str) -> str | None:
    if value is None:
        return None
    # PostgreSQL rejects NUL in a text parameter; a client must get 400, never 500.
    if len(value) > _MAX_FILTER_LEN or any(ord(c) < 32 for c in value):
        raise InvalidRequest(f"'{param}' is not a valid value", param=param)
    return value


def parse_group_by(value: str | Sequence[str] | None, *, default: str = "model") -> tuple[str, ...]:
    """``"model,node"`` (or a sequence) → ``("model", "node")``; ``"none"`` → ``()``; else 400."""
    if value is None or (isinstance(value, str) and not value.strip()):
        value = default
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if parts == ["none"]:
            return ()
    else:
        parts = [str(p).strip() for p in value]   # already parsed: () means no grouping
        if not parts:
            return ()
    if not parts or len(parts) > 3 or len(set(parts)) != len(parts) or any(p not in GROUP_BY for p in parts):
        raise InvalidRequest(f"'group_by' must be 'none' or up to 3 distinct of {', '.join(GROUP_BY)}, "
                             "comma-separated", param="group_by")
    return tuple(parts)


def parse_bucket(value: str | float | None) -> int | None:
    """A bucket width (``30s``, ``5m``, ``1h``, ``1d``, or seconds) in µs; None for no bucketing."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    text = str(value).strip()
    m = _DURATION.match(text)
    try:
        seconds = float(m.group(1)) * _UNIT_S[m.group(2)] if m else float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or not 1 <= seconds <= 366 * 86_400:
        raise InvalidRequest("'bucket' must be a duration from 1s to 366d, like 5m or 1h", param="bucket",
                             code="invalid_bucket")
    return round(seconds * 1_000_000)


def bucket_of(t_us: int, bucket_us: int) -> int:
    """The start (epoch µs) of the epoch-aligned bucket holding ``t_us``."""
    return t_us - t_us % bucket_us


def check_buckets(lo_us: int, hi_us: int, bucket_us: int | None) -> None:
    """400 when ``[lo_us, hi_us]`` spans more than :data:`MAX_BUCKETS` buckets."""
    if bucket_us is not None and hi_us >= lo_us and (
            bucket_of(hi_us, bucket_us) - bucket_of(lo_us, bucket_us)) // bucket_us >= MAX_BUCKETS:
        raise InvalidRequest(f"the window holds more than {MAX_BUCKETS} buckets: use a larger 'bucket'",
                             param="bucket", code="too_many_buckets")


def group_columns() -> dict[str, ColumnElement[Any]]:
    """The ``requests`` column behind each group key (``served``: the model that served, a model
    alias's tier: ``model,served`` is the per-tier report)."""
    t = REQUESTS.c
    return {"model": t.model_requested, "version": t.model_version, "node": t.node, "tenant": t.tenant,
            "priority": t.priority, "stream": t.stream, "served": t.model_served}


def _encode_cursor(received_us: int, request_id: str) -> str:
    raw = json.dumps({"v": 1, "r": received_us, "i": request_id}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def _decode_cursor(cursor: str) -> tuple[int, str]:
    bad = InvalidRequest(
        "'cursor' is not a cursor returned by this API", param="cursor", code="invalid_cursor"
    )
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError):
        raise bad from None
    if not isinstance(data, dict) or data.get("v") != 1:
        raise bad
    r, i = data.get("r"), data.get("i")
    if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < _MAX_EPOCH * 1_000_000:
        raise bad
    if not isinstance(i, str) or _check_filter(i, "cursor") is None:
        raise bad
    return r, i


def _window(since: float | None, until: float | None) -> list[ColumnElement[bool]]:
    conds: list[ColumnElement[bool]] = []
    col = REQUESTS.c.received_at_us
    # Rounded like the writer rounds received_at, so a request received exactly at ``since`` is in.
    if since is not None:
        conds.append(col >= round(since * 1_000_000))
    if until is not None:
        conds.append(col < round(until * 1_000_000))
    return conds


def time_window(since: float | None, until: float | None) -> list[ColumnElement[bool]]:
    """Validated ``received_at`` conditions for ``[since, until)``."""
    _check_window(since, until)
    return _window(since, until)
