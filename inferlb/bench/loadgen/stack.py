"""The processes a benchmark runs: simulated nodes (one ``inferlb sim`` process) and a gateway.

The gateway is ``inferlb serve`` or a peer router (:mod:`.peers`: vllm-router, sglang-router,
LiteLLM), started by :meth:`Stack.start_peer` over the same nodes. With ``external`` node URLs (a
fleet already running, e.g. real engines) the stack starts no nodes and routes to those.

Contract: everything binds 127.0.0.1 on free ports; every child is a
:class:`~inferlb.bench.loadgen.procs.Child` (own session, log file in the work dir) and
:meth:`Stack.close` stops them all by PID, also when the benchmark fails. The gateway's fleet file
written by :func:`gateway_fleet` gives each node ``capacity_tokens`` = its KV-cache size and
``max_concurrency`` = its own cap, as an operator would configure them from the server's start-up
log; only ``routing.profile`` differs between the targets of a comparison. A benchmark with its own
gateway configuration (``inferlb bench overload``) passes the fleet file to
:meth:`Stack.start_gateway_with`.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from inferlb.bench.loadgen.peers import (
    PeerExes,
    TargetSpec,
    litellm_config,
    litellm_env,
    peer_command,
)
from inferlb.bench.loadgen.procs import Child, free_port, wait_http, wait_post
from inferlb.bench.loadgen.workload import Workload
from inferlb.simulator.presets import fleet_specs, is_named_fleet
from inferlb.simulator.spec import NodeSpec

__all__ = ["Stack", "gateway_fleet", "node_overrides"]

PY = sys.executable


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_repo_root()), env.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def node_overrides(on_kv_full: str | None, stream_interval: int | None) -> list[str]:
    """``inferlb sim`` options that apply the benchmark's overrides to every node."""
    out = []
    if on_kv_full:
        out += ["--on-kv-full", on_kv_full]
    if stream_interval:
        out += ["--stream-interval", str(stream_interval)]
    return out


def gateway_fleet(specs: list[NodeSpec], urls: dict[str, str], profile: str, w: Workload,
                  seed: int) -> dict[str, Any]:
    """The gateway's fleet file for ``specs`` at ``urls`` with routing ``profile``."""
    nodes = []
    for s in specs:
        kv = s.batching.kv_tokens if s.batching is not None else 32_768
        nodes.append({"name": s.name, "url": urls[s.name], "models": [w.model], "kind": "sim",
                      "capacity_tokens": kv, "max_concurrency": s.max_concurrency})
    return {
        "models": [{"name": w.model, "max_context_tokens": 131_072, "max_output_tokens": 32_768,
                    "default_max_tokens": 256}],
        "nodes": nodes,
        "routing": {"profile": profile, "seed": seed},
        "timeouts": {"connect_s": 5.0, "first_token_s": w.timeout_s, "idle_s": w.timeout_s,
                     "total_s": w.timeout_s},
        "slos": [{"model": w.model, "e2e_max_s": w.slo.e2e_s, "ttft_max_s": w.slo.ttft_s}],
    }


