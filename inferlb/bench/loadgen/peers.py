"""The peer routers a comparison can put in front of the same nodes: vllm-router, sglang-router, LiteLLM.

A target of ``inferlb bench compare --targets`` is ``KIND:POLICY``: ``inferlb:token-aware`` (or just
``token-aware``, as before), ``vllm-router:cache_aware``, ``vllm-router:power_of_two``,
``sglang-router:cache_aware``, ``litellm:least-busy``, or ``direct``. :func:`parse_target` reads
one; :func:`peer_command` builds the command line of a peer, bound to 127.0.0.1 on the given port
(and its Prometheus port, which both Rust routers open, 29000 unless told), over the nodes' base
URLs; :func:`litellm_config` writes LiteLLM's model list. Nothing here starts a process: the
:class:`~inferlb.bench.loadgen.stack.Stack` does, so a peer is stopped by PID with the rest.

Each peer runs its own best policy on the emulator as on the engines it was written for: the nodes
answer ``GET /get_load`` in the shape that peer reads (:func:`get_load_shape`; the two Rust routers
read different ones, see inferlb/simulator/control.py) and sglang-router's worker probes. Both Rust
routers are given ``--worker-startup-check-interval 1`` (else their first health round comes after
30 s). LiteLLM needs a master key that starts with ``sk-`` (a fresh one per run, sent by the load
generator as the bearer token and never logged) and ``LITELLM_LOCAL_MODEL_COST_MAP=True`` offline.

The peers are optional: :class:`PeerExes` finds each (a flag, else next to this interpreter, else
on ``PATH``) and :meth:`PeerExes.missing` says in one line why one cannot run, so the benchmark
skips its rows instead of failing.
"""

from __future__ import annotations

import importlib.util
import secrets
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "DEFAULT_POLICY",
    "PEER_KINDS",
    "PEER_POLICIES",
    "PeerExes",
    "TargetSpec",
    "get_load_shape",
    "litellm_config",
    "litellm_env",
    "new_master_key",
    "parse_target",
    "peer_command",
]

PEER_KINDS = ("vllm-router", "sglang-router", "litellm")

# The policies each peer's CLI accepts (vllm-router 0.1.17, sglang-router 0.3.2, LiteLLM 1.108's
# router strategies); a typo fails before any process starts rather than in a child's log.
PEER_POLICIES: dict[str, tuple[str, ...]] = {
    "vllm-router": ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two", "consistent_hash",
                    "sticky_least_loaded"),
    "sglang-router": ("random", "round_robin", "cache_aware", "power_of_two"),
    "litellm": ("simple-shuffle", "least-busy", "latency-based-routing", "usage-based-routing",
                "usage-based-routing-v2", "cost-based-routing"),
}
DEFAULT_POLICY = {"vllm-router": "cache_aware", "sglang-router": "cache_aware", "litellm": "least-busy"}

Kind = Literal["direct", "inferlb", "vllm-router", "sglang-router", "litellm"]


@dataclass(frozen=True)
class TargetSpec:
    """One target of a comparison: who routes (``kind``), with which ``policy``, shown as ``label``."""

    kind: Kind
    policy: str | None
    label: str

    @property
    def is_peer(self) -> bool:
        """Whether a peer router (not inferlb, not direct) routes this target."""
        return self.kind in PEER_KINDS


def parse_target(text: str) -> TargetSpec:
    """``direct``, ``PROFILE`` / ``inferlb:PROFILE`` or ``PEER[:POLICY]`` → a :class:`TargetSpec`.

    A bare name is an inferlb routing profile (the gateway checks it when it starts); a peer's
    policy must be one its CLI takes (:data:`PEER_POLICIES`) and defaults to
    :data:`DEFAULT_POLICY`. Raises ``ValueError`` on an unknown kind or policy."""
    text = text.strip()
    if not text:
        raise ValueError("an empty target")
    if text == "direct":
        return TargetSpec("direct", None, "direct")
    kind, sep, policy = text.partition(":")
    if not sep:
        if kind in PEER_KINDS:
            return TargetSpec(kind, DEFAULT_POLICY[kind], f"{kind}:{DEFAULT_POLICY[kind]}")   # type: ignore[arg-type]
        return TargetSpec("inferlb", kind, kind)
    if not policy:
        raise ValueError(f"target {text!r}: no policy after ':'")
    if kind == "inferlb":
        return TargetSpec("inferlb", policy, text)
    if kind not in PEER_KINDS:
        raise ValueError(f"target {text!r}: unknown router {kind!r} (known: inferlb, {', '.join(PEER_KINDS)})")
    if policy not in PEER_POLICIES[kind]:
        raise ValueError(f"target {text!r}: {kind} has no policy {policy!r} "
                         f"(known: {', '.join(PEER_POLICIES[kind])})")
    return TargetSpec(kind, policy, text)   # type: ignore[arg-type]


