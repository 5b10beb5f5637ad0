"""Process plumbing for the benchmarks: child processes stopped by PID, CPU from ``/proc``.

Everything a benchmark starts goes through :class:`Child`: it is spawned in its own session
with its output in a log file, and :meth:`Child.stop` signals it and then every descendant it had,
**by PID** (the tree is read from ``/proc``), never by name. CPU time is ``utime + stime`` of a
process and all its live descendants, read from ``/proc/PID/stat`` (Linux only; elsewhere the
CPU figures are ``None``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "Child",
    "descendants",
    "free_port",
    "proc_table",
    "system_busy",
    "tree_cpu_seconds",
    "wait_http",
    "wait_post",
    "workdir",
]

_CLK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _stat(pid: int) -> tuple[int, int] | None:
    """``(ppid, utime + stime ticks)`` of one process, or ``None`` when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    try:
        # rest[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
        return int(rest[1]), int(rest[11]) + int(rest[12])
    except (IndexError, ValueError):
        return None


def proc_table() -> dict[int, tuple[int, int]]:
    """``{pid: (ppid, cpu ticks)}`` of every live process (empty without ``/proc``)."""
    table: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                table[int(name)] = st
    return table


def _tree(root: int, table: Mapping[int, tuple[int, int]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    stack, seen = [root], set()
    while stack:
        p = stack.pop()
        if p in seen or p not in table:
            continue
        seen.add(p)
        out.append(p)
        stack.extend(children.get(p, []))
    return out


def descendants(root: int) -> list[int]:
    """PIDs of ``root``'s live descendants (not ``root`` itself)."""
    return [p for p in _tree(root, proc_table()) if p != root]


def tree_cpu_seconds(root: int) -> float | None:
    """``utime + stime`` of ``root`` and its live descendants, in seconds (``None`` without /proc)."""
    table = proc_table()
    if root not in table:
        return None
    return sum(table[p][1] for p in _tree(root, table)) / _CLK


def system_busy() -> tuple[float, float] | None:
    """``(busy, total)`` CPU seconds summed over all CPUs since boot, from ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])  # user nice system idle iowait irq softirq steal
    return (total - idle) / _CLK, total / _CLK


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Child:
    """One child process of a benchmark, with its output in ``log_path``."""

    def __init__(self, name: str, cmd: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None, stop_signal: int = signal.SIGTERM) -> None:
        self.name = name
        self.cmd = list(cmd)
        self.log_path = log_path
        self.stop_signal = stop_signal
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None,
                                         cwd=cwd, start_new_session=True)

    @property
    def pid(self) -> int:
        """The child's PID."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the child is still running."""
        return self.proc.poll() is None

    def log_tail(self, chars: int = 1500) -> str:
        """The end of the child's output (for error messages)."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop the child, then any descendant it left, by PID."""
        if self.proc.poll() is not None:
            return
        tree = descendants(self.proc.pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, self.stop_signal)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def wait_http(url: str, child: Child, timeout_s: float = 60.0) -> float:
    """Poll ``url`` until it answers 200; returns the seconds it took. Raises RuntimeError when
    the child exits first or the time is up."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if not child.alive():
            raise RuntimeError(f"{child.name} exited ({child.proc.returncode}) before {url} answered:\n"
                               f"{child.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{child.name}: {url} did not answer 200 within {timeout_s:.0f} s:\n"
                       f"{child.log_tail()}")


def wait_post(url: str, body: bytes, child: Child, timeout_s: float, headers: dict[str, str] | None = None) -> None:
    """POST ``body`` to ``url`` until it answers 200 (a router answers 503 or 500 until a health
    round has found its workers); RuntimeError when ``child`` exits first or time is up."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:   # bounded by timeout_s
        if not child.alive():
            raise RuntimeError(f"{child.name} exited ({child.proc.returncode}):\n{child.log_tail()}")
        req = urllib.request.Request(url, data=body, headers={"content-type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                r.read()
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{child.name}: {url} did not answer 200 within {timeout_s:.0f} s:\n{child.log_tail()}")


@contextmanager
def workdir(path: Path | None) -> Iterator[Path]:
    """``path`` (created if missing and kept), or a temporary directory removed on exit."""
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="inferlb-bench-") as tmp:
        yield Path(tmp)
