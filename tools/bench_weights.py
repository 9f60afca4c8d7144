"""Weight-format figures (issue 11): per-shape matmul microbench, peak memory of the loaded model, decode and
prefill speed through the model, native-vs-fp32 quality. Prints tables; asserts nothing.

    python tools/bench_weights.py --micro                 # us per matmul, SmolLM2 shapes, 1 / 8 / 256 rows
    python tools/bench_weights.py --rss                   # peak RSS (VmHWM) of the loaded model per weight format
    python tools/bench_weights.py --speed                 # decode tok/s at 1 and 8 lanes, prefill tok/s (512 tokens)
    python tools/bench_weights.py --quality               # KL / top-1 / greedy of native and bf16 vs fp32, 20 prompts
    python tools/bench_weights.py --profile               # top operators of one 8-lane decode step per format
    python tools/bench_weights.py --attention             # decode attention: torch SDPA vs the C kernel, by context

--threads N (default 2) sets torch's threads. Times are the best of repeated runs (this machine is shared and noisy).
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "model")]

FORMATS = ("fp32", "bf16", "native")
SHAPES = {"q/o 576->576": (576, 576), "k/v 576->192": (576, 192), "qkv 576->960": (576, 960),
          "gate/up 576->1536": (576, 1536), "gate+up 576->3072": (576, 3072), "down 1536->576": (1536, 576),
          "lm_head 576->49152": (576, 49152)}


def best_us(f, seconds: float = 0.15) -> float:
    """Best wall time of f() in microseconds over `seconds` of repeats (after two warm-up calls)."""
    f()
    f()
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best * 1e6


def micro(rows_list=(1, 8, 256)) -> None:
    """us per matmul of each SmolLM2 shape: fp32 MKL (x @ w_t), bf16 (F.linear), int4 by torch's kernel (Q4_1
    layout, bf16), int4 as Int4Linear serves it (ignis_kernels.linear: the C product up to 8 rows, dequantized tiles
    and an fp32 GEMM above; torch's kernel where those do not serve), the Q8_0 head as two int4 layouts, int8
    per-channel (_weight_int8pack_mm, bf16), and torch's int4 kernel with fp32 activations."""
    from ignisd.model.linear import Int4Linear, Int8x2Linear, int4_mm
    from ignisd.model.quant import GroupQuant
    print(f"## us per matmul, {torch.get_num_threads()} threads (best of repeats)")
    cols = ["fp32", "bf16", "int4 torch", "int4 ignis", "q8_0x2int4", "int8pc", "int4-fp32act"]
    print(f"{'shape':<20} {'rows':>4} " + " ".join(f"{c:>12}" for c in cols))
    g = torch.Generator().manual_seed(0)
    for name, (k, n) in SHAPES.items():
        w = torch.randn(n, k, generator=g)
        wt, wb = w.t().contiguous(), w.bfloat16()
        d = torch.rand(n, k // 32, generator=g) * 0.01
        q4 = Int4Linear(GroupQuant("Q4_1", torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g), d, -8 * d))
        q8 = Int8x2Linear(GroupQuant("Q8_0", torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g), d,
                                     torch.zeros_like(d)))
        q4f = Int4Linear(GroupQuant("Q4_1", torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g), d, -8 * d),
                         scale_dtype=torch.float32)
        w8, s8 = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g), torch.rand(n).bfloat16()
        for rows in rows_list:
            if rows > 8 and n > 4096:
                continue
            x = torch.randn(rows, k, generator=g)
            xb = x.bfloat16()
            r = [best_us(partial(torch.mm, x, wt)), best_us(partial(F.linear, xb, wb)),
                 best_us(partial(int4_mm, x, q4.packed, q4.sz)), best_us(partial(q4, x)), best_us(partial(q8, x)),
                 best_us(partial(torch.ops.aten._weight_int8pack_mm, xb, w8, s8)),
                 best_us(partial(q4f, x), 0.05) if rows <= 8 else float("nan")]
            print(f"{name:<20} {rows:>4} " + " ".join(f"{v:12.1f}" for v in r), flush=True)


