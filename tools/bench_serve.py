#!/usr/bin/env python3
"""Serving benchmark: ignisd against transformers' generate() on the same GGUF, in one run (issue 2).

Prints cold prefill tokens/s at 512, 2,048 and 8,000-token prompts; decode tokens/s summed over 1, 4 and 8 lanes at
512 tokens of context (ignisd: timed only while every lane decodes, from its decode-token counter); TTFT p50; the
same work through transformers as the peer; and the ratios. Then the hybrid
comparison of tools/bench_hybrid.py (Qwen3.5-shaped, hidden 1,024, 8 layers, random weights). The daemon and
the peer never run at the same time; both use --threads torch threads (default: all cores).

    python tools/bench_serve.py [--model PATH] [--threads N] [--decode-tokens 64] [--skip-peer]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from daemon_support import DaemonProc, smollm_gguf  # noqa: E402  (the tests' daemon launcher and model locator)

TEXT = (Path(__file__).resolve().parents[1] / "README.md").read_text() * 40


def prompt_ids(conn, n: int) -> list[int]:
    ids = conn.request({"id": "tok", "op": "tokenize", "text": TEXT})["result"]["tokens"]
    while len(ids) < n:
        ids = ids + ids
    return ids[:n]


def _decode_counter(d: DaemonProc) -> float:
    c = d.conn()
    try:
        text = c.request({"id": "m", "op": "metrics"})["result"]["text"]
    finally:
        c.close()
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith("ignis_decode_tokens_total"))


def decode_window(d: DaemonProc, lanes: int, decode_tokens: int, period: float = 0.01) -> float:
    """Decode tokens/s summed over `lanes` requests, timed only while all of them are decoding (no prefill in the
    rounds): the daemon's ignis_decode_tokens_total counter read when the last one starts decoding and again when
    the first is 4 tokens from its end (``status`` polled every `period` s). transformers' figure is pure decode too."""
    def rows():
        return [r for r in d.status()["requests"] if r["id"].split(":")[-1].startswith(f"d{lanes}-")]
    while True:
        rs = rows()
        if len(rs) == lanes and all(r["state"] == "decode" for r in rs):
            break
        time.sleep(period)
    c0, t0 = _decode_counter(d), time.perf_counter()
    while True:
        rs = rows()
        if len(rs) < lanes or max(r["generated"] for r in rs) >= decode_tokens - 4:
            break
        time.sleep(period)
    c1, t1 = _decode_counter(d), time.perf_counter()
    return (c1 - c0) / (t1 - t0)


def bench_ignis(model: Path | None, threads: int, decode_tokens: int, repeats: int = 2) -> dict:
    args = ["--server-threads", str(threads), "--lanes", "8", "--vram-kv-pool-bytes", "64Ktok"]
    if model:
        args += ["--model", str(model)]
    d = DaemonProc([a for a in args], Path(tempfile.mkdtemp(prefix="ignis-bench-", dir="/tmp")))
    # DaemonProc forces --server-threads 1 first; the later flag wins
    out: dict = {}
    try:
        c = d.conn()
        c.request({"id": "warm", "op": "completion", "prompt": prompt_ids(c, 64), "max_tokens": 2, "temperature": 0})
        for n in (512, 2048, 8000):
            ids = prompt_ids(c, n)
            walls = []
            for k in range(repeats):
                t0 = time.perf_counter()
                r = c.request({"id": f"p{n}-{k}", "op": "completion", "prompt": ids, "max_tokens": 1,
                               "temperature": 0})
                walls.append(time.perf_counter() - t0)
                out.setdefault("ttft_ms", []).append(r["timings"]["ttft_ms"])
            out[f"prefill_{n}"] = n / min(walls)
        for lanes in (1, 4, 8):
            ids = prompt_ids(c, 512)
            for i in range(lanes):
                # distinct prompts: change the first token so nothing could be shared
                c.send({"id": f"d{lanes}-{i}", "op": "completion", "prompt": [ids[0] + i] + ids[1:],
                        "max_tokens": decode_tokens, "temperature": 0, "cache_prompt": False})
            out[f"decode_{lanes}"] = decode_window(d, lanes, decode_tokens)
            finals = []
            while len(finals) < lanes:
                r = c.recv()
                if r["type"] in ("done", "error"):
                    finals.append(r)
            assert all(f["type"] == "done" for f in finals), finals
            out.setdefault("ttft_ms", []).extend(f["timings"]["ttft_ms"] for f in finals)
        c.close()
    finally:
        d.stop()
    out["ttft_p50_ms"] = statistics.median(out.pop("ttft_ms"))
    return out


