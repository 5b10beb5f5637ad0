"""One ``/metrics`` for the port of ``inferlb serve --workers N``: whichever worker takes the
scrape answers for all of them.

Contract of :class:`WorkerMetrics` (one per worker, built by the worker's ``serve``):

* **Each worker serves its own metrics** on a Unix socket ``w<i>.sock`` in the supervisor's run
  directory (mode 0700: only the gateway's user may connect; nothing else is asked of a client,
  which connects and reads to end-of-file): its registry's families as collected, in JSON
  (``[[name, type, help, unit, [[sample, labels, value], ...]], ...]``), not the text format,
  because parsing text with prometheus_client's pure-Python parser was most of a merged scrape's
  cost (docs/benchmarks.md). They are collected on the event loop, as ``/metrics`` does
  (api/metrics.py: the scrape-time gauges read live counters).
* **The worker that takes the scrape** asks every sibling at once (each within ``timeout_s``)
  and merges what they sent with its own families:
  counters, histograms, summaries and untyped series are **summed** over the workers, label set by
  label set; gauges (info metrics included) keep one series per worker with a ``worker`` label
  (``w0`` …): a gauge's sum means something for some (in-flight) and nothing for others (a start
  time, a state flag), so the reader sums where it should (``sum without (worker) (...)``). The
  ``_created`` samples of counters and histograms are left out: a sum has no one creation time.
  Then it renders the result in the format the scraper asked for (text or OpenMetrics).
* **A sibling that does not answer** (replaced, stopped, stuck past ``timeout_s``, or not started
  yet) is left out of the sums and reported, never a failed scrape: ``inferlb_workers_up{worker}``
  is 1 for each worker that answered and 0 for the others, and the answering worker counts the
  failure in ``inferlb_workers_scrape_errors_total{worker}`` (a counter of its own exposition, so
  summed like the others).
* **Counter resets.** A replaced worker starts its counters from 0, so the sums drop by what the
  dead worker had counted: Prometheus reads the drop as a counter reset (``rate()`` and
  ``increase()`` handle it, over-counting once by what the other workers count in that interval).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

__all__ = ["Family", "WorkerMetrics", "families_of", "merge_expositions", "socket_path"]

log = logging.getLogger("inferlb")

_PER_WORKER = frozenset({"gauge", "info", "stateset"})


def socket_path(run_dir: Path, index: int) -> Path:
    """Worker ``index``'s metrics socket in the supervisor's run directory."""
    return run_dir / f"w{index}.sock"


#: one family as exchanged: (name, type, help, unit, [(sample name, labels, value), ...])
Family = tuple[str, str, str, str, list[tuple[str, dict[str, str], float]]]


def families_of(metrics: Iterable[Metric]) -> list[Family]:
    """Collected families as exchanged (the ``_created`` samples of summed types left out)."""
    out: list[Family] = []
    for m in metrics:
        summed = m.type not in _PER_WORKER
        out.append((m.name, m.type, m.documentation, m.unit,
                    [(x.name, dict(x.labels), float(x.value)) for x in m.samples
                     if not (summed and x.name.endswith("_created"))]))
    return out


def _decode(body: bytes) -> list[Family] | None:
    """A sibling's families; None when they are not what :func:`families_of` makes (its problem)."""
    try:
        raw = json.loads(body)
        return [(str(n), str(t), str(d), str(u), [(str(sn), {str(k): str(v) for k, v in lab.items()}, float(val))
                                                  for sn, lab, val in samples])
                for n, t, d, u, samples in raw]
    except (ValueError, TypeError, AttributeError):
        return None


