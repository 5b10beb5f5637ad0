"""Pure parts: the exposition parsers on real-looking pages, and the isolation rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferlb.config.health import HardwareConfig, OutlierConfig, SlowStartConfig
from inferlb.fleet.gpu import throttle_names
from inferlb.fleet.rules import (
    LatencyStats,
    ejection_seconds,
    failure_percentage_outliers,
    hardware_findings,
    latency_outliers,
    slow_start_factor,
    success_rate_outliers,
)
from inferlb.health.prometheus import parse_dcgm, parse_llamacpp, parse_sglang, parse_tgi, parse_vllm

FIX = Path(__file__).parent / "fixtures"


def page(name: str) -> str:
    return (FIX / name).read_text()


def test_vllm_v1_sums_engines_and_takes_the_fullest_kv_cache() -> None:
    assert parse_vllm(page("vllm_v1.prom")) == {"format": "vllm", "running": 12, "waiting": 3, "kv_usage": 0.6875,
                                                "lora": None}


def test_vllm_lora_info_takes_the_newest_label_set() -> None:
    """vLLM sets a new label set of vllm:lora_requests_info (value: the time) each time its adapters
    change; the page keeps the old ones: the largest value is the state now, not the last line."""
    got = parse_vllm(page("vllm_lora.prom"))
    assert got["lora"] == {"running": ["chat-lora", "sql-lora"], "waiting": ["summary-lora"], "max_lora": 4}
    assert (got["running"], got["waiting"], got["kv_usage"]) == (3, 2, 0.125)


def test_vllm_lora_info_with_odd_labels() -> None:
    text = ('vllm:lora_requests_info{max_lora="x",running_lora_adapters=" a , ,b",waiting_lora_adapters=""} 5\n'
            'vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} NaN\n')
    assert parse_vllm(text)["lora"] == {"running": ["a", "b"], "waiting": [], "max_lora": None}


def test_vllm_v0_reads_the_older_gpu_cache_name() -> None:
    assert parse_vllm(page("vllm_v0.prom")) == {"format": "vllm", "running": 12, "waiting": 4, "kv_usage": 0.9125,
                                                "lora": None}


def test_tgi_and_sglang() -> None:
    assert parse_tgi(page("tgi.prom")) == {"format": "tgi", "running": 9, "waiting": 6, "kv_usage": None}
    assert parse_sglang(page("sglang.prom")) == {"format": "sglang", "running": 21, "waiting": 0, "kv_usage": 0.28}


def test_llamacpp_server_metrics() -> None:
    # The names llama.cpp's llama-server exports with --metrics (its server README's list).
    assert parse_llamacpp(page("llamacpp.prom")) == {"format": "llamacpp", "running": 3, "waiting": 2,
                                                     "kv_usage": 0.42}


def test_a_page_of_another_server_gives_unknowns_not_zeros() -> None:
    assert parse_vllm(page("tgi.prom")) == {"format": "vllm", "running": None, "waiting": None, "kv_usage": None,
                                           "lora": None}


@pytest.mark.parametrize("text", ["garbage {", "<html><body>502 Bad Gateway</body></html>", "\x00\x01"])
def test_garbage_is_a_value_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_vllm(text)


def test_nan_values_are_ignored() -> None:
    assert parse_vllm("vllm:num_requests_running 3\nvllm:kv_cache_usage_perc NaN\n")["kv_usage"] is None


def test_dcgm_page_becomes_an_agent_report() -> None:
    r = parse_dcgm(page("dcgm.prom"))
    assert r["nvml"] == "ok" and r["source"] == "dcgm" and len(r["gpus"]) == 2
    g0, g1 = r["gpus"]
    assert g0["uuid"] == "GPU-5fa8a9c1-0b4c-2b7e-6a1d-77f1d0b2c9e1" and g0["name"] == "NVIDIA H100 80GB HBM3"
    assert (g0["memory_used_mib"], g0["memory_total_mib"]) == (76559, 81071)
    assert g0["throttle_reasons"] == ["sw_power_cap"]
    assert g1["throttle_reasons"] == ["sw_thermal_slowdown", "hw_thermal_slowdown"]   # 0x20 | 0x40
    assert g0["xid_last"] is None and g0["ecc_errors"] == {"corrected": None, "uncorrected": 0}
    assert g1["temperature_c"] == 88 and g1["power_w"] == 448.9


def test_throttle_bits() -> None:
    assert throttle_names(0x1 | 0x80 | 0x2000) == ["gpu_idle", "hw_power_brake_slowdown", "bit_0x2000"]


def test_slow_start_formula_envoy() -> None:
    cfg = SlowStartConfig(window_s=60, aggression=1.0, min_weight_percent=10)
    assert slow_start_factor(0.0, cfg) == 0.1            # floored at MinWeightPercent
    assert slow_start_factor(30.0, cfg) == pytest.approx(0.5)
    assert slow_start_factor(60.0, cfg) == 1.0
    assert slow_start_factor(15.0, SlowStartConfig(window_s=60, aggression=2.0)) == pytest.approx(0.5)
    assert slow_start_factor(0.0, SlowStartConfig(window_s=0)) == 1.0


def test_ejection_seconds_base_times_n_capped() -> None:
    cfg = OutlierConfig()
    assert [ejection_seconds(n, cfg) for n in (1, 2, 3, 10, 11)] == [30, 60, 90, 300, 300]
    assert ejection_seconds(1, OutlierConfig(base_ejection_s=400, max_ejection_s=300)) == 400   # max(base, max)


def test_success_rate_needs_five_hosts_with_volume() -> None:
    cfg = OutlierConfig()
    stats = {"a": (200, 200), "b": (200, 199), "c": (200, 200), "d": (200, 198), "e": (200, 120)}
    out = success_rate_outliers(stats, cfg)
    assert list(out) == ["e"] and out["e"]["success_rate"] == 60.0 and out["e"]["threshold"] > 60
    assert success_rate_outliers({k: v for k, v in stats.items() if k != "a"}, cfg) == {}      # 4 hosts
    low = {**stats, "a": (99, 99)}
    assert success_rate_outliers(low, cfg) == {}             # a has too few requests: 4 qualify


def test_failure_percentage_when_enforced() -> None:
    cfg = OutlierConfig(enforcing_failure_percentage=100)
    stats = {n: (60, 60) for n in "abcd"} | {"e": (60, 5)}
    assert list(failure_percentage_outliers(stats, cfg)) == ["e"]


def test_latency_against_own_baseline_and_peers() -> None:
    cfg = OutlierConfig()                    # factor 3 × own baseline, 2 × the peers' median
    peer = LatencyStats(0.1, 20, 0.1, 3)

    def judged(me: LatencyStats, *peers: LatencyStats) -> bool:
        stats = {"me": me} | {f"p{i}": p for i, p in enumerate(peers)}
        return "me" in latency_outliers("ttft", stats, cfg)

    assert judged(LatencyStats(0.31, 20, 0.1, 3), peer, peer)
    assert not judged(LatencyStats(0.29, 20, 0.1, 3), peer, peer)         # within 3 × its baseline
    assert not judged(LatencyStats(0.9, 19, 0.1, 3), peer, peer)          # too few requests
    assert not judged(LatencyStats(0.9, 20, 0.1, 2), peer, peer)          # baseline not learned yet
    slow_peer = LatencyStats(0.5, 20, 0.1, 3)
    assert not judged(LatencyStats(0.9, 20, 0.1, 3), slow_peer, slow_peer)   # all slow: within 2 × peers
    assert not judged(LatencyStats(0.9, 20, 0.1, 3))                     # no peer to compare with
    assert not judged(LatencyStats(0.9, 20, 0.1, 3), LatencyStats(0.1, 19, 0.1, 3))   # peer too few requests
    ev = latency_outliers("tpot", {"me": LatencyStats(0.9, 20, 0.1, 3), "p": peer}, cfg)["me"]
    assert ev == {"rule": "latency", "measure": "tpot", "median_s": 0.9, "baseline_s": 0.1, "factor": 3.0,
                  "peer_median_s": 0.1, "peer_factor": 2.0, "peers": 1, "requests": 20}


def _agent(count: int = 0, last: int | None = None, unc: int = 0, throttle: list[str] | None = None,
           boot: str = "b1", events: list[dict[str, int]] | None = None, **gpu: object) -> dict[str, object]:
    return {"nvml": "ok", "boot_id": boot, "xid_events": events or [], "gpus": [{
        "index": 0, "uuid": "GPU-x", "xid_errors": count, "xid_last": last,
        "ecc_errors": {"corrected": 0, "uncorrected": unc}, "throttle_reasons": throttle or [], **gpu}]}


def test_first_report_is_a_baseline_then_new_xid_ejects() -> None:
    cfg = HardwareConfig()
    f, base = hardware_findings(_agent(count=2, last=79), None, cfg)
    assert f == []                                            # history from before we watched
    f, base = hardware_findings(_agent(count=2, last=79), base, cfg)
    assert f == []
    f, base = hardware_findings(_agent(count=3, last=48, events=[{"seq": 9, "gpu": 0, "xid": 48}]), base, cfg)
    assert [x["action"] for x in f] == ["eject"] and "Xid 48 (double-bit ECC error)" in f[0]["detail"]


def test_application_xids_are_reported_not_acted_on() -> None:
    cfg = HardwareConfig()
    _, base = hardware_findings(_agent(), None, cfg)
    f, _ = hardware_findings(_agent(count=1, last=31, events=[{"seq": 1, "gpu": 0, "xid": 31}]), base, cfg)
    assert [x["action"] for x in f] == ["none"]


def test_dcgm_last_xid_change_is_new() -> None:
    cfg = HardwareConfig()
    rep = {"nvml": "ok", "gpus": [{"index": 0, "uuid": "u", "xid_errors": None, "xid_last": None}]}
    _, base = hardware_findings(rep, None, cfg)
    rep["gpus"][0]["xid_last"] = 79   # type: ignore[index]
    f, base = hardware_findings(rep, base, cfg)
    assert f[0]["action"] == "eject" and "fallen off the bus" in f[0]["detail"]
    f, _ = hardware_findings(rep, base, cfg)
    assert f == []                                            # the same last Xid is not new


def test_uncorrected_ecc_lost_gpu_and_throttle() -> None:
    cfg = HardwareConfig()
    _, base = hardware_findings(_agent(), None, cfg)
    f, _ = hardware_findings(_agent(unc=2), base, cfg)
    assert f[0]["kind"] == "ecc" and "2 new uncorrected" in f[0]["detail"]
    f, _ = hardware_findings(_agent(lost=True), base, cfg)
    assert f[0]["kind"] == "gpu_lost"
    f, _ = hardware_findings(_agent(throttle=["sw_power_cap"]), base, cfg)
    assert f == []                                            # a busy GPU at its power cap is normal
    f, _ = hardware_findings(_agent(throttle=["hw_power_brake_slowdown"]), base, cfg)
    assert f[0]["action"] == "drain"


def test_a_new_agent_process_makes_its_xids_new() -> None:
    cfg = HardwareConfig()
    _, base = hardware_findings(_agent(count=5, last=79), None, cfg)
    f, _ = hardware_findings(_agent(count=1, last=79, boot="b2"), base, cfg)
    assert f and f[0]["action"] == "eject"


def test_unavailable_nvml_is_unknown_not_faulty() -> None:
    f, base = hardware_findings({"nvml": "unavailable", "reason": "no driver"}, None, HardwareConfig())
    assert f == [] and base == {}
