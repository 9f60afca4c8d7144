"""Prompt reuse figures over the socket, reuse on and off in the same run (DESIGN §4.3-§4.4).

    python tools/bench_reuse.py [--model PATH | --tiny] [--lengths 1024,2048,4096,8192] [--repeat 3]
                                [--threads N] [--round-prefill-tokens 512]

Starts one ignisd (the built-in SmolLM2 unless --model / --tiny) and compares each request resumed against the same
request run cold with ``cache_prompt: false`` on the same daemon (which is what ``--reuse-prompt off`` does to every
request). Prints:

- TTFT cold vs resumed for turn 2 of a conversation whose turn 1 is about L tokens (median of --repeat);
- an agent burst of 1 main + 8 subagents sharing a system block of about half the context (sent at once): total
  prefilled tokens and mean TTFT;
- a 20-turn conversation replayed: cached / prompt tokens per turn (SmolLM2's template renders no tools, so the
  turns are plain user / assistant turns);
- the three-traversal tax: TTFT of a cold chat prompt (split at its cut points) against the same token ids sent as a
  completion (one traversal), both cold.
Head-of-line blocking is not measured yet.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("river bridge market garden harbour tower museum street square palace canal station library theatre "
         "castle forest meadow valley mountain island").split()


def words(n: int, salt: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n))


class Conn:
    def __init__(self, path: str):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(600)
        self.s.connect(path)
        self.buf = b""
        self.n = 0

    def send(self, obj: dict) -> None:
        self.s.sendall(orjson.dumps(obj) + b"\n")

    def recv(self) -> dict:
        while b"\n" not in self.buf:
            chunk = self.s.recv(1 << 20)
            if not chunk:
                raise ConnectionError("daemon closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return orjson.loads(line)

    def request(self, body: dict) -> dict:
        self.n += 1
        body = dict(body, id=f"r{self.n}")
        self.send(body)
        while True:
            r = self.recv()
            if r.get("id") == body["id"] and r["type"] != "delta":
                if r["type"] == "error":
                    raise RuntimeError(r)
                return r


def start(args: list[str], threads: int) -> tuple[subprocess.Popen, str]:
    d = Path(tempfile.mkdtemp(prefix="ignis-bench-"))
    sock = str(d / "s.sock")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    p = subprocess.Popen([sys.executable, "-m", "ignisd", "serve", "--socket", sock, "--server-threads",
                          str(threads), *args], stdout=open(d / "log", "wb"), stderr=subprocess.STDOUT, env=env,
                         cwd=ROOT)
    for _ in range(3000):
        if p.poll() is not None:
            raise SystemExit((d / "log").read_text())
        try:
            Conn(sock).request({"op": "health"})
            return p, sock
        except OSError:
            time.sleep(0.1)
    raise SystemExit("ignisd did not come up")


def chat(c: Conn, messages, **kw) -> dict:
    return c.request({"op": "chat", "messages": messages, "temperature": 0, "max_tokens": 1, **kw})


def n_tokens(c: Conn, messages) -> int:
    return len(c.request({"op": "tokenize", "messages": messages})["result"]["tokens"])


def conversation_of(c: Conn, tokens: int, salt: int) -> list[dict]:
    """[system, user] rendering to about `tokens` tokens."""
    k = max(8, tokens // 2)
    for _ in range(6):
        m = [{"role": "system", "content": f"Brief {salt}. " + words(k, salt)},
             {"role": "user", "content": f"Question {salt}. " + words(k, salt + 1)}]
        got = n_tokens(c, m)
        if abs(got - tokens) < 16:
            break
        k = max(8, int(k * tokens / got))
    return m


def ttft(r: dict) -> float:
    return r["timings"]["ttft_ms"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tiny", action="store_true", help="the tiny random Llama of the tests (context 2,048)")
    ap.add_argument("--lengths", default="1024,2048,4096,8192")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--context", type=int, default=8192, help="model.context_tokens (tokens)")
    ap.add_argument("--round-prefill-tokens", type=int, default=512)
    a = ap.parse_args()
    args = ["--lanes", "8", "--vram-kv-pool-bytes", "160Ktok", "--server-round-prefill-tokens",
            str(a.round_prefill_tokens)]
    context = a.context
    if a.tiny:
        sys.path.insert(0, str(ROOT / "tools"))
        from make_tiny_checkpoint import make_tiny_llama
        a.model = str(make_tiny_llama(Path(tempfile.mkdtemp(prefix="ignis-tiny-")), seed=0))
        context = 2048
    if a.model:
        args += ["--model", a.model]
    args += ["--model-context-tokens", str(context)]
    proc, sock = start(args, a.threads)
    try:
        c = Conn(sock)
        print(f"# model {c.request({'op': 'status'})['result']['model']['name']}, threads {a.threads}, "
              f"round prefill {a.round_prefill_tokens}")
        # 1. turn 2 TTFT, cold vs resumed
        print("prompt_tokens  cached  cold_ttft_ms  resumed_ttft_ms  resumed/cold")
        for L in (int(x) for x in a.lengths.split(",")):
            if L + 64 > context:
                continue
            c.request({"op": "reset"})
            t1 = conversation_of(c, L, L)
            r1 = chat(c, t1, max_tokens=8)
            t2 = t1 + [{"role": "assistant", "content": r1["text"]}, {"role": "user", "content": "Go on."}]
            cold = [ttft(chat(c, t2, cache_prompt=False)) for _ in range(a.repeat)]
            hot = [chat(c, t2) for _ in range(a.repeat)]
            cached = hot[0]["usage"]["prompt_tokens_details"]["cached_tokens"]
            cm, hm = statistics.median(cold), statistics.median(ttft(r) for r in hot)
            print(f"{hot[0]['usage']['prompt_tokens']:>13}  {cached:>6}  {cm:>12.1f}  {hm:>15.1f}  {hm / cm:>12.3f}")
        # 2. agent burst: 1 main + 8 subagents on a shared block
        block = {"role": "system", "content": "Shared agent brief. " + words(min(2000, context // 2 - 200))}
        bodies = [[block, {"role": "user", "content": f"Subtask {i}: " + words(60 + 10 * i, i)}] for i in range(9)]
        for label, kw in (("on", {}), ("off", {"cache_prompt": False})):
            c.request({"op": "reset"})
            for i, m in enumerate(bodies):
                c.send({"id": f"b{i}", "op": "chat", "messages": m, "temperature": 0, "max_tokens": 1, **kw})
            finals = {}
            while len(finals) < len(bodies):
                r = c.recv()
                if r["type"] in ("done", "error"):
                    finals[r["id"]] = r
            pre = sum(r["usage"]["prompt_tokens"] - r["usage"]["prompt_tokens_details"]["cached_tokens"]
                      for r in finals.values())
            tot = sum(r["usage"]["prompt_tokens"] for r in finals.values())
            print(f"burst reuse {label}: prompt tokens {tot}, prefilled {pre}, "
                  f"mean TTFT {statistics.mean(ttft(r) for r in finals.values()):.1f} ms")
        # 3. a 20-turn conversation
        c.request({"op": "reset"})
        msgs = [{"role": "system", "content": "You are a patient tutor. " + words(100)}]
        ratios = []
        for turn in range(20):
            msgs.append({"role": "user", "content": f"Turn {turn}: " + words(70, turn)})
            if n_tokens(c, msgs) + 32 > context:
                break
            r = chat(c, msgs, max_tokens=16)
            u = r["usage"]
            ratios.append(f"{u['prompt_tokens_details']['cached_tokens']}/{u['prompt_tokens']}")
            msgs.append({"role": "assistant", "content": r["text"]})
        print("conversation cached/prompt per turn: " + " ".join(ratios))
        # 4. three-traversal tax on a cold ~1K prompt
        t = conversation_of(c, 1024, 7)
        ids = c.request({"op": "tokenize", "messages": t})["result"]["tokens"]
        split = statistics.median(ttft(chat(c, t, cache_prompt=False)) for _ in range(a.repeat))
        one = statistics.median(ttft(c.request({"op": "completion", "prompt": ids, "max_tokens": 1,
                                                 "temperature": 0, "cache_prompt": False}))
                                for _ in range(a.repeat))
        print(f"three-traversal tax on {len(ids)} tokens: split {split:.1f} ms vs one traversal {one:.1f} ms "
              f"({(split / one - 1) * 100:+.1f}%)")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


if __name__ == "__main__":
    main()
