"""Affinity and RTT in the discrete-event simulator: the direction of the effects on small seeded
cases (simulated metrics, deterministic; no wall-clock timing), and the prompt the DES hashes
being the one the gateway and the emulator see."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import affinity_des
from benchmarks.affinity_des import des_prompt, ideal_hit_rate, near_far_fleet, run_affinity, run_rtt
from benchmarks.learned_goals import node_capacity
from inferlb.bench.loadgen.sessions import chat_messages, prompt_text, session_plan
from inferlb.bench.loadgen.workload import Workload, load_workload, plan
from inferlb.simulator.openai_format import answer_text, prompt_text_of, prompt_tokens_of
from inferlb.simulator.presets import fleet_specs


def test_the_des_prompt_is_the_emulators_and_the_gateways_join() -> None:
    w = load_workload("chat-sessions")
    reqs = plan(w, seed=3, rate=4.0, duration_s=30)
    turns = [r for r in reqs if r.chat is not None and len(r.chat.turns) >= 2]
    assert turns
    for r in turns[:5]:
        assert r.chat is not None
        body = {"messages": chat_messages(r.chat)}
        info = des_prompt(r)
        assert info is not None and info.text == prompt_text_of(body, "chat") == prompt_text(r.chat)
        assert info.session == r.chat.session           # sent in ``user``: the session key
        assert r.prompt_tokens == prompt_tokens_of(body, "chat")     # counted as the emulator counts it
        # the resent answers are the text the emulator answers with for the planned lengths
        answers = [m["content"] for m in body["messages"] if m["role"] == "assistant"]
        assert answers == [answer_text(a) for _, a in r.chat.turns[:-1]]
    # the ideal cache with answers kept beats the prompt-only one: the resent answers hit
    assert ideal_hit_rate(reqs) > ideal_hit_rate(reqs, decoded=False)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_affinity_lowers_ttft_p50_and_raises_the_hit_rate_at_equal_load(seed: int) -> None:
    w = load_workload("chat-sessions")
    specs = fleet_specs("cache4", [w.model])
    rate = 0.5 * 4 * node_capacity("a100", w, seed=1, offered_rps=30.0, duration_s=90.0)
    reqs = plan(w, seed=seed, rate=rate, duration_s=60.0)
    base = run_affinity("token-aware", specs, reqs, w, seed=seed, duration_s=60.0)
    aff = run_affinity("prefix-affinity", specs, reqs, w, seed=seed, duration_s=60.0)
    assert base["measured"] == aff["measured"] > 50                       # the same requests
    assert aff["outcomes"]["ok"] == aff["measured"] and base["outcomes"]["ok"] == base["measured"]
    assert aff["ttft_s"]["p50"] < base["ttft_s"]["p50"]
    assert aff["prefix_cache"]["hit_rate"] > base["prefix_cache"]["hit_rate"]
    assert aff["prefix_cache"]["hit_rate"] <= ideal_hit_rate(reqs)        # no routing beats one shared cache
    assert aff["ttft_parts"]["uncached_tokens_p50"] < base["ttft_parts"]["uncached_tokens_p50"]


def test_far_nodes_lose_traffic_when_near_ones_have_room_and_take_it_when_they_are_full() -> None:
    w = Workload.model_validate(affinity_des._EDGE)
    specs = near_far_fleet(0.05, w.model)
    cap = 4 * node_capacity("a100", w, seed=1, offered_rps=40.0, duration_s=90.0)
    low = plan(w, seed=1, rate=0.2 * cap, duration_s=60.0)      # the near nodes alone: 40 % busy
    high = plan(w, seed=1, rate=0.9 * cap, duration_s=60.0)     # ... 180 %: they cannot serve it alone
    base_low = run_rtt(specs, low, w, seed=1, duration_s=60.0, rtt_weight=0.0)
    rtt_low = run_rtt(specs, low, w, seed=1, duration_s=60.0, rtt_weight=1.0)
    rtt_high = run_rtt(specs, high, w, seed=1, duration_s=60.0, rtt_weight=1.0)
    assert 0.35 < base_low["far_share"] < 0.65        # without rtt, distance is invisible to routing
    assert rtt_low["far_share"] < 0.05                # near ones have room: far ones lose the traffic
    assert rtt_high["far_share"] > 0.3                # near ones are full: far ones take it
    assert rtt_low["ttft_s"]["p50"] < base_low["ttft_s"]["p50"]   # and the clients see no round trip
    assert rtt_high["outcomes"]["ok"] == rtt_high["measured"]


def test_the_benchmark_runs_bounded_and_writes_its_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "des.json"
    assert affinity_des.main(["--seeds", "1", "--duration", "40", "--warmup", "10", "--loads", "0.5",
                              "--rtt-loads", "0.3", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    (load,) = data["affinity"]["loads"]
    assert set(load["profiles"]) == {"token-aware", "prefix-affinity"}
    assert load["profiles"]["token-aware"]["ttft_p50_ratio"] == 1.0
    aff = data["affinity"]
    assert aff["decoded_cached"] is True and aff["sessions"] == "closed" and aff["think_s"] == 7.0
    assert aff["warmup_s"] == 10.0 and aff["duration_s"] == 40.0
    for row in load["profiles"].values():
        assert row["early_turns"] == 0.0 and row["achieved_rps"] > 0 and row["ideal_hit_rate"] > row["hit_rate"]
    assert data["rtt"]["loads"][0]["load"] == 0.3
    printed = capsys.readouterr().out
    assert "TTFT÷base" in printed and "far share" in printed and "achieved" in printed
    # the open-loop plan, as before: the workload's think time after each send, its warm-up
    assert affinity_des.main(["--seeds", "1", "--duration", "30", "--loads", "0.5", "--sessions", "open",
                              "--no-rtt", "--json", str(out)]) == 0
    aff = json.loads(out.read_text())["affinity"]
    assert aff["sessions"] == "open" and aff["think_s"] == 2.0 and aff["warmup_s"] == 15.0
    assert aff["loads"][0]["profiles"]["token-aware"]["early_turns"] > 0.3


def test_the_closed_loop_session_plan_is_the_open_plans_sessions_with_seeded_think_times() -> None:
    w = load_workload("chat-sessions")
    assert w.sessions is not None
    reqs = plan(w, seed=4, rate=4.0, duration_s=60.0)
    # the same sessions, starts and turns: with the workload's think time, the open plan is their
    # turns at their open-loop times, those before the window's end
    same = session_plan(w, seed=4, rate=4.0, duration_s=60.0)
    assert sorted((r for s in same for r in s.turns if r.t < 60.0), key=lambda r: r.t) == reqs
    ss = session_plan(w, seed=4, rate=4.0, duration_s=60.0, think_s=7.0)
    assert [(s.start, [(r.prompt_tokens, r.output_tokens, r.chat) for r in s.turns]) for s in ss] == [
        (s.start, [(r.prompt_tokens, r.output_tokens, r.chat) for r in s.turns]) for s in same]
    assert [s.turns[0].t for s in ss] == [s.start for s in ss]
    assert all(len(s.think_s) == len(s.turns) for s in ss)
    # think times come from the seeded plan: the same seed gives the same ones, another seed others,
    # and the mean scales the same stream (exponential)
    assert [s.think_s for s in session_plan(w, seed=4, rate=4.0, duration_s=60.0, think_s=7.0)] == [
        s.think_s for s in ss]
    assert [s.think_s for s in session_plan(w, seed=5, rate=4.0, duration_s=60.0, think_s=7.0)] != [
        s.think_s for s in ss]
    half = session_plan(w, seed=4, rate=4.0, duration_s=60.0, think_s=3.5)
    assert [x for s in half for x in s.think_s] == pytest.approx([x / 2 for s in ss for x in s.think_s])
    gaps = [x for s in session_plan(w, seed=1, rate=20.0, duration_s=300.0, think_s=7.0) for x in s.think_s]
    assert 6.5 < sum(gaps) / len(gaps) < 7.5


def test_closed_loop_sessions_send_no_turn_before_its_answer_and_affinity_still_wins() -> None:
    w = load_workload("chat-sessions")
    specs = fleet_specs("cache4", [w.model])
    rate = 0.5 * 4 * node_capacity("a100", w, seed=1, offered_rps=30.0, duration_s=90.0)
    ss = session_plan(w, seed=2, rate=rate, duration_s=90.0, think_s=3.0)
    base = run_affinity("token-aware", specs, None, w, seed=2, duration_s=90.0, sessions=ss)
    aff = run_affinity("prefix-affinity", specs, None, w, seed=2, duration_s=90.0, sessions=ss)
    for s in (base, aff):
        assert s["early_turns"] == 0.0                   # closed loop: every previous answer had ended
        assert s["measured"] > 50 and s["outcomes"]["ok"] == s["measured"] and s["abandoned"] == 0
        assert s["prefix_cache"]["hit_rate"] <= s["ideal_hit_rate"]
    # the same sessions: the achieved rates differ only through each profile's latency
    assert aff["achieved_rps"] == pytest.approx(base["achieved_rps"], rel=0.1)
    assert aff["ttft_s"]["p50"] < base["ttft_s"]["p50"]
    assert aff["prefix_cache"]["hit_rate"] > base["prefix_cache"]["hit_rate"]
