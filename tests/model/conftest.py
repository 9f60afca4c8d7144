"""Model-oracle fixtures, all session-scoped so each model loads once: ignis's and transformers' SmolLM2 (the
latter is tests/conftest.py's `hf_smollm`), the tiny random Llama both ways, SmolLM2's tokenizer, prompt ids."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_prompts import PROMPTS  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smollm_reader(smollm_path):
    """gguf.GGUFReader of the built-in GGUF (parsing its metadata takes seconds: once a session)."""
    import gguf
    return gguf.GGUFReader(str(smollm_path))


@pytest.fixture(scope="session")
def smollm_ours(smollm_path):
    """ignis's LoadedModel of the built-in GGUF, dequantized to fp32 (weight_format pinned: the transformers oracle
    runs on gguf's dequantized weights)."""
    from ignisd.model.loader import load_model
    return load_model(smollm_path, weight_format="fp32")


@pytest.fixture(scope="session")
def tiny_ours(tiny_llama_dir):
    """ignis's LoadedModel of the tiny random Llama directory."""
    from ignisd.model.loader import load_model
    return load_model(tiny_llama_dir)


@pytest.fixture(scope="session")
def tiny_hf(tiny_llama_dir):
    """transformers' LlamaForCausalLM of the tiny directory, fp32."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def prompt_ids(tiny_llama_dir) -> dict[str, list[int]]:
    """Token ids of each prompt with SmolLM2's tokenizer (the tokenizer.json transformers converted from the GGUF
    into the tiny directory; no BOS: SmolLM2's GGUF sets add_bos_token false)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(tiny_llama_dir / "tokenizer.json"))
    ids = {name: tok.encode(text, add_special_tokens=False).ids for name, text in PROMPTS.items()}
    assert all(10 <= len(v) <= 500 for v in ids.values()), {k: len(v) for k, v in ids.items()}
    return ids


@pytest.fixture(scope="session")
def hf_smollm_logits(hf_smollm, prompt_ids) -> dict[str, torch.Tensor]:
    """transformers' full-sequence fp32 logits [len, vocab] of each prompt (the oracle)."""
    with torch.inference_mode():
        return {k: hf_smollm(torch.tensor([v])).logits[0].float() for k, v in prompt_ids.items()}
