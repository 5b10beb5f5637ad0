"""One ``/metrics`` for the port of ``inferlb serve --workers N``: whichever worker takes the
scrape answers for all of them.

Contract of :class:`WorkerMetrics` (one per worker, built by the worker's ``serve``):

* **Each worker serves its own exposition** (Prometheus text format) on a Unix socket
  ``w<i>.sock`` in the supervisor's run directory (mode 0700: only the gateway's user may connect;
  nothing else is asked of a client, which connects and reads to end-of-file). It is rendered on
  the event loop, as ``/metrics`` is (api/metrics.py: the scrape-time gauges read live counters).
* **The worker that takes the scrape** asks every sibling at once (each within ``timeout_s``),
  parses the expositions with prometheus_client's parser and merges them with its own:
  counters, histograms, summaries and untyped series are **summed** over the workers, label set by
  label set; gauges (info metrics included) keep one series per worker with a ``worker`` label
  (``w0`` …): a gauge's sum means something for some (in-flight) and nothing for others (a start
  time, a state flag), so the reader sums where it should (``sum without (worker) (...)``). The
  ``*_created`` gauges of counters and histograms are left out: a sum has no one creation time.
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
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["WorkerMetrics", "merge_expositions", "socket_path"]

log = logging.getLogger("inferlb")

_PER_WORKER = frozenset({"gauge", "info", "stateset"})


def socket_path(run_dir: Path, index: int) -> Path:
    """Worker ``index``'s metrics socket in the supervisor's run directory."""
    return run_dir / f"w{index}.sock"


def merge_expositions(parts: Sequence[tuple[str, Iterable[Metric]]]) -> list[Metric]:
    """The families of ``parts`` ((worker name, its parsed families) in worker order) merged as
    the module docstring says, in the order they first appear."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for worker, parsed in parts:
        for fam in parsed:
            if fam.type == "gauge" and fam.name.endswith("_created"):
                continue
            out = families.get(fam.name)
            if out is None:
                out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
                values[fam.name] = {}
            acc = values[fam.name]
            per_worker = out.type in _PER_WORKER
            for s in fam.samples:
                labels = {**s.labels, "worker": worker} if per_worker else s.labels
                key = (s.name, tuple(sorted(labels.items())))
                acc[key] = s.value if per_worker else acc.get(key, 0.0) + s.value
    for name, out in families.items():
        for (sample, pairs), v in values[name].items():
            out.add_sample(sample, dict(pairs), v)
    return list(families.values())


def _parse(text: str) -> list[Metric] | None:
    """The families of one exposition; None when it does not parse (that worker's problem)."""
    try:
        return list(text_string_to_metric_families(text))
    except Exception:
        return None


class _Families:
    """A collector that yields fixed families (to render merged ones through an encoder)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


class WorkerMetrics:
    """See the module docstring. ``local()`` is this worker's exposition in the text format (None
    while its app has not started)."""

    def __init__(self, index: int, count: int, run_dir: Path, local: Callable[[], bytes | None], *,
                 timeout_s: float = 2.0) -> None:
        self.index, self.count, self.run_dir = index, count, run_dir
        self.local = local
        self.timeout_s = timeout_s
        self.errors = [0] * count          # failed reads of each sibling by this worker
        self._server: asyncio.Server | None = None
        self._own = CollectorRegistry(auto_describe=False)
        self._own.register(self)

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

    def _text(self) -> bytes | None:
        body = self.local()
        return None if body is None else body + generate_latest(self._own)

    # ------------------------------------------------------------------ this worker's socket

    async def start(self) -> None:
        """Serve this worker's exposition on its socket (a predecessor's stale file replaced)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                body = self._text()
                if body:
                    writer.write(body)
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

    async def _read(self, index: int) -> str | None:
        try:
            async with asyncio.timeout(self.timeout_s):
                reader, writer = await asyncio.open_unix_connection(str(socket_path(self.run_dir, index)))
                try:
                    body = await reader.read()      # to end-of-file: the sibling closes when done
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return None
        return body.decode("utf-8", "replace") if body else None

    async def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """Every worker's metrics merged (module docstring), in the format ``accept`` asks for."""
        siblings = [i for i in range(self.count) if i != self.index]
        texts = await asyncio.gather(*(self._read(i) for i in siblings))
        parsed: dict[int, list[Metric]] = {}
        for i, text in zip(siblings, texts, strict=True):
            fams = _parse(text) if text is not None else None
            if fams is None:
                self.errors[i] += 1
            else:
                parsed[i] = fams
        own = self._text()     # after the count above: this scrape's failures are in it
        if own is not None and (mine := _parse(own.decode())) is not None:
            parsed[self.index] = mine
        parts = [(f"w{i}", parsed[i]) for i in sorted(parsed)]
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