def merge_expositions(parts: Sequence[tuple[str, Iterable[Family]]]) -> list[Metric]:
    """The families of ``parts`` ((worker name, its families) in worker order) merged as the module
    docstring says, in the order they first appear."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for worker, fams in parts:
        for name, typ, doc, unit, samples in fams:
            out = families.get(name)
            if out is None:
                try:
                    out = Metric(name, doc, typ, unit if unit and name.endswith("_" + unit) else "")
                except ValueError:     # a type or name this prometheus_client does not know
                    continue
                families[name] = out
                values[name] = {}
            acc = values[name]
            per_worker = out.type in _PER_WORKER
            for sample, labels, v in samples:
                if per_worker:
                    labels = {**labels, "worker": worker}
                key = (sample, tuple(sorted(labels.items())))
                acc[key] = v if per_worker else acc.get(key, 0.0) + v
    for name, out in families.items():
        for (sample, pairs), v in values[name].items():
            out.add_sample(sample, dict(pairs), v)
    return list(families.values())


class _Families:
    """A collector that yields fixed families (to render merged ones through an encoder)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


class WorkerMetrics:
    """See the module docstring. ``local()`` is this worker's registry's families as collected
    (None while its app has not started)."""

    def __init__(self, index: int, count: int, run_dir: Path, local: Callable[[], Iterable[Metric] | None], *,
                 timeout_s: float = 2.0) -> None:
        self.index, self.count, self.run_dir = index, count, run_dir
        self.local = local
        self.timeout_s = timeout_s
        self.errors = [0] * count          # failed reads of each sibling by this worker
        self._server: asyncio.Server | None = None

    @property
    def path(self) -> Path:
        return socket_path(self.run_dir, self.index)

    def collect(self) -> Iterable[Metric]:
        c = CounterMetricFamily("inferlb_workers_scrape_errors",
                                "Sibling workers' expositions this worker could not read for /metrics",
                                labels=["worker"])
        for i, n in enumerate(self.errors):
            if i != self.index:
                c.add_metric([f"w{i}"], float(n))
        yield c

    def _families(self) -> list[Family] | None:
        metrics = self.local()
        return None if metrics is None else families_of([*metrics, *self.collect()])

    # ------------------------------------------------------------------ this worker's socket

    async def start(self) -> None:
        """Serve this worker's exposition on its socket (a predecessor's stale file replaced)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                fams = self._families()
                if fams is not None:
                    writer.write(json.dumps(fams).encode())
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            except Exception:     # a collector failed: the sibling sees nothing and reports us down
                log.exception("workers: rendering this worker's metrics for a sibling failed")
            finally:
                writer.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.wait_closed()

        self._server = await asyncio.start_unix_server(answer, path=str(self.path))
        with contextlib.suppress(OSError):
            os.chmod(self.path, 0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    # ------------------------------------------------------------------ a scrape of the port

    async def _read(self, index: int) -> bytes | None:
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_unix_connection(str(socket_path(self.run_dir, index)))
                try:
                    body = await reader.read()      # to end-of-file: the sibling closes when done
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return None
        return body or None

    async def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """Every worker's metrics merged (module docstring), in the format ``accept`` asks for."""
        siblings = [i for i in range(self.count) if i != self.index]
        bodies = await asyncio.gather(*(self._read(i) for i in siblings))
        got: dict[int, list[Family]] = {}
        for i, body in zip(siblings, bodies, strict=True):
            fams = _decode(body) if body is not None else None
            if fams is None:
                self.errors[i] += 1
            else:
                got[i] = fams
        mine = self._families()     # after the count above: this scrape's failures are in it
        if mine is not None:
            got[self.index] = mine
        parts = [(f"w{i}", got[i]) for i in sorted(got)]
        merged = merge_expositions(parts)
        answered = {name for name, _ in parts}
        up = GaugeMetricFamily("inferlb_workers_up", "1 for each worker whose metrics this scrape sums, else 0",
                               labels=["worker"])
        for i in range(self.count):
            up.add_metric([f"w{i}"], 1.0 if f"w{i}" in answered else 0.0)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families([*merged, up]))
        encoder, content_type = choose_encoder(accept or "")
        return encoder(registry), content_type