def get_load_shape(t: TargetSpec) -> Literal["sglang", "vllm-router"] | None:
    """The ``inferlb sim --get-load`` shape the nodes need for ``t`` (``None``: the default)."""
    if t.kind == "vllm-router":
        return "vllm-router"
    if t.kind == "sglang-router":
        return "sglang"
    return None


@dataclass(frozen=True)
class PeerExes:
    """Where each peer's program is; ``None`` where it was not found."""

    vllm_router: str | None = None
    sglang_python: str | None = None     # a Python that can import sglang_router
    litellm: str | None = None

    @classmethod
    def find(cls, *, vllm_router: str | None = None, sglang_python: str | None = None,
             litellm: str | None = None) -> PeerExes:
        """Each peer from its flag if given (kept even when missing, so :meth:`missing` names
        it), else next to this interpreter (installed with the ``peers`` extra), else on ``PATH``.
        sglang-router is run as ``PYTHON -m sglang_router.launch_router``: this interpreter when
        it imports ``sglang_router``, else the Python of an ``sglang-router`` script on ``PATH``."""
        here = Path(sys.executable).parent

        def exe(name: str) -> str | None:
            local = here / name
            return str(local) if local.is_file() else shutil.which(name)

        if sglang_python is None:
            if importlib.util.find_spec("sglang_router") is not None:
                sglang_python = sys.executable
            else:
                script = shutil.which("sglang-router")
                if script is not None and (Path(script).parent / "python").is_file():
                    sglang_python = str(Path(script).parent / "python")
        return cls(vllm_router=vllm_router or exe("vllm-router"), sglang_python=sglang_python,
                   litellm=litellm or exe("litellm"))

    def missing(self, kind: str) -> str | None:
        """One line saying why peer ``kind`` cannot run here, or ``None`` when it can."""
        path = {"vllm-router": self.vllm_router, "sglang-router": self.sglang_python,
                "litellm": self.litellm}.get(kind, "")
        how = {"vllm-router": "pip install vllm-router==0.1.17, or --vllm-router PATH",
               "sglang-router": "pip install sglang-router==0.3.2, or --sglang-python PATH",
               "litellm": "pip install 'litellm[proxy]==1.108.7' in its own venv, then --litellm-bin PATH"}
        if path is None:
            return f"{kind} not installed ({how[kind]})"
        if path and not Path(path).is_file() and shutil.which(path) is None:
            return f"{kind}: {path} not found ({how[kind]})"
        return None


def new_master_key() -> str:
    """A fresh LiteLLM master key for one run (LiteLLM wants the ``sk-`` prefix)."""
    return "sk-bench-" + secrets.token_hex(16)


def litellm_config(workers: list[str], model: str, policy: str, timeout_s: float) -> dict[str, Any]:
    """LiteLLM's proxy config: one deployment of ``model`` per node (OpenAI-compatible at
    ``URL/v1``), routed by ``policy``, no retries (a retry would hide the policy's choice and
    count one request twice on the nodes)."""
    return {
        "model_list": [{"model_name": model,
                        "litellm_params": {"model": f"openai/{model}", "api_base": f"{u}/v1", "api_key": "none"},
                        "model_info": {"id": f"node-{i}"}} for i, u in enumerate(workers)],
        "router_settings": {"routing_strategy": policy, "num_retries": 0},
        "litellm_settings": {"drop_params": True, "request_timeout": timeout_s, "num_retries": 0},
        "general_settings": {},
    }


def litellm_env(master_key: str) -> dict[str, str]:
    """The environment LiteLLM's proxy needs on an offline benchmark machine."""
    return {"LITELLM_MASTER_KEY": master_key, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR",
            "DISABLE_SCHEMA_UPDATE": "True"}


def peer_command(t: TargetSpec, exes: PeerExes, *, port: int, metrics_port: int, workers: list[str],
                 config: Path | None = None) -> list[str]:
    """The command line that starts peer ``t`` on ``127.0.0.1:port`` over ``workers`` (base URLs);
    ``config`` is LiteLLM's config file. Raises ``ValueError`` for a target that is no peer or a
    peer that is not installed."""
    if not t.is_peer or t.policy is None:
        raise ValueError(f"{t.label} is not a peer router")
    why = exes.missing(t.kind)
    if why is not None:
        raise ValueError(why)
    common = ["--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers, "--policy", t.policy,
              "--prometheus-port", str(metrics_port), "--prometheus-host", "127.0.0.1",
              "--worker-startup-check-interval", "1"]
    if t.kind == "vllm-router":
        assert exes.vllm_router is not None
        return [exes.vllm_router, *common, "--log-level", "warning"]
    if t.kind == "sglang-router":
        assert exes.sglang_python is not None
        return [exes.sglang_python, "-m", "sglang_router.launch_router", *common, "--log-level", "warn"]
    assert exes.litellm is not None
    if config is None:
        raise ValueError("litellm needs its config file")
    return [exes.litellm, "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
            "--num_workers", "1"]
