"""What the audit trail stores of a client-chosen name: bounded in length and in variety.

Contract: :func:`model_label` is the ``model_requested`` value of a request rejected before its
process started. A model the fleet serves keeps its name; anything else (a typo, a fuzzer's
garbage, an over-long or control-character name) becomes :data:`UNKNOWN_MODEL`, so the reports'
``group_by=model`` has at most one row more than the fleet has models, whatever clients send
(``/metrics`` bounds its ``model`` label the same way). :func:`clean_text` is what may be kept of
the name itself (in the record's ``tags``, for whoever investigates): control and format
characters and lone surrogates removed, at most :data:`MAX_STORED_CHARS` characters.
"""

from __future__ import annotations

import re
from collections.abc import Container
from typing import Final

__all__ = ["MAX_STORED_CHARS", "UNKNOWN_MODEL", "clean_text", "model_label"]

UNKNOWN_MODEL: Final = "(unknown)"
MAX_STORED_CHARS: Final = 64

# C0, DEL, C1, the Unicode format characters that reorder or hide text, line/paragraph
# separators, and lone surrogates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff\ud800-\udfff]")


def clean_text(text: str, limit: int = MAX_STORED_CHARS) -> str:
    """``text`` without unsafe characters, clipped to ``limit`` characters (``…`` marks a cut)."""
    out = _UNSAFE.sub("", text[: limit * 4])
    return out if len(out) <= limit else out[: limit - 1] + "…"


def model_label(name: object, served: Container[str]) -> str:
    """``name`` when the fleet serves it, else :data:`UNKNOWN_MODEL`."""
    return name if isinstance(name, str) and name in served else UNKNOWN_MODEL