class Stack:
    """The benchmark's child processes, in ``workdir``."""

    def __init__(self, workdir: Path, fleet: str, *, sim_args: list[str] | None = None,
                 log: Callable[[str], None] = lambda m: None, external: list[str] | None = None,
                 model: str = "sim-llm") -> None:
        self.dir = workdir
        # The node process runs in the work dir: a fleet file is passed by absolute path.
        self.fleet = fleet if is_named_fleet(fleet) else str(Path(fleet).resolve())
        # External nodes (``--nodes``) are described by defaults: a gateway fleet file needs a spec
        # per node, and nothing is known of them but their URL and the workload's model.
        self.external = list(external or [])
        self.specs = ([NodeSpec(name=f"node{i + 1}", models=[model]) for i in range(len(self.external))]
                      if self.external else fleet_specs(self.fleet))
        self.sim_args = list(sim_args or [])
        self.log = log
        self.children: list[Child] = []
        self.node_urls: dict[str, str] = {}
        self.sim: Child | None = None
        self.gateway: Child | None = None
        self.admin_url: str | None = None
        self._n = 0

    def _spawn(self, name: str, cmd: list[str], env: dict[str, str]) -> Child:
        self._n += 1
        child = Child(name, cmd, self.dir / f"{self._n:02d}-{name}.log", env=env, cwd=self.dir)
        self.children.append(child)
        return child

    @property
    def emulated(self) -> bool:
        """Whether the nodes are this stack's ``inferlb sim`` (they answer ``/sim/stats``)."""
        return not self.external

    def start_nodes(self, get_load: str | None = None) -> dict[str, str]:
        """(Re)start the simulated nodes: a fresh process, so every target starts from cold;
        ``get_load`` is the shape of their ``/get_load`` (``inferlb sim --get-load``). External
        nodes are only named (they are not restarted)."""
        if self.external:
            self.node_urls = {s.name: u.rstrip("/") for s, u in zip(self.specs, self.external, strict=True)}
            return dict(self.node_urls)
        self.stop_nodes()
        ports = [free_port() for _ in self.specs]
        self.node_urls = {s.name: f"http://127.0.0.1:{p}" for s, p in zip(self.specs, ports, strict=True)}
        extra = ["--get-load", get_load] if get_load else []
        cmd = [PY, "-m", "inferlb.cli.main", "sim", "--fleet", self.fleet, *self.sim_args, *extra,
               "--ports", *map(str, ports)]
        self.sim = self._spawn("sim", cmd, _env())
        for url in self.node_urls.values():
            wait_http(url + "/health", self.sim, 60)
        self.log(f"{len(self.node_urls)} simulated nodes up (pid {self.sim.pid})")
        return dict(self.node_urls)

    def stop_nodes(self) -> None:
        if self.sim is not None:
            self.sim.stop()
            self.sim = None

    def start_gateway(self, profile: str, w: Workload, seed: int) -> str:
        """Start ``inferlb serve`` over the nodes with routing ``profile``; returns its base URL."""
        return self.start_gateway_with(f"gateway-{profile}",
                                       gateway_fleet(self.specs, self.node_urls, profile, w, seed))

    def start_gateway_with(self, name: str, fleet: dict[str, Any], *, gdir: Path | None = None,
                           env: dict[str, str] | None = None) -> str:
        """Start ``inferlb serve`` on the fleet file ``fleet`` (stopping the one before); its
        database and journal live in ``gdir`` (default: a fresh folder of the work dir), ``env``
        adds settings. Returns its base URL once ``/readyz`` answers."""
        self.stop_gateway()
        port = free_port()
        if gdir is None:
            gdir = self.dir / f"{name}-{self._n + 1}"
        gdir.mkdir(parents=True, exist_ok=True)
        fleet_file = gdir / "fleet.yaml"
        fleet_file.write_text(yaml.safe_dump(fleet, sort_keys=False))
        admin = free_port()
        self.admin_url = f"http://127.0.0.1:{admin}"    # the admin listener (dashboard data, /admin)
        genv = _env(INFERLB_HOST="127.0.0.1", INFERLB_PORT=str(port), INFERLB_ADMIN_PORT=str(admin),
                    INFERLB_DATABASE_URL=f"sqlite:///{gdir / 'audit.db'}", INFERLB_JOURNAL_DIR=str(gdir / "journal"),
                    INFERLB_LOG_LEVEL="WARNING", **(env or {}))
        genv.pop("INFERLB_REDIS_URL", None)    # the benchmark's gateway keeps its state in-process
        self.gateway = self._spawn(name, [PY, "-m", "inferlb.cli.main", "serve", "--config", str(fleet_file)], genv)
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/readyz", self.gateway, 90)
        self.log(f"{name} up at {url} (pid {self.gateway.pid})")
        return url

    def start_peer(self, t: TargetSpec, exes: PeerExes, w: Workload, *, master_key: str = "") -> str:
        """Start peer router ``t`` over the nodes (stopping the gateway before); returns its base
        URL once a chat completion through it answers 200 (its workers are then healthy; for
        LiteLLM, after its liveliness probe, with ``master_key``, its master key). The caller
        starts the nodes with ``get_load_shape(t)`` first."""
        self.stop_gateway()
        port, metrics_port = free_port(), free_port()
        gdir = self.dir / f"{t.label.replace(':', '-')}-{self._n + 1}"
        gdir.mkdir(parents=True, exist_ok=True)
        workers = list(self.node_urls.values())
        config = None
        env = _env()
        if t.kind == "litellm":
            config = gdir / "litellm.yaml"
            config.write_text(yaml.safe_dump(litellm_config(workers, w.model, t.policy or "", w.timeout_s),
                                             sort_keys=False))
            env.update(litellm_env(master_key))
        cmd = peer_command(t, exes, port=port, metrics_port=metrics_port, workers=workers, config=config)
        self.gateway = self._spawn(t.label.replace(":", "-"), cmd, env)
        url = f"http://127.0.0.1:{port}"
        headers = {}
        if t.kind == "litellm":
            wait_http(url + "/health/liveliness", self.gateway, 240)
            headers["authorization"] = f"Bearer {master_key}"
        # A completion through it, as for every peer: the Rust routers have then found their
        # workers healthy, and LiteLLM has loaded what its first request imports (seconds of CPU
        # that would otherwise land on the measured requests).
        body = json.dumps({"model": w.model, "max_tokens": 2,
                           "messages": [{"role": "user", "content": "hi"}]}).encode()
        wait_post(url + "/v1/chat/completions", body, self.gateway, 90, headers)
        self.log(f"{t.label} up at {url} (pid {self.gateway.pid})")
        return url

    def stop_gateway(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
            self.gateway = None

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Wait (bounded) until no node runs or queues anything and none is loading."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:   # bounded by timeout_s
            busy = False
            for url in self.node_urls.values():
                try:
                    with urllib.request.urlopen(url + "/sim/stats", timeout=2) as r:
                        d = json.loads(r.read())
                except (urllib.error.URLError, OSError, ValueError):
                    busy = True
                    continue
                e = d.get("engine", {})
                if d.get("live") or e.get("waiting") or d.get("loading"):
                    busy = True
            if not busy:
                return True
            time.sleep(0.2)
        return False

    def close(self) -> None:
        """Stop every child, by PID."""
        for child in reversed(self.children):
            child.stop()
        self.children.clear()
        self.sim = self.gateway = None
