"""Timed streaming clients for tools/bench_peer.py: ignisd over its socket and llama.cpp's llama-server over HTTP.

Both return a ``Timed`` (seconds from send to the first streamed token, to the last, tokens generated, cached prompt
tokens where the server reports them), measured on the client as a user sees them. Standard library and orjson only.
llama-server's API: its README (tools/server/README.md in the llama.cpp tree): ``POST /completion`` with ``prompt``
(text or token ids), ``n_predict``, ``cache_prompt``, ``ignore_eos``, ``stream``; ``POST /v1/chat/completions``.
"""
from __future__ import annotations

import http.client
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import orjson


@dataclass
class Timed:
    """One request as the client saw it. ttft_s: send → first token (s); last_s: send → last token (s);
    tokens: generated tokens; cached: prompt tokens the server reused (None: not reported); prompt: prompt tokens;
    text: the streamed reply."""

    ttft_s: float
    last_s: float
    tokens: int
    prompt: int = 0
    cached: int | None = None
    text: str = ""

    @property
    def decode_tok_s(self) -> float:
        """Inter-token rate after the first token: (tokens - 1) / (last - first), tokens/s (0 for one token)."""
        dt = self.last_s - self.ttft_s
        return (self.tokens - 1) / dt if self.tokens > 1 and dt > 0 else 0.0


# ---------------------------------------------------------------- ignisd


def ignis_stream(conn, body: dict) -> Timed:
    """Send one streaming chat or completion `body` (with "id") on RawConn `conn`; time its deltas. Raises
    RuntimeError on an error reply."""
    t0 = time.perf_counter()
    conn.send(dict(body, stream=True))
    return ignis_collect(conn, {body["id"]: t0})[body["id"]]


def ignis_collect(conn, started: dict[str, float]) -> dict[str, Timed]:
    """Read the streamed replies of every request id in `started` (id → perf_counter at send) until each is done."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    text: dict[str, list[str]] = {}
    out: dict[str, Timed] = {}
    while len(out) < len(started):
        r = conn.recv()
        rid = r.get("id")
        if rid not in started:
            continue
        now = time.perf_counter()
        if r["type"] == "delta":
            first.setdefault(rid, now)
            last[rid] = now
            text.setdefault(rid, []).append(r.get("text", ""))
        elif r["type"] == "done":
            u = r["usage"]
            t0 = started[rid]
            f = first.get(rid, now)
            out[rid] = Timed(f - t0, last.get(rid, now) - t0, u["completion_tokens"], u["prompt_tokens"],
                             u["prompt_tokens_details"]["cached_tokens"], "".join(text.get(rid, [])))
        else:
            raise RuntimeError(f"ignisd: {r}")
    return out


# ---------------------------------------------------------------- llama-server


class LlamaServer:
    """llama-server on 127.0.0.1:`port` in a subprocess: `binary` -m `gguf` with `threads` threads for decode and
    batch, `parallel` slots of `ctx_per_slot` tokens each (its ``-c`` is the total). Logs to `log`."""

    def __init__(self, binary: str, gguf: Path, threads: int, parallel: int, ctx_per_slot: int, port: int,
                 log: Path):
        self.port = port
        cmd = [binary, "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-tb", str(threads), "-np", str(parallel), "-c", str(parallel * ctx_per_slot), "-ngl", "0"]
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}: see {log}")
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"llama-server did not come up: see {log}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 20 s."""
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()

    def peak_rss_bytes(self) -> int:
        """VmHWM of the server process (bytes)."""
        return peak_rss_bytes(self.proc.pid)

    def stream(self, path: str, body: dict) -> Timed:
        """POST a streaming `body` to `path` ("/completion" or "/v1/chat/completions"); time its chunks. Raises
        RuntimeError on an HTTP error."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1800)
        t0 = time.perf_counter()
        c.request("POST", path, orjson.dumps(dict(body, stream=True)), {"Content-Type": "application/json"})
        resp = c.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"llama-server {path}: {resp.status} {resp.read()[:300]!r}")
        first = last = None
        n = 0
        parts = []
        prompt, cached = 0, None
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = orjson.loads(line[6:])
            now = time.perf_counter()
            text = ev.get("content")
            if text is None and ev.get("choices"):
                text = (ev["choices"][0].get("delta") or {}).get("content")
            if text:
                first = first or now
                last = now
                parts.append(text)
            t = ev.get("timings")
            if t:
                n = t.get("predicted_n", n)
                prompt = t.get("prompt_n", 0) + t.get("cache_n", 0)
                cached = t.get("cache_n")
        c.close()
        end = time.perf_counter()
        return Timed((first or end) - t0, (last or end) - t0, n, prompt, cached, "".join(parts))


def peak_rss_bytes(pid: int) -> int:
    """VmHWM (peak resident set) of process `pid` from /proc, in bytes (0 when unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
