"""Fixtures of the unit tests: ``io_mode``, each way KV-disk files are read and written (cache/disk_io.py); ``qwen_tok``
(the real Qwen3.5 tokenizer) and ``scripted`` (the HTTP fronts over a scripted engine on it: http_support)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from http_support import InProcess, ScriptedEngine

from ignisd.cache import disk_direct
from ignisd.edge import Edge
from ignisd.request import FinishReason
from ignisd.text.chat_template import ChatTemplate
from ignisd.text.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from make_tiny_checkpoint import write_qwen3_5_tokenizer  # noqa: E402


@pytest.fixture(params=["direct", "buffered"])
def io_mode(request, monkeypatch, tmp_path) -> str:
    """Each KV-disk I/O mode: "direct" (O_DIRECT; skipped, saying why, where tmp_path's filesystem refuses it) and
    "buffered" (IGNIS_KV_DISK_DIRECT=0: through the page cache)."""
    if request.param == "buffered":
        monkeypatch.setenv(disk_direct.DIRECT_ENV, "0")
    else:
        monkeypatch.delenv(disk_direct.DIRECT_ENV, raising=False)
        probe = tmp_path / ".direct-probe"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            disk_direct.set_direct(fd)
        except OSError as e:
            pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT ({e.strerror})")
        finally:
            os.close(fd)
            probe.unlink()
    return request.param


@pytest.fixture(scope="module")
def qwen_tok(tmp_path_factory) -> Tokenizer:
    """The real Qwen3.5 tokenizer and chat template (from ../shared/data, through tools/make_tiny_checkpoint)."""
    d = tmp_path_factory.mktemp("qwen_tok")
    write_qwen3_5_tokenizer(d)
    return Tokenizer.from_dir(d)


@pytest.fixture(scope="module")
def scripted_server(qwen_tok):
    """(InProcess server, ScriptedEngine): the daemon's own HTTP fronts and Edge (Qwen3.5 template and output
    parser, context 4,096) on a real Unix socket, over an engine that answers with the token ids of `engine.text`."""
    engine = ScriptedEngine(qwen_tok)
    edge = Edge(engine, qwen_tok, ChatTemplate(qwen_tok.chat_template, qwen_tok.bos_token, qwen_tok.eos_token),
                model_info={"name": "tiny-qwen"}, context_tokens=4096, default_max_tokens=64,
                developer_policy="into-system", output_family="qwen3_5")
    srv = InProcess(edge)
    yield srv, engine
    srv.close()


@pytest.fixture
def scripted(scripted_server):
    """scripted_server with the engine's script reset (no text, no error, finish stop) and its submits cleared."""
    srv, engine = scripted_server
    engine.text, engine.cached, engine.error, engine.finish = "", 0, None, FinishReason.STOP
    engine.error_after, engine.delay_s = None, 0.0
    engine.submitted.clear()
    return srv, engine
