"""Prefill and decode throughput of ignis's hybrid forward against transformers on the same random weights.

    python tools/bench_hybrid.py [--kind qwen3_5|qwen3_next] [--hidden 1024] [--layers 8] [--vocab 1024]
                                 [--threads N] [--decode-steps 32] [--dir DIR]

Builds (once, in DIR or a temporary directory) a random-weight hybrid checkpoint with tools/make_tiny_checkpoint.py:
hidden 1,024, 8 layers (6 GDN + 2 gated attention), attention 8 heads x 128 (2 KV heads), GDN Hk 4 / Hv 8 heads of
128, SwiGLU 3,072 (qwen3_5) or 8 experts top-2 + a shared expert (qwen3_next). Then, fp32 on the CPU:

- prefill tokens/s of one sequence of 512 and of 2,048 tokens fed in chunks of 256 (ignis: Decoder.forward per chunk,
  fp32 KV pages + a state slot; transformers: model(chunk, cache=..., logits_to_keep=1) per chunk);
- decode tokens/s for 1 and 8 lanes (each lane prefilled with 128 tokens first, then --decode-steps steps of one
  token per lane in one batched forward; transformers: a batch of equal-length rows with its cache).

Prints one line per measurement with both rates and ours/transformers. Timings are wall clock, the two sides
alternating, best of --repeat each.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_tiny_checkpoint import make_tiny_qwen3_5, make_tiny_qwen3_next  # noqa: E402

BENCH_SHAPE = dict(num_hidden_layers=8, full_attention_interval=4, num_attention_heads=8, num_key_value_heads=2,
                   head_dim=128, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=128,
                   linear_value_head_dim=128)


def build(kind: str, out: Path, hidden: int, layers: int, vocab: int) -> Path:
    """Write the bench checkpoint (random weights, seed 0) unless out already holds one."""
    if (out / "config.json").is_file():
        return out
    shape = dict(BENCH_SHAPE, num_hidden_layers=layers)
    if kind == "qwen3_5":
        return make_tiny_qwen3_5(out, seed=0, vocab=vocab, hidden=hidden, intermediate_size=3 * hidden, **shape)
    return make_tiny_qwen3_next(out, seed=0, vocab=vocab, hidden=hidden, **shape)


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


class Ours:
    """ignis's model with a KV pool and state slots big enough for the bench."""

    def __init__(self, path: Path, lanes: int, tokens: int):
        from ignisd.cache.kv_format import get_kv_format
        from ignisd.cache.kv_store import KVStore
        from ignisd.cache.state_store import StateStore
        from ignisd.model.loader import load_model

        self.lm = load_model(path)
        self.pt = 64
        self.pages_per_lane = -(-tokens // self.pt)
        self.kv = KVStore(get_kv_format("fp32"), self.lm.spec, lanes * self.pages_per_lane, page_tokens=self.pt)
        self.states = StateStore(self.lm.spec.state_buffers(), lanes)

    def pages(self, lane: int) -> list[int]:
        return list(range(lane * self.pages_per_lane, (lane + 1) * self.pages_per_lane))

    def prefill(self, ids: list[int], chunk: int, lane: int = 0) -> torch.Tensor:
        from ignisd.model.batch import ForwardBatch, SeqChunk

        self.states.zero(lane)
        out = None
        for s in range(0, len(ids), chunk):
            part = ids[s:s + chunk]
            mode = "last" if s + chunk >= len(ids) else "none"
            b = ForwardBatch.build([SeqChunk(part, s, self.pages(lane), mode, state_slot=lane)], self.pt)
            out = self.lm.model.forward(b, self.kv, self.states)
        return out

    def decode(self, prompts: list[list[int]], steps: int, tokens: list[int]) -> float:
        """Prefill each lane's prompt (untimed), then `steps` batched decode steps; returns their seconds."""
        from ignisd.model.batch import ForwardBatch, SeqChunk

        for lane, p in enumerate(prompts):
            self.prefill(p, 256, lane)
        n = len(prompts[0])
        t0 = time.perf_counter()
        for j in range(steps):
            chunks = [SeqChunk([tokens[j]], n + j, self.pages(lane), "last", state_slot=lane)
                      for lane in range(len(prompts))]
            self.lm.model.forward(ForwardBatch.build(chunks, self.pt), self.kv, self.states)
        return time.perf_counter() - t0


class Theirs:
    """transformers' model of the same directory, fp32, with its own cache."""

    def __init__(self, path: Path):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()

    @torch.inference_mode()
    def prefill(self, ids: list[int], chunk: int):
        x = torch.tensor([ids])
        out = self.model(x[:, :chunk], use_cache=True, logits_to_keep=1)
        for s in range(chunk, len(ids), chunk):
            out = self.model(x[:, s:s + chunk], cache=out.cache, use_cache=True, logits_to_keep=1)
        return out

    @torch.inference_mode()
    def decode(self, prompts: list[list[int]], steps: int, tokens: list[int]) -> float:
        """Prefill the batch of prompts (untimed), then `steps` decode steps; returns their seconds."""
        out = self.model(torch.tensor(prompts), use_cache=True, logits_to_keep=1)
        t0 = time.perf_counter()
        for j in range(steps):
            step = torch.full((len(prompts), 1), tokens[j], dtype=torch.long)
            out = self.model(step, cache=out.cache, use_cache=True, logits_to_keep=1)
        return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=("qwen3_5", "qwen3_next"), default="qwen3_5")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--decode-steps", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--dir", default=None, help="checkpoint directory (built there if empty)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tmp = None
    if args.dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="ignis-bench-hybrid-")
        args.dir = tmp.name
    path = build(args.kind, Path(args.dir), args.hidden, args.layers, args.vocab)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (2048,), generator=gen).tolist()
    toks = torch.randint(0, args.vocab, (args.decode_steps,), generator=gen).tolist()
    ours, theirs = Ours(path, 8, 2048 + 256 + args.decode_steps), Theirs(path)
    print(f"bench_hybrid: {args.kind} hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}, fp32, "
          f"{torch.get_num_threads()} threads, ignis weights {ours.lm.weight_bytes / 2**20:.0f} MiB")
    ours.prefill(ids[:256], 256)            # warm up both
    theirs.prefill(ids[:256], 256)
    rows = []
    for n in (512, 2048):          # ours and theirs alternate, best of --repeat each (the box may be shared)
        a = b = float("inf")
        for _ in range(args.repeat):
            a = min(a, _best(lambda n=n: ours.prefill(ids[:n], 256), 1))
            b = min(b, _best(lambda n=n: theirs.prefill(ids[:n], 256), 1))
        rows.append((f"prefill {n} tok (chunks of 256)", n / a, n / b))
    for lanes in (1, 8):
        prompts = [ids[128 * i:128 * (i + 1)] for i in range(lanes)]
        steps = args.decode_steps
        a = b = float("inf")
        for _ in range(args.repeat):
            a = min(a, ours.decode(prompts, steps, toks))
            b = min(b, theirs.decode(prompts, steps, toks))
        rows.append((f"decode {lanes} lane{'s' if lanes > 1 else ''} ({steps} steps)",
                     lanes * steps / a, lanes * steps / b))
    for name, ra, rb in rows:
        print(f"{name:34s} ignis {ra:9.1f} tok/s   transformers {rb:9.1f} tok/s   ratio {ra / rb:5.2f}x")
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
