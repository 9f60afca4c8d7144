"""Shared fixtures: one torch thread, the built-in GGUF, a tiny random Llama checkpoint, daemons on tmp sockets.

Daemons and oracle models are shared per test session; daemons run with --server-threads 1, and the test process
waits on their sockets while they compute, so no two torch workloads run at once.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

from daemon_support import DaemonProc, smollm_gguf

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

try:
    import torch
    torch.set_num_threads(1)
except ImportError:  # the control-plane tests run without torch
    torch = None


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return smollm_gguf()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """A tiny random-weight Llama checkpoint (HF layout, SmolLM2 tokenizer and template), built once a session."""
    from make_tiny_checkpoint import make_tiny_llama
    return Path(make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), seed=0))


def _daemon_factory():
    """A start(args, env=None) → running DaemonProc factory, as a generator: it yields the factory, then stops every
    daemon it started (all asked at once, so the teardown lasts as long as the slowest shutdown, not their sum)."""
    procs: list[DaemonProc] = []

    def start(args: list[str], env: dict | None = None) -> DaemonProc:
        d = DaemonProc(args, Path(tempfile.mkdtemp(prefix="ignis-", dir="/tmp")), env=env)
        procs.append(d)
        return d

    yield start
    for d in procs:
        d.terminate()
    for d in procs:
        d.stop()


@pytest.fixture(scope="session")
def start_session_daemon():
    """Factory for daemons shared by the whole session (the fixtures below): stopped when the session ends."""
    yield from _daemon_factory()


@pytest.fixture(scope="module")
def start_module_daemon():
    """Factory for a module's own daemons: stopped when the module's last test ends."""
    yield from _daemon_factory()


@pytest.fixture
def start_daemon():
    """Factory for one test's daemons: stopped when the test ends, so a suite of them does not hold one process
    (~0.3 GB on the tiny models, ~2 GB on SmolLM2) per test until the session ends."""
    yield from _daemon_factory()


@pytest.fixture(scope="session")
def tiny_daemon(start_session_daemon, tiny_llama_dir) -> DaemonProc:
    """The shared daemon on the tiny Llama: 4 lanes, 64 pages (4,096 tokens), context 1,024."""
    return start_session_daemon(["--model", str(tiny_llama_dir), "--lanes", "4", "--vram-kv-pool-bytes", "4Ktok",
                                "--model-context-tokens", "1024", "--server-max-queue", "64"])


@pytest.fixture(scope="session")
def smollm_daemon(start_session_daemon) -> DaemonProc:
    """The shared daemon on the built-in SmolLM2 (no --model): 8 lanes, fp32 KV, fp32 weights (its prompt logprobs
    are checked against transformers on gguf's dequantized weights; other daemons run the native default)."""
    return start_session_daemon(["--lanes", "8", "--vram-kv-pool-bytes", "32Ktok", "--model-weight-format", "fp32"])


@pytest.fixture(scope="session")
def hf_smollm(smollm_path):
    """transformers' own model on the built-in GGUF (the logits oracle), fp32, loaded once a session."""
    from transformers import AutoModelForCausalLM
    m = AutoModelForCausalLM.from_pretrained(str(smollm_path.parent), gguf_file=smollm_path.name,
                                             dtype=torch.float32)
    return m.eval()


@pytest.fixture(scope="session")
def tiny_qwen35_real_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen3.5 hybrid (hidden 64, 4 layers: 3 GDN + 1 attention) with the real Qwen3.5 vocabulary
    (248,320), tokenizer and chat template; built once a session."""
    from make_tiny_checkpoint import make_tiny_qwen3_5
    return Path(make_tiny_qwen3_5(tmp_path_factory.mktemp("tiny_qwen35_real"), seed=0, hidden=64,
                                  real_tokenizer=True))


@pytest.fixture(scope="session")
def qwen_daemon(start_session_daemon, tiny_qwen35_real_dir) -> DaemonProc:
    """The shared daemon on the tiny real-vocabulary Qwen3.5 hybrid: 4 lanes, 4,096 KV tokens."""
    return start_session_daemon(["--model", str(tiny_qwen35_real_dir), "--lanes", "4", "--vram-kv-pool-bytes", "4Ktok",
                                "--model-context-tokens", "2048"])


# ---- daemons with the HTTP fronts (server.http_listen) ----
@pytest.fixture(scope="session")
def http_llama(start_session_daemon, tiny_llama_dir) -> DaemonProc:
    """The tiny Llama (SmolLM2's template: no tools) with the HTTP fronts on a Unix socket."""
    path = Path(tempfile.mkdtemp(prefix="ignis-http-", dir="/tmp")) / "http.sock"
    return start_session_daemon(["--model", str(tiny_llama_dir), "--lanes", "4", "--vram-kv-pool-bytes", "4Ktok",
                                "--model-context-tokens", "1024", "--server-http-listen", f"unix:{path}"])


@pytest.fixture(scope="session")
def http_qwen(start_session_daemon, tiny_qwen35_real_dir) -> DaemonProc:
    """The tiny real-vocabulary Qwen3.5 hybrid (tools, reasoning) with the HTTP fronts on 127.0.0.1 (a free port)."""
    return start_session_daemon(["--model", str(tiny_qwen35_real_dir), "--lanes", "4", "--vram-kv-pool-bytes", "4Ktok",
                                "--model-context-tokens", "2048", "--server-http-listen", "127.0.0.1:0"])


@pytest.fixture(scope="session")
def http_llama_keyed(start_session_daemon, tiny_llama_dir) -> DaemonProc:
    """The tiny Llama with an API key (http_support.HTTP_KEY), the billing-header strip off, and the HTTP fronts on
    127.0.0.1."""
    from http_support import HTTP_KEY
    key = Path(tempfile.mkdtemp(prefix="ignis-key-", dir="/tmp")) / "key"
    key.write_text(HTTP_KEY + "\n")
    return start_session_daemon(["--model", str(tiny_llama_dir), "--lanes", "2", "--vram-kv-pool-bytes", "4Ktok",
                                "--model-context-tokens", "1024", "--server-http-listen", "127.0.0.1:0",
                                "--server-api-key-file", str(key), "--server-strip-billing-header", "off"])
