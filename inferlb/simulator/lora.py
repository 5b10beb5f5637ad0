"""LoRA adapters on an emulated node: what it can load (:class:`LoraSpec`) and its GPU adapter
slots (:class:`AdapterSlots`), one model for the real-time emulator and the discrete-event simulator.

Contract (vLLM's multi-LoRA serving, as far as routing can tell it apart):

* A node with a :class:`LoraSpec` serves each of ``adapters`` under its own name in ``model``
  (vLLM's ``--lora-modules name=path``), on top of its base models.
* ``max_lora`` adapters fit on the GPU at once (vLLM's ``--max-loras``). A request for an adapter
  that is not loaded loads it, which takes ``load_s`` before its prefill can start (requests for
  an adapter being loaded wait for the same load); when every slot is taken, the least recently
  used adapter that no request holds is evicted (vLLM's LRU adapter cache); when every loaded
  adapter is held by a request, the new one waits until one is released (vLLM's scheduler does
  not batch more than ``max_loras`` adapters). A request holds its adapter from
  :meth:`AdapterSlots.acquire` to :meth:`AdapterSlots.release`.
* ``fail``: adapters whose load fails; the emulator answers them as vLLM does an adapter it does
  not have (404 ``The model `X` does not exist.``, ``NotFoundError``); the faults' ``lora_fail``
  adds more at run time.
* What ``vllm:lora_requests_info`` reports (:meth:`AdapterSlots.report`): ``running`` the adapters
  held by requests whose adapter is ready, ``waiting`` those of requests waiting for a slot or a
  load; loaded adapters no request holds are in neither (vLLM counts requests, not its cache).

Pure: no clock, no I/O; times are passed in.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["AdapterSlots", "LoraSpec", "not_found_message"]


@dataclass(frozen=True, slots=True)
class LoraSpec:
    """The adapters a node can load, its adapter slots and the load time (see the module docstring)."""

    adapters: tuple[str, ...] = ()
    max_lora: int = 4
    load_s: float = 0.5
    fail: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_lora < 1:
            raise ValueError("max_lora must be >= 1")
        if not (math.isfinite(self.load_s) and self.load_s >= 0):
            raise ValueError("load_s must be a finite number >= 0")
        if not self.adapters:
            raise ValueError("a LoRA node needs at least one adapter")


def not_found_message(adapter: str) -> str:
    """vLLM's answer (404, ``NotFoundError``) for an adapter it does not have or cannot load."""
    return f"The model `{adapter}` does not exist."


class AdapterSlots:
    """One node's GPU adapter slots (see the module docstring). Counters: ``loads`` (adapter loads
    started: the misses), ``hits`` (requests whose adapter was loaded or loading), ``evictions``."""

    def __init__(self, spec: LoraSpec) -> None:
        self.spec = spec
        self._loaded: OrderedDict[str, float] = OrderedDict()    # adapter → when it is ready (LRU order)
        self._held: dict[str, int] = {}                          # adapter → requests holding it
        self._blocked: dict[str, int] = {}                       # adapter → requests waiting for a slot
        self.loads = 0
        self.hits = 0
        self.evictions = 0

    def loaded(self) -> list[str]:
        """The adapters on the GPU now, least recently used first."""
        return list(self._loaded)

    def acquire(self, adapter: str, now: float) -> float | None:
        """Hold ``adapter`` for a request: the time it is ready (``now`` when loaded, later while it
        loads), or None when no slot can be freed (every loaded adapter is held): call again when
        one is released; :meth:`block` counts the request as waiting meanwhile."""
        loaded = self._loaded
        ready = loaded.get(adapter)
        if ready is not None:
            loaded.move_to_end(adapter)
            self.hits += 1
        else:
            if len(loaded) >= self.spec.max_lora:
                victim = next((a for a in loaded if not self._held.get(a)), None)
                if victim is None:
                    return None
                del loaded[victim]
                self.evictions += 1
            ready = now + self.spec.load_s
            loaded[adapter] = ready
            self.loads += 1
        self._held[adapter] = self._held.get(adapter, 0) + 1
        return max(now, ready)

    def release(self, adapter: str) -> None:
        """A request that held ``adapter`` ended (its slot may now be evicted)."""
        n = self._held.get(adapter, 0) - 1
        if n > 0:
            self._held[adapter] = n
        else:
            self._held.pop(adapter, None)

    def block(self, adapter: str, delta: int = 1) -> None:
        """Count a request as waiting for a slot for ``adapter`` (``delta`` −1: it stopped waiting)."""
        n = self._blocked.get(adapter, 0) + delta
        if n > 0:
            self._blocked[adapter] = n
        else:
            self._blocked.pop(adapter, None)

    def report(self, now: float) -> tuple[list[str], list[str]]:
        """(running, waiting) adapter names at ``now``, sorted, as ``vllm:lora_requests_info`` says them."""
        running = sorted(a for a in self._held if self._loaded.get(a, math.inf) <= now)
        waiting = {a for a in self._held if self._loaded.get(a, math.inf) > now} | set(self._blocked)
        return running, sorted(waiting)
