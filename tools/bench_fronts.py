"""Added latency of each HTTP front over the NDJSON socket (issue 12), on one daemon in one run.

    python tools/bench_fronts.py [--model PATH] [--requests 200] [--concurrency 16] [--per-stream 25] [--threads N]

Serves the tests' tiny random Llama (SmolLM2's tokenizer and template) unless --model, with --server-http-listen on
127.0.0.1 (TCP, what editors and agents use). The request: a fixed chat (a ~200-token system message and a short
user message), streamed, max_tokens 1, temperature 0; one warm-up request first, so every timed request is fully
cached (it resumes at its own checkpoint and prefills only the generation opener). The same conversation is sent
through the socket (`chat` op, until its `done` line), OpenAI ``/v1/chat/completions`` (until ``data: [DONE]``),
Anthropic ``/v1/messages`` (until ``message_stop``) and ``/v1/responses`` (until the terminal event), each over one
kept-alive connection with a minimal client (raw asyncio streams: no SDK cost is timed), the fronts interleaved
round-robin so drift hits them alike.

Prints, per front: the median and p90 of the request latency (send → last byte) with one stream at a time, the same
under --concurrency streams at once (each stream its own connection, --per-stream requests each, --rounds phases
per front interleaved with the other fronts'), and the added median over the socket's; and the daemon's CPU time
per request of each front (its /proc utime + stime over --requests requests), which a busy machine does not skew.
Aim (issue 12): added <= 2 ms at the median.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
from daemon_support import DaemonProc  # noqa: E402
from make_tiny_checkpoint import make_tiny_llama  # noqa: E402

SYSTEM = "You are a concise assistant for a travel agency. " + " ".join(
    "river bridge market garden harbour tower museum street square palace".split() * 18)
USER = "Suggest one museum."
FRONTS = ("socket", "openai", "anthropic", "responses")


def bodies() -> dict[str, tuple[str, bytes, bytes]]:
    """front → (HTTP path or "", request bytes of the body, the marker that ends the reply)."""
    oa = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}],
          "max_tokens": 1, "temperature": 0, "stream": True}
    an = {"model": "m", "system": SYSTEM, "messages": [{"role": "user", "content": USER}], "max_tokens": 1,
          "temperature": 0, "stream": True}
    rs = {"model": "m", "instructions": SYSTEM, "input": USER, "max_output_tokens": 1, "temperature": 0,
          "stream": True}
    return {"socket": ("", orjson.dumps({"id": "b", "op": "chat", **oa}) + b"\n", b'"type":"done"'),
            "openai": ("/v1/chat/completions", orjson.dumps(oa), b"data: [DONE]"),
            "anthropic": ("/v1/messages", orjson.dumps(an), b"message_stop"),
            "responses": ("/v1/responses", orjson.dumps(rs), b"response.incomplete")}


class Client:
    """One kept-alive connection to the daemon: `ask()` sends the front's request and returns its latency (s)."""

    def __init__(self, front: str, spec, socket_path: str, host: str, port: int):
        self.front, (self.path, self.body, self.marker) = front, spec
        self.socket_path, self.host, self.port = socket_path, host, port
        self.buf = b""

    async def open(self) -> None:
        if self.front == "socket":
            self.r, self.w = await asyncio.open_unix_connection(self.socket_path, limit=1 << 22)
            self.req = self.body
        else:
            self.r, self.w = await asyncio.open_connection(self.host, self.port, limit=1 << 22)
            self.req = (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(self.body)}\r\n\r\n").encode() + self.body
        self.end = b"\n" if self.front == "socket" else b"\r\n0\r\n\r\n"   # the done line; the last HTTP chunk

    async def ask(self) -> float:
        t0 = time.perf_counter()
        self.w.write(self.req)
        buf = b""
        while True:
            buf += await self.r.read(1 << 16)
            i = buf.find(self.marker)
            if i >= 0 and buf.find(self.end, i) >= 0:
                break
        dt = time.perf_counter() - t0
        if b'"type":"error"' in buf or (self.front != "socket" and b" 200 OK" not in buf[:64]):
            raise RuntimeError(f"{self.front}: {buf[:400]!r}")
        return dt


