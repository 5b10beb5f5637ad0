"""A fleet of emulated nodes in the current event loop, for tests and ``inferlb sim``.

Contract: :class:`SimFleet` starts every node on a free ``127.0.0.1`` port on entry and stops them
all on exit (even when a test fails). A stopped node keeps its port, so ``start_node`` brings it
back where the gateway expects it (connection refused in between: the "refuse" fault).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from types import TracebackType

from inferlb.simulator.node import EmulatedNode
from inferlb.simulator.spec import NodeSpec, demo_specs
from inferlb.types import Clock

__all__ = ["SimFleet", "serve_sim"]


class SimFleet:
    """``async with SimFleet(specs) as fleet:`` → ``fleet.urls``, ``fleet.nodes[name]``.

    ``seed`` makes each node's fault dice (``FaultSpec.error_rate``) reproducible.
    """

    def __init__(self, specs: Sequence[NodeSpec], *, clock: Clock | None = None, seed: int = 0) -> None:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError("node names must be unique")
        self.nodes: dict[str, EmulatedNode] = {
            s.name: EmulatedNode(s, clock=clock, rng=random.Random(f"{seed}:{s.name}")) for s in specs
        }

    @property
    def urls(self) -> list[str]:
        """Base URLs (no ``/v1``) in spec order."""
        return [n.url for n in self.nodes.values()]

    def url(self, name: str) -> str:
        return self.nodes[name].url

    async def start(self) -> None:
        """Start every node on a free port (a node already running is left alone)."""
        try:
            for node in self.nodes.values():
                await node.start("127.0.0.1", node.port)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop every node (kill semantics: open connections are cut)."""
        await asyncio.gather(*(n.stop() for n in self.nodes.values()), return_exceptions=True)

    async def stop_node(self, name: str) -> None:
        """Stop one node: its port then refuses connections."""
        await self.nodes[name].stop()

    async def start_node(self, name: str) -> None:
        """Start a stopped node again on the same port."""
        node = self.nodes[name]
        await node.start("127.0.0.1", node.port)

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()


async def serve_sim(
    specs: Sequence[NodeSpec] | None = None,
    host: str = "127.0.0.1",
    ports: Sequence[int] | None = None,
    *,
    on_ready: Callable[[dict[str, str]], None] | None = None,
) -> None:
    """Run nodes (default :func:`demo_specs`) on ``host:ports[i]`` (0: free) until cancelled.

    ``on_ready`` receives ``{node name: base URL}`` once every node listens (the CLI prints it).
    """
    specs = list(specs) if specs is not None else demo_specs()
    port_list = list(ports) if ports is not None else [0] * len(specs)
    if len(port_list) != len(specs):
        raise ValueError(f"{len(specs)} nodes but {len(port_list)} ports")
    nodes = [EmulatedNode(s) for s in specs]
    try:
        for node, port in zip(nodes, port_list, strict=True):
            await node.start(host, port)
        if on_ready is not None:
            on_ready({n.spec.name: n.url for n in nodes})
        await asyncio.Event().wait()  # until the caller cancels us
    finally:
        await asyncio.gather(*(n.stop() for n in nodes), return_exceptions=True)
