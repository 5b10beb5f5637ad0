"""The health sources over HTTP (control plane, aiohttp): probes, metric scrapes, GPU reports.

Contract: :meth:`Prober.collect` fetches every configured source of every node concurrently and
returns one :class:`~inferlb.node_types.Sample` per source. It never raises for a node's
fault: refused connections, timeouts (``probe.timeout_s`` for the whole fetch, body included),
non-2xx statuses, oversized bodies and unparsable pages all become ``ok=False`` samples with an
``error`` string; aiohttp's exceptions are mapped here, the one boundary (a refused or failed
connect reads ``ConnectError: …``). A probe costs no tokens: it GETs the node kind's readiness
path (``/health``, ``/v1/models``…), never a generation. Parsing (Prometheus text, DCGM) runs in
a worker thread, off the event loop. The client is aiohttp, like the data path's, because a
health round runs forever on an idle gateway: three probes cost about 1 ms of CPU with aiohttp
against about 5 ms with httpx (docs/benchmarks.md, the idle CPU section), and
connections are kept alive between rounds.

Sources per node (see :class:`~inferlb.config.health.NodeHealthConfig`): ``probe`` (the
readiness path; 503 means loading), ``metrics`` (vLLM / TGI / SGLang page, or a format of your
own), ``agent`` (an ``inferlb agent`` JSON report), ``dcgm`` (a DCGM exporter page, converted to the
agent's shape). A page's parser comes from the one table of formats,
:data:`~inferlb.config.health.METRICS_PARSERS`, resolved when the targets are built
(:func:`targets_for`: at start-up and at each reload), never per round.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver

from inferlb.config.health import DEFAULT_METRICS, DEFAULT_PROBE_PATHS, METRICS_PARSERS, HealthConfig
from inferlb.config.settings import NodeConfig
from inferlb.config.tls import NodeTLS
from inferlb.fleet.netguard import GuardedResolver, PolicySource
from inferlb.node_types import Sample
from inferlb.types import Clock

__all__ = ["Prober", "Target", "targets_for"]


@dataclass(frozen=True, slots=True)
class Target:
    node: str
    source: str            # probe | metrics | agent | dcgm
    url: str
    fmt: str | None = None
    api_key: str | None = field(default=None, repr=False)   # the node's key: never in a log line
    # the page's parser (METRICS_PARSERS[fmt]), for metrics and dcgm sources
    parse: Callable[[str], dict[str, Any]] | None = field(default=None, repr=False, compare=False)
    # the node's tls block (config/tls.py), for the sources on the node itself (probe, metrics)
    tls: NodeTLS | None = field(default=None, repr=False, compare=False)


def targets_for(nodes: Sequence[NodeConfig], cfg: HealthConfig) -> list[Target]:
    """Every source of every node, each page's parser resolved (PluginError for a format that
    does not load; the fleet file's load has checked them already)."""
    out: list[Target] = []
    for n in nodes:
        h = cfg.node(n.name)
        if h.probe:
            path = h.probe_path or DEFAULT_PROBE_PATHS.get(n.kind, "/v1/models")
            out.append(Target(n.name, "probe", n.url + path, api_key=n.credential(), tls=n.tls))
        fmt = h.metrics or DEFAULT_METRICS.get(n.kind, "none")
        if fmt != "none":
            # A metrics_url on another host is another server (an exporter): the node's tls block is not its.
            same_host = h.metrics_url is None or urlsplit(h.metrics_url).hostname == urlsplit(n.url).hostname
            out.append(Target(n.name, "metrics", h.metrics_url or n.url + "/metrics", fmt, api_key=n.credential(),
                              parse=METRICS_PARSERS.load(fmt), tls=n.tls if same_host else None))
        if h.agent_url:
            out.append(Target(n.name, "agent", h.agent_url))
        if h.dcgm_url:
            out.append(Target(n.name, "dcgm", h.dcgm_url, "dcgm", parse=METRICS_PARSERS.load("dcgm")))
    return out


class _TooLarge(Exception):
    pass


