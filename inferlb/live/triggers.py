"""What starts a reload besides ``POST /admin/reload``: SIGHUP, and file changes (``serve --watch``).

Both call :meth:`~inferlb.live.manager.LiveConfig.reload` on the running app and log the outcome
in one line (a refused reload names the file, the key path or element id, and the problem; the
old config keeps serving). A refusal is logged once per problem and file content: the same
refusal of the same files again (another save of the broken file, another ``.yaml`` written next
to it, a SIGHUP) is logged at DEBUG only, until the files change or a reload succeeds.
``inferlb serve`` starts :func:`run_triggers` next to the server.

* SIGHUP: installed on the running loop (``loop.add_signal_handler``) once the app is ready, and
  removed when the server stops. A SIGHUP during a reload queues one more (the lock serialises).
* ``--watch``: :func:`watchfiles.awatch` on the fleet file's directory and the processes directory;
  a burst of events (an editor's save writes several) is one reload after ``debounce_ms`` of
  quiet; only ``.yaml``/``.yml``/``.bpmn`` files, and the fleet file itself, count.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from inferlb.background import Background
from inferlb.errors import ClientError, InferlbError

__all__ = ["reload_logged", "run_triggers", "watched_paths"]

log = logging.getLogger("inferlb.live")


def _files_digest(live: Any) -> str:
    """SHA-256 over the files a reload reads that an operator edits: the fleet file and the
    processes directory's ``.bpmn`` files (when one is configured), names and bytes."""
    h = hashlib.sha256()
    settings = live.settings
    paths: list[Path] = [settings.config] if settings.config is not None else []
    if settings.processes_dir is not None:
        with contextlib.suppress(OSError):
            paths += sorted(Path(settings.processes_dir).glob("*.bpmn"))
    for path in paths:
        h.update(str(path).encode("utf-8", "surrogateescape") + b"\0")
        try:
            h.update(Path(path).read_bytes())
        except OSError as exc:      # a missing file is a content too (the refusal says so)
            h.update(type(exc).__name__.encode())
        h.update(b"\0")
    return h.hexdigest()


def _refused(live: Any, trigger: str, problem: str) -> None:
    """Log the refusal once per (problem, file content) (module docstring)."""
    seen = f"{problem}\0{_files_digest(live)}"
    if seen == getattr(live, "last_refusal", None):
        log.debug("reload (%s) refused again, files unchanged: %s", trigger, problem)
        return
    live.last_refusal = seen
    log.error("reload (%s) refused, nothing changed: %s", trigger, problem)


async def reload_logged(app: Any, trigger: str) -> bool:
    """Reload ``app``'s config; log the result in one line (a refusal once per problem and file
    content); True when it was swapped in."""
    live = getattr(app.state, "live", None)
    if live is None:
        log.warning("reload (%s) ignored: the gateway is not ready", trigger)
        return False
    try:
        out = await live.reload(trigger=trigger, actor={"by": trigger, "key_id": None})
    except ClientError as exc:
        _refused(live, trigger, " ".join(exc.message.split()))
        return False
    except InferlbError as exc:
        _refused(live, trigger, " ".join(str(exc).split()))
        return False
    live.last_refusal = None
    log.info("reload (%s) done in %.1f ms: process %s, config %s", trigger, out["took_ms"],
             out["process"]["version"], out["config_version"])
    return True


def watched_paths(config: Path | None, processes_dir: Path) -> list[Path]:
    """The directories to watch: the fleet file's and the processes directory."""
    out = [processes_dir.resolve()]
    if config is not None:
        out.append(config.resolve().parent)
    return sorted(set(out))


def _relevant(changes: Iterable[tuple[Any, str]], config: Path | None) -> bool:
    for _, path in changes:
        p = Path(path)
        if p.suffix in (".bpmn", ".yaml", ".yml") or (config is not None and p == config.resolve()):
            return True
    return False


async def run_triggers(app: Any, *, started: Callable[[], bool], stopping: Callable[[], bool],
                       watch: bool, config: Path | None, processes_dir: Path, debounce_ms: int = 300) -> None:
    """SIGHUP (and with ``watch``, file changes) → reload, until cancelled (see the module
    docstring). With ``watch`` it also returns once ``stopping()`` (checked every 0.2 s: the file
    watcher's thread must be told to stop); without it nothing polls, so an idle gateway does not
    wake five times a second for it, and the caller cancels it when the server stops
    (``inferlb serve`` does)."""
    while not started():
        if stopping():
            return
        await asyncio.sleep(0.05)
    loop = asyncio.get_running_loop()
    pending: set[asyncio.Task[bool]] = set()

    def on_hup() -> None:
        task = asyncio.ensure_future(reload_logged(app, "SIGHUP"))
        pending.add(task)
        task.add_done_callback(pending.discard)

    hup = False
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):   # not the main thread / platform
        loop.add_signal_handler(signal.SIGHUP, on_hup)
        hup = True
    stop = asyncio.Event()

    async def poll_stop() -> None:
        while not stopping():
            await asyncio.sleep(0.2)
        stop.set()

    stopper = Background("inferlb-reload-watch-stop", poll_stop, logger=log) if watch else None
    if stopper is not None:
        stopper.start()
    try:
        if watch:
            from watchfiles import awatch

            paths = watched_paths(config, processes_dir)
            log.info("watching %s for changes (reload on save)", ", ".join(map(str, paths)))
            async for changes in awatch(*paths, stop_event=stop, debounce=debounce_ms, recursive=False):
                if _relevant(changes, config):
                    await reload_logged(app, "watch")
        else:
            await stop.wait()
    finally:
        if hup:
            loop.remove_signal_handler(signal.SIGHUP)
        if stopper is not None:
            await stopper.stop()
