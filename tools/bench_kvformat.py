"""hq-e8-2b quality and cost figures (HQ_E8_2B.md §5.4; issue 10). Prints tables; asserts nothing.

    python tools/bench_kvformat.py --sizes 1024,2048                  # quality: KL / top-1 vs the fp32 cache
    python tools/bench_kvformat.py --sizes 4096,8192 --variants hq-e8-2b --policies 128:4
    python tools/bench_kvformat.py --passkey 4096,8192 --trials 20    # passkey retrieval, hq-e8-2b vs fp32
    python tools/bench_kvformat.py --cost --cost-contexts 1024,4096   # capacity, codec MB/s, daemon tok/s
    python tools/bench_kvformat.py --hybrid                           # the same KL on the tiny random Qwen3.5

Quality: teacher-forced next-token KL(p_fp32 ‖ p_fmt) and top-1 agreement on SmolLM2-135M-Instruct over real prose
(Debian's common-licenses: GPL-3, then GPL-2 and others joined for longer contexts), overall and by context-position
bucket, for hq-e8-2b under each window:sinks policy and for the baselines of kvq_baselines.py (Lloyd-Max 2-bit,
q4_0, q8_0) run through the same attention, window and sinks (tools/kvformat_eval.py). Policies are
"window_tokens:sinks" (page-granular windows: 64 = the current page + 1, 128 = + 2).
Passkey: a 5-digit key at 10 %, 50 %, 90 % depth of a filler text of N tokens, asked for at the end; greedy answer
must contain the key; counts per format. Cost: tokens a 1 GiB pool holds per format, the torch codec's encode /
decode throughput on this CPU, and prefill / decode tok/s of the daemon with hq-e8-2b against fp32 (a completion
of the given context, 64 new tokens, --server-threads 2).
"""
from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "tests")]

from kvformat_eval import evaluate, license_text, make_store, teacher_forced_logits  # noqa: E402
from kvq_baselines import BITS  # noqa: E402

from ignisd.cache.kv_format import get_kv_format  # noqa: E402
from ignisd.model.batch import ForwardBatch, SeqChunk  # noqa: E402


def _load_smollm():
    from daemon_support import smollm_gguf
    from ignisd.model.loader import load_model
    from ignisd.text.tokenizer import Tokenizer
    lm = load_model(smollm_gguf())
    return lm, Tokenizer.from_gguf(lm.source)


def quality(lm, tk, sizes, variants, policies, chunk):
    print("## teacher-forced KL(p_fp32 || p_fmt) and top-1 agreement, SmolLM2-135M, licence prose")
    print(f"{'T':>5} {'format':<10} {'W:S':>6} {'bits':>5} {'KL':>8} {'top1':>6}  by position bucket (KL / top1)")
    for t in sizes:
        ids = license_text(t, tk)
        ref = None
        for pol in policies:
            w, s = (int(x) for x in pol.split(":"))
            for v in variants:                                # one at a time: each row prints when it is done
                t0 = time.time()
                ref, res = evaluate(lm.model, lm.spec, ids, [v], exact_window=w, exact_sinks=s, chunk=chunk,
                                    ref=ref)
                r = res[v]
                b = "  ".join(f"[{lo},{hi}) {kl:.4f}/{a:.3f}" for lo, hi, kl, a, _ in r["buckets"])
                print(f"{t:>5} {v:<10} {pol:>6} {BITS.get(v.removesuffix('+c'), 0):>5} {r['kl']:>8.4f} "
                      f"{r['top1']:>6.3f}  {b}  ({time.time() - t0:.0f} s)", flush=True)


FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "


@torch.inference_mode()
def _greedy(model, kv, st, ids, n_new):
    logits = teacher_forced_logits(model, ids, kv, st, chunk=512)[-1]
    out = [int(logits.argmax())]
    pages = list(range(kv.num_pages))
    for i in range(n_new - 1):
        b = ForwardBatch.build([SeqChunk([out[-1]], len(ids) + i, pages, "last", 0 if st is not None else None)],
                               kv.page_tokens)
        out.append(int(model.forward(b, kv, st)[0].argmax()))
    return out


