"""The difficulty of a request: named features in [0, 1] and a weighted score in [0, 1]. Pure, no I/O.

Features (each measured from the request body the gateway validated, and the prompt-token estimate
of ``request/evaluate``):

==================  ==========================================================================
``prompt_tokens``   ``min(1, prompt tokens / scales.prompt_tokens)`` (default scale 2,000)
``turns``           ``min(1, (messages - 1) / scales.turns)``: a one-message chat is 0
``tools``           1 when the request offers tools or functions (``tools``, ``functions``)
``response_format`` 1 for ``json_schema``, 0.5 for ``json_object``, else 0
``code``            1 when the text holds a code fence (```` ``` ````), 0.5 for code keywords only
``math``            1 for two or more maths markers (LaTeX, "prove", "integral" …), 0.5 for one
``max_tokens``      ``min(1, declared max_tokens / scales.max_tokens)``; 0 when none is declared
==================  ==========================================================================

The score is ``Σ w_f · x_f / Σ w_f`` (weights :data:`DEFAULT_WEIGHTS`, or the alias's ``weights``
in place of those it names); each feature's *contribution* is its term ``w_f · x_f / Σ w_f``, so
the contributions add up to the score and say why a request counted as hard. The text scanned for
markers is at most :data:`MAX_SCAN_CHARS` characters of the request's text (never stored or logged:
only the feature values reach the audit record).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from inferlb.config.tiers import FEATURE_NAMES, TierScales

__all__ = ["DEFAULT_WEIGHTS", "MAX_SCAN_CHARS", "Score", "features", "request_text", "score", "weights_of"]

#: The weight of each feature when the alias names none (they add up to 1).
DEFAULT_WEIGHTS: dict[str, float] = {"prompt_tokens": 0.25, "turns": 0.1, "tools": 0.15, "response_format": 0.1,
                                     "code": 0.15, "math": 0.15, "max_tokens": 0.1}
MAX_SCAN_CHARS = 65_536

_CODE_KEYWORDS = re.compile(r"\b(def|class|return|import|function|const|#include|SELECT|Traceback|public static)\b"
                            r"|[{};]\s*$", re.MULTILINE)
_MATH = re.compile(r"\\(frac|int|sum|sqrt|begin\{(equation|align)\})|\$[^$\n]+\$|\b(prove|proof|theorem|lemma|"
                   r"integral|derivative|equation|solve for|eigen\w*|probability)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Score:
    """A request's difficulty: the score in [0, 1], each feature's value and its contribution."""

    value: float
    features: dict[str, float]
    contributions: dict[str, float]

    def top(self, k: int = 3) -> list[str]:
        """The names of the ``k`` largest positive contributions, largest first."""
        ranked = sorted(((c, n) for n, c in self.contributions.items() if c > 0), key=lambda x: (-x[0], x[1]))
        return [n for _, n in ranked[:k]]


def request_text(body: Mapping[str, Any], limit: int = MAX_SCAN_CHARS) -> str:
    """The request's text (messages' text, text parts, ``prompt``, ``input``), at most ``limit`` characters."""
    out: list[str] = []
    size = 0

    def add(s: Any) -> None:
        nonlocal size
        if isinstance(s, str) and size < limit:
            out.append(s[: limit - size])
            size += len(out[-1])

    msgs = body.get("messages")
    if isinstance(msgs, list):
        for m in msgs:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                for part in content:
                    if isinstance(part, dict):
                        add(part.get("text"))
            else:
                add(content)
    for key in ("prompt", "input"):
        v = body.get(key)
        if isinstance(v, list):
            for item in v:
                add(item)
        else:
            add(v)
    return "\n".join(out)


def _turns(body: Mapping[str, Any]) -> int:
    msgs = body.get("messages")
    if isinstance(msgs, list):
        return sum(1 for m in msgs if isinstance(m, dict) and m.get("role") != "system")
    inp = body.get("input")
    return len(inp) if isinstance(inp, list) else 1


def features(body: Mapping[str, Any], *, prompt_tokens: int, max_tokens: int | None,
             scales: TierScales | None = None, text: str | None = None) -> dict[str, float]:
    """Each feature of :data:`~inferlb.config.tiers.FEATURE_NAMES` in [0, 1] (the module docstring
    says how); ``text``: the request's text when the caller has it (else read from ``body``)."""
    sc = scales or TierScales()
    txt = request_text(body) if text is None else text[:MAX_SCAN_CHARS]
    rf = body.get("response_format")
    rf_type = rf.get("type") if isinstance(rf, dict) else None
    tools = body.get("tools") or body.get("functions")
    code = 1.0 if "```" in txt else 0.5 if len(_CODE_KEYWORDS.findall(txt)) >= 2 else 0.0
    maths = len(_MATH.findall(txt))
    return {
        "prompt_tokens": min(1.0, max(0, prompt_tokens) / sc.prompt_tokens),
        "turns": min(1.0, max(0, _turns(body) - 1) / sc.turns),
        "tools": 1.0 if tools else 0.0,
        "response_format": 1.0 if rf_type == "json_schema" else 0.5 if rf_type == "json_object" else 0.0,
        "code": code,
        "math": 1.0 if maths >= 2 else 0.5 if maths == 1 else 0.0,
        "max_tokens": min(1.0, max_tokens / sc.max_tokens) if max_tokens else 0.0,
    }


def weights_of(overrides: Mapping[str, float] | None) -> dict[str, float]:
    """:data:`DEFAULT_WEIGHTS` with the alias's own weights in place of those it names."""
    return {**DEFAULT_WEIGHTS, **(overrides or {})}


def score(values: Mapping[str, float], weights: Mapping[str, float]) -> Score:
    """The weighted score of feature ``values`` (module docstring); 0 when every weight is 0."""
    total = sum(weights.get(n, 0.0) for n in FEATURE_NAMES)
    feats = {n: round(float(values.get(n, 0.0)), 6) for n in FEATURE_NAMES}
    if total <= 0:
        return Score(0.0, feats, {n: 0.0 for n in FEATURE_NAMES})
    contrib = {n: round(weights.get(n, 0.0) * feats[n] / total, 6) for n in FEATURE_NAMES}
    value = min(1.0, max(0.0, sum(weights.get(n, 0.0) * feats[n] for n in FEATURE_NAMES) / total))
    return Score(round(value, 6), feats, contrib)