def bench_transformers(model: Path, threads: int, decode_tokens: int, repeats: int = 2) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(str(model.parent), gguf_file=model.name)
    m = AutoModelForCausalLM.from_pretrained(str(model.parent), gguf_file=model.name, dtype=torch.float32).eval()
    ids_all = tok(TEXT, add_special_tokens=False)["input_ids"]
    while len(ids_all) < 8000:
        ids_all = ids_all + ids_all
    out = {}
    with torch.inference_mode():
        m.generate(torch.tensor([ids_all[:64]]), max_new_tokens=2, do_sample=False)
        def timed(x, n):
            mask = torch.ones_like(x)
            t0 = time.perf_counter()
            m.generate(x, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                       pad_token_id=tok.eos_token_id)
            return time.perf_counter() - t0

        for n in (512, 2048, 8000):
            x = torch.tensor([ids_all[:n]])
            out[f"prefill_{n}"] = n / min(timed(x, 1) for _ in range(repeats))
        for lanes in (1, 4, 8):
            x = torch.tensor([[ids_all[0] + i] + ids_all[1:512] for i in range(lanes)])
            # decode rate = tokens after the first / (time for decode_tokens − time for 1), best of `repeats`
            rates = [(decode_tokens - 1) * lanes / max(1e-9, timed(x, decode_tokens) - timed(x, 1))
                     for _ in range(repeats)]
            out[f"decode_{lanes}"] = max(rates)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None, help="GGUF file (default: the built-in SmolLM2)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each measurement; the best is kept")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--skip-hybrid", action="store_true", help="skip the hidden-1,024 hybrid forward comparison")
    a = ap.parse_args()
    model = a.model or smollm_gguf()
    ours = bench_ignis(a.model, a.threads, a.decode_tokens, a.repeats)
    peer = {} if a.skip_peer else bench_transformers(model, a.threads, a.decode_tokens, a.repeats)
    print(f"model {model.name}, {a.threads} threads, fp32 KV, decode {a.decode_tokens} tokens at 512 context")
    print(f"{'metric':<26}{'ignisd':>12}{'transformers':>14}{'ratio':>8}")
    for k in ("prefill_512", "prefill_2048", "prefill_8000", "decode_1", "decode_4", "decode_8"):
        p = peer.get(k)
        ratio = f"{ours[k] / p:.2f}x" if p else "-"
        n = k.split("_")[1]
        unit = "prefill tok/s @" + n if k.startswith("prefill") else f"decode tok/s, {n} lanes"
        print(f"{unit:<26}{ours[k]:>12.1f}{(p or 0):>14.1f}{ratio:>8}")
    print(f"{'TTFT p50 (ms)':<26}{ours['ttft_p50_ms']:>12.1f}")
    print(f"8-lane / 1-lane decode (ignisd): {ours['decode_8'] / ours['decode_1']:.2f}x (aim >= 3x)")
    if not a.skip_hybrid:
        # the hybrid (Qwen3.5-shaped, hidden 1,024, 8 layers, random weights) forward against transformers
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_hybrid import main as bench_hybrid_main
        bench_hybrid_main(["--threads", str(a.threads)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