def attention(contexts=(128, 1024, 4096, 8192)) -> None:
    """us per decode attention call of one layer (SmolLM2: 9 query heads on 3 KV heads, d 64, fp32 pages): torch's
    SDPA path (kernels/attention/reference.py; one row reads a consecutive run in place, 8 rows gather) against the
    C kernel (dense_cpu.c), 1 and 8 rows."""
    from ignis_kernels.attention import dense_cpu, reference
    print(f"## us per decode attention call, {torch.get_num_threads()} threads (best of repeats)")
    print(f"{'rows':>4} {'context':>8} {'torch':>10} {'C kernel':>10} {'ratio':>7}")
    for rows in (1, 8):
        for ctx in contexts:
            per = -(-ctx // 64)
            kp, vp = torch.randn(rows * per, 64, 3, 64), torch.randn(rows * per, 64, 3, 64)
            q = torch.randn(rows, 9, 64)
            table, lens = torch.arange(rows * per).view(rows, per), torch.full((rows,), ctx)
            single = (ctx, 0) if rows == 1 else None
            t = best_us(partial(reference.paged_decode_attention, q, kp, vp, table, lens, None, single))
            c = best_us(partial(dense_cpu.decode_attention, q, kp, vp, table, lens))
            print(f"{rows:>4} {ctx:>8} {t:10.1f} {c:10.1f} {t / c:6.2f}x", flush=True)


def _load(fmt: str):
    from ignisd.model.loader import load_model
    return load_model(weight_format=fmt)


def rss() -> None:
    """Peak resident memory of a fresh process that imports torch and loads the built-in model per format."""
    print("## peak RSS (VmHWM) after loading the built-in SmolLM2 GGUF, fresh process per format")
    print(f"{'format':<8} {'weight MB':>10} {'peak MB':>9} {'baseline MB':>12} {'peak-baseline':>14}")
    for fmt in FORMATS:
        out = subprocess.run([sys.executable, __file__, "--rss-child", fmt], capture_output=True, text=True,
                             cwd=ROOT, check=True).stdout.split()
        wb, base, peak = (int(v) for v in out[-3:])
        print(f"{fmt:<8} {wb / 2**20:10.1f} {peak / 1024:9.1f} {base / 1024:12.1f} {(peak - base) / 1024:14.1f}")


def _rss_child(fmt: str) -> None:
    from ignisd.model.loader import open_model
    src = open_model()                          # torch + gguf's header parse: what every format pays
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    from ignisd.model.loader import load_model
    lm = load_model(src, weight_format=fmt)
    print(lm.weight_bytes, base, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _decode_setup(lm, lanes: int, context: int):
    from ignisd.cache.kv_format import get_kv_format
    from ignisd.cache.kv_store import KVStore
    from ignisd.model.batch import ForwardBatch, SeqChunk
    per = -(-(context + 64) // 64)
    kv = KVStore(get_kv_format("fp32"), lm.spec, per * lanes)
    pages = [list(range(i * per, (i + 1) * per)) for i in range(lanes)]
    ids = [(7 * i + 13) % 40000 + 100 for i in range(context)]
    for p in pages:
        lm.model.forward(ForwardBatch.build([SeqChunk(ids, 0, p, "last")], 64), kv)
    step = ForwardBatch.build([SeqChunk([ids[-1]], context, p, "last") for p in pages], 64)
    return kv, step


def speed(context: int = 128, prefill_tokens: int = 512) -> None:
    """Decode tok/s of 1 and 8 lanes (one token each, context `context`), prefill tok/s of one `prefill_tokens`
    prompt in 256-token chunks, per weight format, through Decoder.forward (fp32 KV pages)."""
    print(f"## speed, {torch.get_num_threads()} threads: decode at context {context}, prefill of {prefill_tokens}")
    print(f"{'format':<8} {'decode 1 lane':>14} {'decode 8 lanes':>15} {'prefill':>10}   (tok/s)")
    for fmt in FORMATS:
        r = _speed_of(_load(fmt), context, prefill_tokens)
        print(f"{fmt:<8} {r[0]:14.1f} {r[1]:15.1f} {r[2]:10.1f}", flush=True)


def _speed_of(lm, context: int, prefill_tokens: int) -> list[float]:
    from ignisd.cache.kv_format import get_kv_format
    from ignisd.cache.kv_store import KVStore
    from ignisd.model.batch import ForwardBatch, SeqChunk
    r = []
    for lanes in (1, 8):
        kv, step = _decode_setup(lm, lanes, context)
        r.append(lanes / (best_us(partial(lm.model.forward, step, kv), 1.0) / 1e6))
    kv = KVStore(get_kv_format("fp32"), lm.spec, prefill_tokens // 64 + 1)
    ids = [(7 * i + 13) % 40000 + 100 for i in range(prefill_tokens)]
    batches = [ForwardBatch.build([SeqChunk(ids[s:s + 256], s, list(range(kv.num_pages)), "last")], 64)
               for s in range(0, prefill_tokens, 256)]

    def prefill():
        for b in batches:
            lm.model.forward(b, kv)
    r.append(prefill_tokens / (best_us(prefill, 2.0) / 1e6))
    return r


def profile(lanes: int = 8, context: int = 128) -> None:
    """torch.profiler operator table (self CPU time) of 5 decode steps of `lanes` lanes, per format."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile
    for fmt in FORMATS:
        lm = _load(fmt)
        kv, step = _decode_setup(lm, lanes, context)
        lm.model.forward(step, kv)
        with tprofile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                lm.model.forward(step, kv)
        print(f"## {fmt}: 5 decode steps of {lanes} lanes")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
        del lm


def quality() -> None:
    """Issue 11's Done-when figures: mean KL, top-1 and greedy identity of native and bf16 against fp32."""
    from text_corpus import ignis_smollm_tokenizer
    from weight_quality import GREEDY_TOKENS, compare_models, real_prompts
    prompts = real_prompts(ignis_smollm_tokenizer())
    ref = _load("fp32")
    print(f"## against fp32 on {len(prompts)} real prompts (tokenizer corpus, <= 96 tokens; greedy {GREEDY_TOKENS} "
          f"tokens)")
    print(f"{'format':<8} {'mean KL':>9} {'max KL':>9} {'top-1':>7} {'greedy same':>12}  fp32 top-2 margin where "
          f"the greedy texts part")
    for fmt in ("native", "bf16"):
        q = compare_models(ref.model, _load(fmt).model, ref.spec, prompts)
        print(f"{fmt:<8} {q.mean_kl:9.2e} {q.max_kl:9.2e} {q.top1:7.4f} {q.greedy_same:>9}/{q.prompts}  "
              f"{' '.join(f'{m:.3g}' for m in q.margins)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--micro", action="store_true")
    ap.add_argument("--rss", action="store_true")
    ap.add_argument("--speed", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--quality", action="store_true")
    ap.add_argument("--attention", action="store_true")
    ap.add_argument("--rss-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.rss_child:
        return _rss_child(a.rss_child)
    if not (a.micro or a.rss or a.speed or a.profile or a.quality or a.attention):
        a.micro = a.rss = a.speed = a.quality = True
    with torch.inference_mode():
        if a.micro:
            micro()
        if a.rss:
            rss()
        if a.speed:
            speed()
        if a.profile:
            profile()
        if a.quality:
            quality()
        if a.attention:
            attention()


if __name__ == "__main__":
    main()
