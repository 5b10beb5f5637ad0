"""The network policy at connection time: node host names are checked by the address they resolve to.

A host name is judged by name when a node is added (config/netpolicy.py :func:`url_problem`), but
DNS may answer differently later (rebinding: a name that resolved to a model server now resolves to
169.254.169.254 or the gateway itself). :class:`GuardedResolver` is the resolver of the data-path
client (engine/upstream.py) and the prober (health/probe.py): it resolves as aiohttp would and drops
every address :func:`~inferlb.config.netpolicy.address_problem` refuses under the fleet's policy in
force; when none is left the connection fails with :class:`_RefusedAddress`, an ``OSError`` that
aiohttp reports as a connect error (for a request: ``UpstreamConnectError``; for a probe: a failed
sample). Addresses written literally in the URL never reach a resolver; they were judged when the
node was added, and again whenever the policy changes (every node passes FleetConfig validation).

:func:`resolved_problem` is the same check once, for an add (``POST /admin/nodes``);
:func:`check_fleet_names` applies it to every node of the fleet file at start-up.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from inferlb.config.netpolicy import Listener, NetworkPolicy, address_problem, host_address, redact_url
from inferlb.config.settings import FleetConfig
from inferlb.errors import ConfigError

__all__ = ["GuardedResolver", "PolicySource", "check_fleet_names", "resolved_problem"]

#: What the guard asks on every resolution: the policy and the gateway's listeners in force now.
PolicySource = Callable[[], tuple[NetworkPolicy, tuple[Listener, ...]]]


class _RefusedAddress(OSError):
    """Every address a node's host name resolved to is refused by the network policy."""


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver (``inner``, default :class:`aiohttp.ThreadedResolver`) with the refused
    addresses removed (module docstring); ``policy`` is asked on every call, so a reload applies."""

    def __init__(self, policy: PolicySource, inner: AbstractResolver | None = None) -> None:
        self._policy = policy
        self._inner = inner if inner is not None else aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
                      ) -> list[ResolveResult]:
        infos = await self._inner.resolve(host, port, family)
        policy, listeners = self._policy()
        kept: list[ResolveResult] = []
        why: str | None = None
        for info in infos:
            problem = address_problem(ipaddress.ip_address(info["host"]), port, policy, listeners)
            if problem is None:
                kept.append(info)
            else:
                why = problem
        if not kept:
            # (errno, strerror): aiohttp's connect error shows the strerror
            raise _RefusedAddress(errno.EACCES, f"{host} resolved only to addresses the network policy refuses: {why}")
        return kept

    async def close(self) -> None:
        await self._inner.close()


async def resolved_problem(url: str, policy: NetworkPolicy, listeners: tuple[Listener, ...],
                           resolve: Callable[..., Any] | None = None) -> str | None:
    """Why ``url``'s host name resolves to a refused address now, or None (a literal address, a name
    that does not resolve yet, or only allowed addresses). ``resolve``: ``loop.getaddrinfo`` by default."""
    try:
        p = urlsplit(url)
        port = p.port or (443 if p.scheme == "https" else 80)
    except ValueError:
        return None   # not a URL: the node's validation says so
    host = p.hostname or ""
    if not host or host_address(host) is not None:
        return None
    lookup = resolve if resolve is not None else asyncio.get_running_loop().getaddrinfo
    try:
        infos = await lookup(host, port, type=socket.SOCK_STREAM)
    except OSError:
        return None   # checked again at every connection
    for info in infos:
        problem = address_problem(ipaddress.ip_address(info[4][0]), port, policy, listeners)
        if problem is not None:
            return f"{host} resolves to a refused address: {problem}"
    return None


async def check_fleet_names(cfg: FleetConfig, *, timeout_s: float = 2.0, source: str | None = None,
                            resolve: Callable[..., Any] | None = None) -> None:
    """Every node host name of ``cfg`` resolved once (concurrently, within ``timeout_s`` in all)
    and judged by :func:`resolved_problem`: ConfigError naming ``nodes[i].url`` and the rule. A name
    that does not resolve in time is let through: every connection checks it again."""
    async def one(i: int, url: str) -> tuple[int, str, str | None]:
        return i, url, await resolved_problem(url, cfg.network_policy, cfg.listeners, resolve)

    jobs = [asyncio.ensure_future(one(i, n.url)) for i, n in enumerate(cfg.nodes)
            if host_address(urlsplit(n.url).hostname or "") is None]
    if not jobs:
        return
    done, pending = await asyncio.wait(jobs, timeout=timeout_s)
    for job in pending:
        job.cancel()
    for i, url, why in sorted(job.result() for job in done):
        if why is not None:
            raise ConfigError(f"{redact_url(url)!r} refused by the network policy: {why}", source=source,
                              path=f"nodes[{i}].url")