async def sequential(clients: dict, n: int) -> dict[str, list[float]]:
    out = {f: [] for f in clients}
    for _ in range(n):
        for f, c in clients.items():
            out[f].append(await c.ask())
    return out


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) the process `pid` has used so far, all threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def cpu_per_request(clients: dict, pid: int, n: int) -> dict[str, float]:
    """The daemon's CPU time per request of each front (ms), each front's requests in one block: unlike latency it
    does not depend on what else the machine runs."""
    out = {}
    for f, c in clients.items():
        t0 = cpu_s(pid)
        for _ in range(n):
            await c.ask()
        out[f] = 1e3 * (cpu_s(pid) - t0) / n
    return out


async def concurrent(make, front: str, streams: int, per_stream: int) -> list[float]:
    clients = [make(front) for _ in range(streams)]
    for c in clients:
        await c.open()
    for _ in range(2):   # warm the connections and the concurrent path, untimed
        await asyncio.gather(*(c.ask() for c in clients))

    async def loop(c):
        return [await c.ask() for _ in range(per_stream)]
    return [x for xs in await asyncio.gather(*(loop(c) for c in clients)) for x in xs]


def ms(xs: list[float], q: float = 0.5) -> float:
    """The q-quantile of latencies `xs` (seconds) in milliseconds (the median for q = 0.5)."""
    if q == 0.5:
        return 1e3 * statistics.median(xs)
    return 1e3 * sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


async def run(d: DaemonProc, host: str, port: int, args) -> None:
    spec = bodies()

    def make(front):
        return Client(front, spec[front], d.socket, host, port)
    clients = {f: make(f) for f in FRONTS}
    for c in clients.values():
        await c.open()
        await c.ask()   # warm-up: the first request leaves the checkpoint every later one resumes from
    seq = await sequential(clients, args.requests)
    cpu = await cpu_per_request(clients, d.proc.pid, args.requests)
    conc = {f: [] for f in FRONTS}
    for _ in range(args.rounds):   # the concurrent phases interleaved too: a busy moment of the machine hits all
        for f in FRONTS:
            conc[f] += await concurrent(make, f, args.concurrency, args.per_stream)
    base_s, base_c = ms(seq["socket"]), ms(conc["socket"])
    print(f"{'front':<10} {'median ms':>10} {'p90 ms':>8} {'added ms':>9}   "
          f"{'x' + str(args.concurrency) + ' median':>11} {'p90':>7} {'added':>7}   {'cpu ms/req':>10} {'added':>7}")
    for f in FRONTS:
        print(f"{f:<10} {ms(seq[f]):>10.3f} {ms(seq[f], 0.9):>8.3f} {ms(seq[f]) - base_s:>9.3f}   "
              f"{ms(conc[f]):>11.3f} {ms(conc[f], 0.9):>7.3f} {ms(conc[f]) - base_c:>7.3f}   "
              f"{cpu[f]:>10.3f} {cpu[f] - cpu['socket']:>7.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="model path (default: the tests' tiny random Llama)")
    ap.add_argument("--requests", type=int, default=200, help="timed requests per front, one at a time")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--per-stream", type=int, default=10, help="requests per concurrent stream and round")
    ap.add_argument("--rounds", type=int, default=5, help="concurrent phases per front, interleaved")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ignis-bench-fronts-"))
    model = args.model or str(make_tiny_llama(tmp / "llama", seed=0))
    d = DaemonProc(["--model", model, "--lanes", str(max(4, args.concurrency)), "--vram-kv-pool-bytes", "64Ktok",
                    "--model-context-tokens", "2048", "--server-threads", str(args.threads),
                    "--server-http-listen", "127.0.0.1:0"], tmp)
    try:
        host, port = re.search(r"http_listening addr=(\S+):(\d+)", d.log()).groups()
        print(f"model {model}; {args.requests} sequential requests per front; {args.rounds} rounds of "
              f"{args.concurrency} streams x {args.per_stream} requests concurrent; max_tokens 1, fully cached")
        asyncio.run(run(d, host, int(port), args))
    finally:
        d.stop()


if __name__ == "__main__":
    main()
