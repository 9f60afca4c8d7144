"""hq-e8-2b quality and cost figures (HQ_E8_2B.md §5.4; issue 10). Prints tables; asserts nothing.

    python tools/bench_kvformat.py --sizes 1024,2048                  # quality: KL / top-1 vs the fp32 cache
    python tools/bench_kvformat.py --sizes 4096,8192 --variants hq-e8-2b --policies 128:4
    python tools/bench_kvformat.py --sizes 1024 --variants hq-e8-2b@vc1,hq-e8-2b@vc0 --policies 128:1   # α 1, 0
    python tools/bench_kvformat.py --passkey 4096,8192 --trials 20    # passkey retrieval, hq-e8-2b vs fp32
    python tools/bench_kvformat.py --passkey 8192 --passkey-depths 0.1 --passkey-formats hq-e8-2b --passkey-trials 0:10
    python tools/bench_kvformat.py --cost --cost-contexts 1024,4096   # capacity, codec MB/s, daemon tok/s
    python tools/bench_kvformat.py --hybrid                           # the same KL on the tiny random Qwen3.5
    python tools/bench_kvformat.py --passkey 4096 --passkey-formats hq-e8-2b --format-seed 1234567890abcdef  # research

Quality: teacher-forced next-token KL(p_fp32 ‖ p_fmt) and top-1 agreement on SmolLM2-135M-Instruct over real prose
(Debian's common-licenses: GPL-3, then GPL-2 and others joined for longer contexts), overall and by context-position
bucket, for hq-e8-2b under each window:sinks policy and for the baselines of kvq_baselines.py (Lloyd-Max 2-bit,
q4_0, q8_0) run through the same attention, window and sinks (tools/kvformat_eval.py). Policies are
"window_tokens:sinks" (page-granular windows: 64 = the current page + 1, 128 = + 2).
Passkey: a 5-digit key at 10 %, 50 %, 90 % depth of a filler text of N tokens, asked for at the end; retrieved when
the teacher-forced greedy argmax is every answer token (tools/kvformat_passkey.py: the text before the needle is
prefilled once per (format, N, depth) and forked per trial); counts per format.
Cost: tokens a 1 GiB pool holds per format, the torch codec's encode /
decode throughput on this CPU, and prefill / decode tok/s of the daemon with hq-e8-2b against fp32 (a completion
of the given context, 64 new tokens, --server-threads 2).
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tools"), str(ROOT / "tests")]

from kvformat_eval import evaluate, format_seed, license_text, parse_format_seed  # noqa: E402
from kvformat_passkey import passkey_trials, trial_keys  # noqa: E402
from kvq_baselines import BITS  # noqa: E402

from ignis_kernels.attention import hq_backend  # noqa: E402
from ignis_kernels.hq_seed import SHIPPED_SEED  # noqa: E402
from ignisd.cache.kv_format import get_kv_format  # noqa: E402


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
                print(f"{t:>5} {v:<10} {pol:>6} {BITS.get(re.split('[+@]', v)[0], 0):>5} {r['kl']:>8.4f} "
                      f"{r['top1']:>6.3f}  {b}  ({time.time() - t0:.0f} s)", flush=True)


def passkey(lm, tk, sizes, trials, policy, depths=(0.1, 0.5, 0.9), formats=("fp32", "hq-e8-2b"),
            part: tuple[int, int] | None = None):
    """Passkey counts per (n, depth) for each format (tools/kvformat_passkey.py: shared prefix prefilled once and
    forked per trial, retrieval scored by teacher forcing the answer), with the answer margins (logits; min over the
    answer tokens of answer − best other) of the trials: mean, standard deviation and smallest, and how many fall
    under 0.5. part: (lo, hi) runs only trials [lo, hi) of the `trials` fixed keys (a slice of a long run; the
    slices' counts add up). Ends with each format's total."""
    w, s = (int(x) for x in policy.split(":"))
    print(f"## passkey retrieval (5-digit key at 10/50/90 % depth, teacher-forced greedy answer), W:S {policy}")
    print("   margin: logits, min over answer tokens of (answer − best other); mean ± sd, min, trials under 0.5")
    keys = trial_keys(trials)
    lo, hi = part or (0, trials)
    keys = keys[lo:hi]
    total = {f: 0 for f in formats}
    for n in sizes:
        for depth in depths:
            for f in formats:
                t0 = time.time()
                res = passkey_trials(lm.model, lm.spec, tk, f, n, depth, keys, w, s)
                hits, m = sum(h for h, _ in res), [x for _, x in res]
                total[f] += hits
                sd = statistics.pstdev(m) if len(m) > 1 else 0.0
                print(f"{n:>5} tokens depth {depth:>4.0%} trials [{lo},{hi}) {f:<10} {hits:>3}/{len(keys)}  margin "
                      f"{statistics.fmean(m):.2f} ± {sd:.2f}, min {min(m):+.2f}, {sum(x < 0.5 for x in m)} under 0.5"
                      f"  ({time.time() - t0:.0f} s)", flush=True)
    print("total: " + "  ".join(f"{f} {h}/{len(keys) * len(sizes) * len(depths)}" for f, h in total.items()))


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


def cost(lm, tk, contexts, rounds: int = 2):
    print("## capacity: tokens in a 1 GiB KV pool")
    for name in ("fp32", "bf16", "hq-e8-2b"):
        bpt = get_kv_format(name).bytes_per_token(lm.spec)
        print(f"   {name:<9} {bpt:>6} B/token  {(1 << 30) // bpt:>9,} tokens")
    enc, dec = _codec_rates()
    print(f"## torch codec on this CPU ({torch.get_num_threads()} threads, head_dim 64, MB of fp32 vectors / s): "
          f"encode {enc:.1f} MB/s, decode {dec:.0f} MB/s")
    print(f"## daemon prefill / decode tok/s (SmolLM2, 1 lane, --server-threads 2, 64 new tokens; median of {rounds} "
          f"daemons per format, alternated fp32, hq, hq, fp32, ...; hq decode attention backend: "
          f"{hq_backend(torch.device('cpu'))})")
    for ctx in contexts:
        runs = {"fp32": [], "hq-e8-2b": []}
        for r in range(rounds):
            for f in (("fp32", "hq-e8-2b") if r % 2 == 0 else ("hq-e8-2b", "fp32")):
                runs[f].append(_daemon_rates(f, ctx, tk))
        (pf, df), (ph, dh) = ([statistics.median(x[i] for x in runs[f]) for i in (0, 1)] for f in ("fp32", "hq-e8-2b"))
        each = "  ".join(f"{f} " + "/".join(f"{x[1]:.1f}" for x in v) for f, v in runs.items())
        print(f"   ctx {ctx:>5}: prefill fp32 {pf:.0f} hq {ph:.0f} ({ph / pf - 1:+.0%})   decode fp32 {df:.1f} "
              f"hq {dh:.1f} ({dh / df - 1:+.0%}, hq/fp32 {dh / df:.2f}x; aim >= 0.85x)   each decode: {each}",
              flush=True)


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
    ap.add_argument("--passkey-depths", default="0.1,0.5,0.9", help="needle depths, fractions of the filler")
    ap.add_argument("--passkey-formats", default="fp32,hq-e8-2b")
    ap.add_argument("--passkey-trials", default="", help="lo:hi, a slice of the --trials keys (long runs in parts)")
    ap.add_argument("--cost", action="store_true")
    ap.add_argument("--cost-contexts", default="1024,4096")
    ap.add_argument("--cost-rounds", type=int, default=2, help="daemons per format and context (median)")
    ap.add_argument("--hybrid", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--format-seed", default="", metavar="HEX",
                    help="research: another hq-e8-2b rotation seed (HQ_E8_2B.md §2.1) for the in-process --sizes, "
                         "--passkey and --hybrid runs (not --cost's daemons), to measure how figures move with the "
                         "draw of the rotation")
    a = ap.parse_args()
    try:
        seed = parse_format_seed(a.format_seed) if a.format_seed else None
    except ValueError as e:
        ap.error(str(e))
    with format_seed(seed) as in_effect:
        _run(a, in_effect)


def _run(a: argparse.Namespace, seed: int) -> None:
    """The runs `a` asks for, with hq-e8-2b's rotation seed `seed` in effect."""
    torch.set_num_threads(a.threads)
    mark = " (the format's)" if seed == SHIPPED_SEED else " (research: not the format's)"
    print(f"## hq-e8-2b rotation seed {seed:#018x}{mark}")
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    need = a.sizes or a.passkey or a.cost
    lm, tk = _load_smollm() if need else (None, None)
    if a.sizes:
        quality(lm, tk, ints(a.sizes), a.variants.split(","), a.policies.split(","), a.chunk)
    if a.passkey:
        part = tuple(int(x) for x in a.passkey_trials.split(":")) if a.passkey_trials else None
        passkey(lm, tk, ints(a.passkey), a.trials, a.passkey_policy, [float(x) for x in a.passkey_depths.split(",")],
                a.passkey_formats.split(","), part)
    if a.cost:
        cost(lm, tk, ints(a.cost_contexts), a.cost_rounds)
    if a.hybrid:
        hybrid(a.policies.split(","), 512)


if __name__ == "__main__":
    main()
