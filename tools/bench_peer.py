#!/usr/bin/env python3
"""ignisd against llama.cpp's llama-server on the same GGUF and thread count, in one run, alternating (issue 11).

    python tools/bench_peer.py [--llama-server PATH] [--model GGUF] [--threads 2] [--rounds 3]
                               [--sections prefill,decode,lanes,resume,burst] [--ignis-arg=--model-weight-format=fp32]

Build the peer outside the project with ../shared/peer/build_llama_server.sh (prints the binary's path); without
--llama-server only ignisd's own figures are printed. Every figure is timed on the client, as a user sees it
(streamed replies): ignisd over its Unix socket, llama-server over HTTP on 127.0.0.1. The two servers run at the
same time but are never sent work at the same time; each measurement alternates ignisd, llama-server, ignisd, ...
for --rounds rounds and prints medians and the ratio ignisd / llama-server (> 1: ignisd is faster; for TTFT the
ratio is llama / ignis, so > 1 is ignisd faster too).

Sections (the same token ids go to both servers where the section sends ids):
- prefill: prompts of 512, 2,048 and 8,000 tokens of real text (Debian's common-licenses), no reuse
  (ignis cache_prompt false; llama cache_prompt false), max_tokens 1: prompt tokens / TTFT.
- decode: one lane, a short prompt, 128 tokens with ignore_eos: (tokens - 1) / (last - first token); and 64 tokens
  after a 4,000-token prompt of real text (no reuse), the same measure at an agent's context length.
- lanes: 4 and 8 distinct short prompts at once × 96 tokens (ignore_eos): all tokens / (last token - first sent).
- resume: an ~8K-token chat turn 1 (reply of 16 tokens), then turn 2 = turn 1 + its reply + a short question:
  TTFT of turn 2 (both servers reuse their own cache: ignis its retained states, llama-server its slot).
- burst: 1 main + 8 subagents sent at once sharing a ~4K-token system prompt, 32 tokens each: mean TTFT and the
  time until the last reply ends.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
from daemon_support import DaemonProc, smollm_gguf  # noqa: E402
from peer_client import LlamaServer, Timed, free_port, ignis_collect, ignis_stream, peak_rss_bytes  # noqa: E402

SECTIONS = ("prefill", "decode", "lanes", "resume", "burst")
LICENSES = [Path("/usr/share/common-licenses") / n for n in ("GPL-3", "GPL-2", "LGPL-2.1", "Apache-2.0")]
QUESTIONS = ["Write a haiku about the sea.", "What is 17 times 23?", "Name three primary colors.",
             "Explain recursion to a child.", "Translate 'good morning' into French.", "List four planets.",
             "Why is the sky blue?", "Describe a cat in two sentences.", "What does HTTP stand for?"]


class Pair:
    """The two servers and the work helpers that send the same thing to each."""

    def __init__(self, ignis: DaemonProc, llama: LlamaServer | None):
        self.ignis, self.llama = ignis, llama
        self.c = ignis.conn()
        self.c.sock.settimeout(1800)
        self.n = 0

    def rid(self) -> str:
        self.n += 1
        return f"b{self.n}"

    def tokenize(self, **kw) -> dict:
        return self.c.request(dict(kw, id=self.rid(), op="tokenize"))["result"]

    def text_ids(self, n: int) -> list[int]:
        text = "\n\n".join(p.read_text() for p in LICENSES if p.exists())
        ids = self.tokenize(text=text)["tokens"]
        while len(ids) < n:
            ids = ids + ids
        return ids[:n]

    # one request, each server
    def ignis_ids(self, ids: list[int], n: int, **kw) -> Timed:
        return ignis_stream(self.c, dict(id=self.rid(), op="completion", prompt=ids, max_tokens=n, temperature=0,
                                         ignore_eos=True, **kw))

    def llama_ids(self, ids: list[int], n: int, cache_prompt: bool = True) -> Timed:
        return self.llama.stream("/completion", dict(prompt=ids, n_predict=n, temperature=0, ignore_eos=True,
                                                     cache_prompt=cache_prompt))

    def ignis_chat(self, messages: list[dict], n: int) -> Timed:
        return ignis_stream(self.c, dict(id=self.rid(), op="chat", messages=messages, max_tokens=n, temperature=0))

    def llama_chat(self, messages: list[dict], n: int) -> Timed:
        return self.llama.stream("/v1/chat/completions", dict(messages=messages, max_tokens=n, temperature=0))

    # many at once
    def ignis_many(self, bodies: list[dict]) -> tuple[float, dict[str, Timed]]:
        started = {}
        t0 = time.perf_counter()
        for b in bodies:
            rid = self.rid()
            started[rid] = time.perf_counter()
            self.c.send(dict(b, id=rid, stream=True))
        out = ignis_collect(self.c, started)
        return t0, {k: Timed(v.ttft_s + started[k] - t0, v.last_s + started[k] - t0, v.tokens, v.prompt, v.cached,
                             v.text) for k, v in out.items()}

    def llama_many(self, calls: list[tuple[str, dict]]) -> tuple[float, dict[str, Timed]]:
        out: dict[str, Timed] = {}
        t0 = time.perf_counter()

        def one(i, path, body):
            t = time.perf_counter()
            r = self.llama.stream(path, body)
            out[str(i)] = Timed(r.ttft_s + t - t0, r.last_s + t - t0, r.tokens, r.prompt, r.cached)
        threads = [threading.Thread(target=one, args=(i, p, b)) for i, (p, b) in enumerate(calls)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        return t0, out


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def row(name: str, ig: list[float], ll: list[float], unit: str, higher_better: bool = True) -> None:
    a, b = median(ig), median(ll)
    if not ll:
        print(f"{name:<44} ignis {a:9.1f} {unit}")
        return
    ratio = (a / b) if higher_better else (b / a)
    print(f"{name:<44} ignis {a:9.1f}  llama {b:9.1f} {unit:<6} ratio {ratio:5.2f}")


def alternate(rounds: int, ig, ll, have_llama: bool) -> tuple[list, list]:
    """Run ig() and ll() alternately `rounds` times (ignis first); their results in two lists."""
    a, b = [], []
    for _ in range(rounds):
        a.append(ig())
        if have_llama:
            b.append(ll())
    return a, b


def section_prefill(p: Pair, rounds: int) -> None:
    for n in (512, 2048, 8000):
        ids = p.text_ids(n)
        ig, ll = alternate(rounds, lambda ids=ids: p.ignis_ids(ids, 1, cache_prompt=False),
                           lambda ids=ids: p.llama_ids(ids, 1, cache_prompt=False), p.llama is not None)
        row(f"prefill tok/s, {n}-token prompt, no reuse", [n / t.ttft_s for t in ig], [n / t.ttft_s for t in ll],
            "tok/s")


def section_decode(p: Pair, rounds: int) -> None:
    ids = p.tokenize(messages=[{"role": "user", "content": QUESTIONS[0]}])["tokens"]
    ig, ll = alternate(rounds, lambda: p.ignis_ids(ids, 128, cache_prompt=False),
                       lambda: p.llama_ids(ids, 128, cache_prompt=False), p.llama is not None)
    row("decode tok/s, 1 lane, 128 tokens", [t.decode_tok_s for t in ig], [t.decode_tok_s for t in ll], "tok/s")
    ids = p.text_ids(4000)                  # an agent's context: decode reads 4K tokens of KV a layer and step
    ig, ll = alternate(rounds, lambda: p.ignis_ids(ids, 64, cache_prompt=False),
                       lambda: p.llama_ids(ids, 64, cache_prompt=False), p.llama is not None)
    row("decode tok/s, 1 lane, 64 after a 4K prompt", [t.decode_tok_s for t in ig], [t.decode_tok_s for t in ll],
        "tok/s")


def section_lanes(p: Pair, rounds: int) -> None:
    for lanes in (4, 8):
        prompts = [p.tokenize(messages=[{"role": "user", "content": q}])["tokens"] for q in QUESTIONS[:lanes]]

        def ig(prompts=prompts):
            t0, out = p.ignis_many([dict(op="completion", prompt=ids, max_tokens=96, temperature=0, ignore_eos=True,
                                         cache_prompt=False) for ids in prompts])
            return sum(t.tokens for t in out.values()) / max(t.last_s for t in out.values())

        def ll(prompts=prompts):
            t0, out = p.llama_many([("/completion", dict(prompt=ids, n_predict=96, temperature=0, ignore_eos=True,
                                                         cache_prompt=False)) for ids in prompts])
            return sum(t.tokens for t in out.values()) / max(t.last_s for t in out.values())
        a, b = alternate(rounds, ig, ll, p.llama is not None)
        row(f"{lanes} concurrent prompts x 96 tokens, aggregate", a, b, "tok/s")


def _long_chat(p: Pair, target: int, salt: str) -> list[dict]:
    text = "\n\n".join(x.read_text() for x in LICENSES if x.exists())
    words = text.split()
    lo, hi = 100, len(words)
    while lo < hi:                      # the longest system text whose chat renders within `target` tokens
        mid = (lo + hi + 1) // 2
        msgs = [{"role": "system", "content": salt + " ".join(words[:mid])},
                {"role": "user", "content": "Summarise the licence above in one sentence."}]
        if len(p.tokenize(messages=msgs)["tokens"]) <= target:
            lo = mid
        else:
            hi = mid - 1
    return [{"role": "system", "content": salt + " ".join(words[:lo])},
            {"role": "user", "content": "Summarise the licence above in one sentence."}]


def section_resume(p: Pair, rounds: int) -> None:
    ig, ll = [], []
    for r in range(rounds):
        for who, out in (("ignis", ig), ("llama", ll)):
            if who == "llama" and p.llama is None:
                continue
            t1 = _long_chat(p, 7800, f"Session {r} {who}. ")
            chat = p.ignis_chat if who == "ignis" else p.llama_chat
            first = chat(t1, 16)
            t2 = t1 + [{"role": "assistant", "content": first.text},
                       {"role": "user", "content": "Thanks. And briefly?"}]
            second = chat(t2, 8)
            out.append((first.ttft_s, second.ttft_s, second.cached))
    row("resumed TTFT of turn 2 after an ~8K turn 1", [x[1] * 1e3 for x in ig], [x[1] * 1e3 for x in ll], "ms",
        higher_better=False)
    print(f"{'':<44} (turn 1 cold TTFT: ignis {median([x[0] for x in ig]) * 1e3:.0f} ms"
          + (f", llama {median([x[0] for x in ll]) * 1e3:.0f} ms" if ll else "")
          + f"; cached tokens of turn 2: ignis {ig[-1][2]}" + (f", llama {ll[-1][2]}" if ll else "") + ")")


def section_burst(p: Pair, rounds: int) -> None:
    ig, ll = [], []
    for r in range(rounds):
        for who, out in (("ignis", ig), ("llama", ll)):
            if who == "llama" and p.llama is None:
                continue
            system = _long_chat(p, 4096, f"Agent brief {r} {who}. ")[0]
            bodies = [[system, {"role": "user", "content": f"Subtask {i}: {q}"}] for i, q in enumerate(QUESTIONS)]
            if who == "ignis":
                _, res = p.ignis_many([dict(op="chat", messages=m, max_tokens=32, temperature=0) for m in bodies])
            else:
                _, res = p.llama_many([("/v1/chat/completions", dict(messages=m, max_tokens=32, temperature=0))
                                       for m in bodies])
            out.append((statistics.mean(t.ttft_s for t in res.values()), max(t.last_s for t in res.values())))
    row("1 + 8 subagent burst on a 4K block: mean TTFT", [x[0] * 1e3 for x in ig], [x[0] * 1e3 for x in ll], "ms",
        higher_better=False)
    row("1 + 8 subagent burst: until the last reply ends", [x[1] * 1e3 for x in ig], [x[1] * 1e3 for x in ll], "ms",
        higher_better=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-server", help="path of llama-server (../shared/peer/build_llama_server.sh prints it)")
    ap.add_argument("--model", type=Path, help="GGUF file (default: the built-in SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--ignis-arg", action="append", default=[], help="extra ignisd flag (repeat), e.g. "
                    "--ignis-arg=--model-weight-format=fp32")
    a = ap.parse_args()
    sections = [s for s in a.sections.split(",") if s]
    bad = [s for s in sections if s not in SECTIONS]
    if bad:
        ap.error(f"--sections: unknown {bad}; choose from {', '.join(SECTIONS)}")
    gguf = a.model or smollm_gguf()
    extra = [x for arg in a.ignis_arg for x in arg.split("=", 1)]
    tmp = Path(tempfile.mkdtemp(prefix="ignis-peer-"))
    ignis = DaemonProc(["--model", str(gguf), "--server-threads", str(a.threads), "--lanes", "8",
                        "--model-context-tokens", "8192", *extra], tmp)
    llama = None
    try:
        if a.llama_server:
            llama = LlamaServer(a.llama_server, gguf, a.threads, 8, 8192, free_port(), tmp / "llama.log")
        print(f"model {gguf.name}, {a.threads} threads each, {a.rounds} rounds alternated"
              + ("" if llama else "; no --llama-server: ignisd alone"))
        p = Pair(ignis, llama)
        for s in sections:
            globals()[f"section_{s}"](p, a.rounds)
        print(f"peak resident memory: ignisd {peak_rss_bytes(ignis.proc.pid) / 2**20:.0f} MiB"
              + (f", llama-server {llama.peak_rss_bytes() / 2**20:.0f} MiB" if llama else ""))
    finally:
        ignis.stop()
        if llama is not None:
            llama.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
