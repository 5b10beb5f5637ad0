"""The difficulty classifier (tiers/classify.py): each feature measured as documented, the score
the weighted mean, the contributions adding up to it, nothing of the text kept."""

from __future__ import annotations

import pytest

from inferlb.config.tiers import FEATURE_NAMES, TierScales
from inferlb.tiers.classify import DEFAULT_WEIGHTS, features, request_text, score, weights_of


def chat(*texts: str, **extra: object) -> dict[str, object]:
    return {"model": "auto", "messages": [{"role": "user", "content": t} for t in texts], **extra}


def test_a_short_plain_chat_scores_near_zero_and_a_hard_one_high() -> None:
    easy = features(chat("hi"), prompt_tokens=2, max_tokens=None)
    assert easy == {"prompt_tokens": 0.001, "turns": 0.0, "tools": 0.0, "response_format": 0.0, "code": 0.0,
                    "math": 0.0, "max_tokens": 0.0}
    hard_body = chat("Prove the theorem: the integral of $x^2$ is ...", "```py\nprint(1)\n```",
                     tools=[{"type": "function"}], response_format={"type": "json_schema"})
    hard = features(hard_body, prompt_tokens=4000, max_tokens=2048)
    assert hard == {"prompt_tokens": 1.0, "turns": 1 / 8, "tools": 1.0, "response_format": 1.0, "code": 1.0,
                    "math": 1.0, "max_tokens": 1.0}
    s_easy, s_hard = score(easy, DEFAULT_WEIGHTS), score(hard, DEFAULT_WEIGHTS)
    assert s_easy.value < 0.01 and s_hard.value > 0.9
    assert sum(s_hard.contributions.values()) == pytest.approx(s_hard.value, abs=1e-5)
    assert s_hard.top(2) == ["prompt_tokens", "code"]   # 0.25 first, then the 0.15s by name


def test_partial_markers_and_scales() -> None:
    f = features({"prompt": "def f(): return 1\nclass A: pass", "response_format": {"type": "json_object"}},
                 prompt_tokens=500, max_tokens=256, scales=TierScales(prompt_tokens=1000, max_tokens=512))
    assert f["code"] == 0.5 and f["response_format"] == 0.5      # keywords without a fence; json_object
    assert f["prompt_tokens"] == 0.5 and f["max_tokens"] == 0.5
    assert features(chat("solve for x"), prompt_tokens=1, max_tokens=None)["math"] == 0.5
    assert features(chat("a", "b", "c"), prompt_tokens=1, max_tokens=None)["turns"] == 2 / 8
    system = {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "x"}]}
    assert features(system, prompt_tokens=1, max_tokens=None)["turns"] == 0.0   # a system message is no turn


def test_text_parts_are_read_and_the_scan_is_bounded() -> None:
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "```x```"},
                                                      {"type": "image_url", "image_url": {"url": "data:"}}]}]}
    assert request_text(body) == "```x```"
    assert len(request_text({"prompt": "a" * 200_000})) == 65_536


def test_weights_replace_the_defaults_they_name_and_zero_weights_give_zero() -> None:
    w = weights_of({"tools": 1.0})
    assert w["tools"] == 1.0 and w["code"] == DEFAULT_WEIGHTS["code"]
    f = {n: 1.0 for n in FEATURE_NAMES}
    assert score(f, {n: 0.0 for n in FEATURE_NAMES}).value == 0.0
    only_tools = score({"tools": 1.0}, {"tools": 1.0})
    assert only_tools.value == 1.0 and only_tools.contributions["tools"] == 1.0
