"""The peer routers of ``inferlb bench compare``: target names, command lines, LiteLLM's config,
the skip line of a peer that is not installed, and the router-CPU column. No peer is needed."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from inferlb.bench.loadgen import cli
from inferlb.bench.loadgen.peers import (
    PeerExes,
    TargetSpec,
    get_load_shape,
    litellm_config,
    litellm_env,
    new_master_key,
    parse_target,
    peer_command,
)
from inferlb.bench.loadgen.report import compare_rows
from inferlb.bench.loadgen.results import summarize
from inferlb.bench.loadgen.runner import RunData
from inferlb.bench.loadgen.workload import Workload

WORKERS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


def _exe(tmp_path: Path, name: str) -> str:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n")
    p.chmod(0o755)
    return str(p)


def test_parse_target_names() -> None:
    assert parse_target("direct") == TargetSpec("direct", None, "direct")
    assert parse_target("token-aware") == TargetSpec("inferlb", "token-aware", "token-aware")
    assert parse_target("inferlb:learned") == TargetSpec("inferlb", "learned", "inferlb:learned")
    vr = parse_target("vllm-router:power_of_two")
    assert (vr.kind, vr.policy, vr.is_peer) == ("vllm-router", "power_of_two", True)
    assert parse_target("sglang-router").label == "sglang-router:cache_aware"     # the peer's default policy
    assert parse_target("litellm").policy == "least-busy"
    for bad, msg in [("haproxy:leastconn", "unknown router"), ("vllm-router:least_busy", "no policy"),
                     ("sglang-router:", "no policy"), (" ", "empty")]:
        with pytest.raises(ValueError, match=msg):
            parse_target(bad)


def test_nodes_answer_get_load_in_the_shape_each_router_reads() -> None:
    assert get_load_shape(parse_target("vllm-router:power_of_two")) == "vllm-router"
    assert get_load_shape(parse_target("sglang-router:power_of_two")) == "sglang"
    assert get_load_shape(parse_target("token-aware")) is None
    assert get_load_shape(parse_target("litellm:least-busy")) is None


def test_rust_router_commands_bind_loopback_and_set_their_ports(tmp_path: Path) -> None:
    exes = PeerExes(vllm_router=_exe(tmp_path, "vllm-router"), sglang_python=_exe(tmp_path, "python"))
    vr = peer_command(parse_target("vllm-router:power_of_two"), exes, port=7000, metrics_port=7001,
                      workers=WORKERS)
    assert vr[0] == exes.vllm_router
    assert vr[vr.index("--host") + 1] == "127.0.0.1" and vr[vr.index("--port") + 1] == "7000"
    assert vr[vr.index("--worker-urls") + 1:vr.index("--worker-urls") + 3] == WORKERS
    assert vr[vr.index("--policy") + 1] == "power_of_two"
    # Both Rust routers open a Prometheus port (29000 unless told) and wait 30 s before their
    # first health round unless told: two benchmark runs would collide, every run would idle.
    assert vr[vr.index("--prometheus-port") + 1] == "7001" and vr[vr.index("--prometheus-host") + 1] == "127.0.0.1"
    assert vr[vr.index("--worker-startup-check-interval") + 1] == "1"
    sr = peer_command(parse_target("sglang-router:cache_aware"), exes, port=7002, metrics_port=7003,
                      workers=WORKERS)
    assert sr[:3] == [exes.sglang_python, "-m", "sglang_router.launch_router"]
    assert sr[sr.index("--log-level") + 1] == "warn"        # sglang-router's spelling, not "warning"
    assert sr[sr.index("--prometheus-port") + 1] == "7003"


def test_litellm_command_config_and_env(tmp_path: Path) -> None:
    exes = PeerExes(litellm=_exe(tmp_path, "litellm"))
    conf = tmp_path / "litellm.yaml"
    cmd = peer_command(parse_target("litellm:least-busy"), exes, port=7004, metrics_port=7005, workers=WORKERS,
                       config=conf)
    assert cmd == [exes.litellm, "--config", str(conf), "--host", "127.0.0.1", "--port", "7004",
                   "--num_workers", "1"]
    with pytest.raises(ValueError, match="config"):
        peer_command(parse_target("litellm:least-busy"), exes, port=1, metrics_port=2, workers=WORKERS)
    c = litellm_config(WORKERS, "sim-llm", "least-busy", 120.0)
    assert [d["litellm_params"]["api_base"] for d in c["model_list"]] == [u + "/v1" for u in WORKERS]
    assert {d["model_name"] for d in c["model_list"]} == {"sim-llm"}
    assert c["router_settings"] == {"routing_strategy": "least-busy", "num_retries": 0}
    key = new_master_key()
    assert key.startswith("sk-") and key != new_master_key()
    env = litellm_env(key)
    assert env["LITELLM_MASTER_KEY"] == key and env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"


def test_a_missing_peer_is_named_in_one_line(tmp_path: Path) -> None:
    none = PeerExes()
    why = none.missing("vllm-router")
    assert why is not None and "not installed" in why and "\n" not in why
    gone = PeerExes(litellm=str(tmp_path / "nope" / "litellm"))
    why = gone.missing("litellm")
    assert why is not None and "not found" in why and "--litellm-bin" in why
    with pytest.raises(ValueError, match="not installed"):
        peer_command(parse_target("sglang-router:cache_aware"), none, port=1, metrics_port=2, workers=WORKERS)
    with pytest.raises(ValueError, match="not a peer"):
        peer_command(parse_target("token-aware"), none, port=1, metrics_port=2, workers=WORKERS)
    assert PeerExes(vllm_router=_exe(tmp_path, "vr")).missing("vllm-router") is None


def test_compare_skips_a_peer_that_is_not_installed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Only the missing peer is asked for: the run starts no process and still exits 0.
    rc = cli.main("compare", ["--targets", "vllm-router:power_of_two", "--vllm-router", str(tmp_path / "none"),
                              "--rate", "1", "--duration", "3", "--quiet", "--markdown",
                              "--workdir", str(tmp_path / "wd")])
    out = capsys.readouterr()
    assert rc == 0
    assert "skipped vllm-router:power_of_two:" in out.out and "not found" in out.out
    assert not any((tmp_path / "wd").glob("*.log"))


def test_the_table_has_the_router_cpu_per_request_and_finds_the_reference() -> None:
    s = summarize(RunData("x", [], duration_s=1.0), Workload())
    peer = dict(s, label="vllm-router:cache_aware", router_cpu_ms_per_req=0.25)
    ours = dict(s, label="inferlb:token-aware", router_cpu_ms_per_req=1.5)
    head, rows = compare_rows([ours, peer, dict(s, label="direct")], reference="inferlb:token-aware")
    col = head.index("router CPU ms/req")
    assert [r[col] for r in rows] == ["1.50", "0.25", "-"]
    assert cli._reference("token-aware", ["inferlb:token-aware", "vllm-router:cache_aware"]) == "inferlb:token-aware"
    assert cli._reference("direct", ["inferlb:token-aware"]) == "direct"
    assert math.isnan(s["e2e_s"]["p99"])



_FAKE_ROUTER = '''#!{python}
"""A stand-in peer router: records its argv, answers every POST with 200."""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

open({argv!r}, "w").write(json.dumps(sys.argv[1:]))
port = int(sys.argv[sys.argv.index("--port") + 1])


class H(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{{}}")

    def log_message(self, *a):
        pass


HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_a_peer_starts_over_fresh_nodes_that_answer_its_load_shape(tmp_path: Path) -> None:
    import json
    import sys
    import urllib.request

    from inferlb.bench.loadgen.stack import Stack

    argv_file = tmp_path / "argv.json"
    fake = tmp_path / "vllm-router"
    fake.write_text(_FAKE_ROUTER.format(python=sys.executable, argv=str(argv_file)))
    fake.chmod(0o755)
    stack = Stack(tmp_path, "uniform4")
    try:
        urls = cli._target(stack, parse_target("vllm-router:power_of_two"), Workload(), 1,
                           PeerExes(vllm_router=str(fake)))
        assert len(urls) == 1 and urls[0].startswith("http://127.0.0.1:")
        argv = json.loads(argv_file.read_text())
        assert argv[argv.index("--worker-urls") + 1:argv.index("--policy")] == list(stack.node_urls.values())
        with urllib.request.urlopen(next(iter(stack.node_urls.values())) + "/get_load", timeout=5) as r:
            assert json.loads(r.read()) == {"load": 0}          # vllm-router's shape on these nodes
        assert stack.gateway is not None and stack.gateway.alive()
        gateway = stack.gateway
    finally:
        stack.close()
    assert not gateway.alive()