class Prober:
    """Fetches samples over one keep-alive aiohttp session (created on first use, in the loop)."""

    def __init__(self, nodes: Sequence[NodeConfig], cfg: HealthConfig, clock: Clock,
                 guard: PolicySource | None = None, resolver: AbstractResolver | None = None) -> None:
        self.cfg = cfg
        # The network policy at connect time (fleet/netguard.py; None: unchecked) over ``resolver``
        # (default: aiohttp's threaded getaddrinfo).
        self.guard = guard
        self.resolver = resolver
        self.clock = clock
        self.targets = targets_for(nodes, cfg)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No proxies from the environment (trust_env is off), no redirects (see _get).
            conn = aiohttp.TCPConnector(limit=max(10, 4 * len(self.targets)), limit_per_host=0,
                                        resolver=GuardedResolver(self.guard, self.resolver) if self.guard is not None
                                        else self.resolver)
            self._session = aiohttp.ClientSession(connector=conn, trust_env=False,
                                                  timeout=aiohttp.ClientTimeout(total=self.cfg.probe.timeout_s))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def collect(self) -> list[Sample]:
        if not self.targets:
            return []
        return list(await asyncio.gather(*(self.fetch(t) for t in self.targets)))

    async def fetch(self, t: Target) -> Sample:
        """One source of one node; always a Sample."""
        start = self.clock.monotonic()
        status: int | None = None
        try:
            async with asyncio.timeout(self.cfg.probe.timeout_s):
                status, body = await self._get(t)
            if t.source == "probe":
                if 200 <= status < 300:
                    return self._sample(t, start, True, status)
                if status == 503:
                    return self._sample(t, start, False, status, "HTTP 503: loading", {"loading": True})
                return self._sample(t, start, False, status, f"HTTP {status}")
            if not 200 <= status < 300:
                return self._sample(t, start, False, status, f"HTTP {status}")
            values = await asyncio.to_thread(_parse, t, body)
            return self._sample(t, start, True, status, None, values)
        except TimeoutError:
            return self._sample(t, start, False, status, f"timeout after {self.cfg.probe.timeout_s:g}s")
        except _TooLarge:
            return self._sample(t, start, False, status, f"body over {self.cfg.probe.max_body_bytes} bytes")
        except aiohttp.ClientConnectionError as exc:
            kind = "ConnectError" if isinstance(exc, aiohttp.ClientConnectorError) else type(exc).__name__
            return self._sample(t, start, False, status, f"{kind}: {exc}".strip(": "))
        except aiohttp.ClientError as exc:
            return self._sample(t, start, False, status, f"{type(exc).__name__}: {exc}".strip(": "))
        except (ValueError, UnicodeDecodeError) as exc:
            return self._sample(t, start, False, status, f"unparsable {t.source} page: {exc}"[:300])
        except Exception as exc:  # a fault is data: nothing a node sends may break the monitor
            return self._sample(t, start, False, status, f"{type(exc).__name__}: {exc}"[:300])

    async def _get(self, t: Target) -> tuple[int, bytes]:
        headers = {"authorization": f"Bearer {t.api_key}"} if t.api_key else None
        limit = self.cfg.probe.max_body_bytes
        tls = t.tls
        async with self._client().get(t.url, headers=headers, allow_redirects=False,
                                      ssl=tls.context if tls is not None else True,
                                      server_hostname=tls.server_name if tls is not None else None) as resp:
            body = bytearray()
            seen = 0
            async for chunk in resp.content.iter_any():
                seen += len(chunk)
                if t.source == "probe":
                    # A probe needs the status only; its body is read (and dropped) so the keep-alive
                    # connection goes back to the pool instead of a new TCP connect every round.
                    if seen > limit:
                        break
                    continue
                body += chunk
                if seen > limit:
                    raise _TooLarge
            return resp.status, bytes(body)

    def _sample(self, t: Target, start: float, ok: bool, status: int | None, error: str | None = None,
                values: dict[str, Any] | None = None) -> Sample:
        now = self.clock.monotonic()
        return Sample(node=t.node, source=t.source, ok=ok, taken_at=now, wall_at=round(self.clock.time(), 6),
                      latency_ms=(now - start) * 1000.0, status=status, error=error, values=values or {})


def _parse(t: Target, body: bytes) -> dict[str, Any]:
    text = body.decode("utf-8")
    if t.source in ("metrics", "dcgm"):
        parse = t.parse if t.parse is not None else METRICS_PARSERS.load(t.fmt or "vllm")
        return parse(text)
    report = json.loads(text)
    if not isinstance(report, dict) or "nvml" not in report:
        raise ValueError("not a node-agent report (no 'nvml' key)")
    return report