def passkey(lm, tk, sizes, trials, policy):
    w, s = (int(x) for x in policy.split(":"))
    print(f"## passkey retrieval (greedy, key at 10/50/90 % depth), hq-e8-2b W:S {policy} vs fp32")
    rng = random.Random(0)
    filler = tk.encode(FILLER)
    head = tk.encode("There is an important pass key hidden inside a lot of irrelevant text. Find it and memorize "
                     "it. I will quiz you about it.\n")
    for n in sizes:
        for depth in (0.1, 0.5, 0.9):
            hits = {"fp32": 0, "hq-e8-2b": 0}
            for _ in range(trials):
                key = rng.randint(10000, 99999)
                needle = tk.encode(f" The pass key is {key}. Remember it. {key} is the pass key. ")
                tail = tk.encode("\nWhat is the pass key? The pass key is")
                body = n - len(head) - len(needle) - len(tail)
                fill = (filler * (body // len(filler) + 1))[:body]
                cut = int(body * depth)
                ids = head + fill[:cut] + needle + fill[cut:] + tail
                for fmt in hits:
                    kv, st = make_store(lm.spec, fmt, len(ids) + 8, w, s)
                    text = tk.decode(_greedy(lm.model, kv, st, ids, 7))
                    hits[fmt] += str(key) in re.sub(r"\s", "", text)
            print(f"{n:>5} tokens depth {depth:.0%}: fp32 {hits['fp32']}/{trials}  "
                  f"hq-e8-2b {hits['hq-e8-2b']}/{trials}", flush=True)


def _codec_rates():
    import ignis_kernels.kvq as kvq
    u = torch.randn(16384, 64)
    t0 = time.time()
    codes, scale, _, _ = kvq.encode_rotated(u)
    enc = time.time() - t0
    t0 = time.time()
    for _ in range(10):
        kvq.decode_rotated(codes, scale)
    dec = (time.time() - t0) / 10
    mb = u.numel() * 4 / 1e6
    return mb / enc, mb / dec


def _daemon_rates(fmt, ctx, tk):
    from daemon_support import DaemonProc
    d = DaemonProc(["--lanes", "1", "--vram-kv-pool-bytes", f"{ctx + 256}tok", "--model-kv-format", fmt,
                    "--server-threads", "2", "--reuse-prompt", "off"], Path(tempfile.mkdtemp(prefix="ignis-")))
    try:
        ids = license_text(ctx, tk)
        from daemon_support import RawConn
        c = RawConn(d.socket, timeout=1800.0)                          # a 4K hq prefill on a busy 2-core box is slow
        c.request({"id": "w", "op": "completion", "prompt": ids[:64], "max_tokens": 4, "temperature": 0})
        r = c.request({"id": "r", "op": "completion", "prompt": ids, "max_tokens": 64, "temperature": 0,
                       "stop": []})
        c.close()
        return r["timings"]["prefill_tokens_per_s"], r["timings"]["decode_tokens_per_s"]
    finally:
        d.stop()


def cost(lm, tk, contexts):
    print("## capacity: tokens in a 1 GiB KV pool")
    for name in ("fp32", "bf16", "hq-e8-2b"):
        bpt = get_kv_format(name).bytes_per_token(lm.spec)
        print(f"   {name:<9} {bpt:>6} B/token  {(1 << 30) // bpt:>9,} tokens")
    enc, dec = _codec_rates()
    print(f"## torch codec on this CPU ({torch.get_num_threads()} threads, head_dim 64, MB of fp32 vectors / s): "
          f"encode {enc:.1f} MB/s, decode {dec:.0f} MB/s")
    print("## daemon prefill / decode tok/s (SmolLM2, 1 lane, --server-threads 2, 64 new tokens)")
    for ctx in contexts:
        row = {f: _daemon_rates(f, ctx, tk) for f in ("fp32", "hq-e8-2b")}
        (pf, df), (ph, dh) = row["fp32"], row["hq-e8-2b"]
        print(f"   ctx {ctx:>5}: prefill fp32 {pf:.0f} hq {ph:.0f} ({ph / pf - 1:+.0%})   decode fp32 {df:.1f} "
              f"hq {dh:.1f} ({dh / df - 1:+.0%})", flush=True)


def hybrid(policies, tokens):
    from make_tiny_checkpoint import make_tiny_qwen3_5
    from ignisd.model.loader import load_model
    out = make_tiny_qwen3_5(tempfile.mkdtemp(prefix="tinyq-"), seed=0, hidden=128)
    lm = load_model(out)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, lm.spec.vocab_size, (tokens,), generator=g).tolist()
    print(f"## tiny random Qwen3.5 hybrid (head_dim {lm.spec.head_dim}), {tokens} random tokens")
    for pol in policies:
        w, s = (int(x) for x in pol.split(":"))
        _, res = evaluate(lm.model, lm.spec, ids, ["hq-e8-2b", "lloyd2"], exact_window=w, exact_sinks=s)
        for v, r in res.items():
            print(f"   {v:<9} W:S {pol:>6}  KL {r['kl']:.5f}  top1 {r['top1']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="", help="quality context sizes, e.g. 1024,2048,4096,8192")
    ap.add_argument("--variants", default="hq-e8-2b,lloyd2,q4_0,q8_0")
    ap.add_argument("--policies", default="64:1,128:1,128:4", help="window_tokens:sinks, comma separated")
    ap.add_argument("--chunk", type=int, default=256, help="prefill chunk of the teacher-forced runs")
    ap.add_argument("--passkey", default="", help="passkey context sizes, e.g. 4096,8192")
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--passkey-policy", default="128:1")
    ap.add_argument("--cost", action="store_true")
    ap.add_argument("--cost-contexts", default="1024,4096")
    ap.add_argument("--hybrid", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    need = a.sizes or a.passkey or a.cost
    lm, tk = _load_smollm() if need else (None, None)
    if a.sizes:
        quality(lm, tk, ints(a.sizes), a.variants.split(","), a.policies.split(","), a.chunk)
    if a.passkey:
        passkey(lm, tk, ints(a.passkey), a.trials, a.passkey_policy)
    if a.cost:
        cost(lm, tk, ints(a.cost_contexts))
    if a.hybrid:
        hybrid(a.policies.split(","), 512)


if __name__ == "__main__":
    main()
