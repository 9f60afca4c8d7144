"""Load a model from a GGUF file (gguf package) or an HF-style directory (config.json + safetensors).

GGUF llama files store the Q and K projection rows permuted for llama.cpp's adjacent-pair rotary
(convert_hf_to_gguf.py `LlamaModel.permute`); they are un-permuted here to Hugging Face's rotate-half order with
the inverse transformers applies (modeling_gguf_pytorch_utils.LlamaTensorProcessor._reverse_permute_weights):
rows of each head are (pair j, parity p) -> (parity p, pair j).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ignisd.log import get_logger
from ignisd.model.builtin import builtin_model_path
from ignisd.model.hybrid import Decoder
from ignisd.model.hybrid_weights import hf_weight_name, skipped_group, split_fused_gdn
from ignisd.model.layers import LazyWeight
from ignisd.model.quant import QUANT_TYPES, from_gguf_blocks
from ignisd.model.spec import ModelSpec

log = get_logger("model")

# GGUF llama tensor names -> HF LlamaForCausalLM names ({i} = block index).
_GGUF_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
_GGUF_BLOCK = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@dataclass
class LoadedModel:
    """A model ready to run.

    spec: ModelSpec. model: the Decoder (every family). source: the GGUF file or HF directory loaded.
    kind: "gguf" | "hf".
    weight_bytes: bytes of the resident weights (in the weight format they were loaded in).
    gguf_reader: the open gguf.GGUFReader of a GGUF source (None for "hf"), so the tokenizer reads the same parse.
    """

    spec: ModelSpec
    model: Decoder
    source: Path
    kind: str
    weight_bytes: int
    gguf_reader: Any = None


@dataclass
class ModelSource:
    """A model's file(s) and architecture numbers, read before any weight (``open_model``).

    spec: ModelSpec from config.json or the GGUF header. source: the GGUF file or HF directory. kind: "gguf" |
    "hf". gguf_reader: the open gguf.GGUFReader of a GGUF source (its tensors are memory-mapped, not read).
    """

    spec: ModelSpec
    source: Path
    kind: str
    gguf_reader: Any = None


def open_model(path: str | Path | None = None) -> ModelSource:
    """Find the model at `path` (None: the built-in model) and read its architecture numbers only: config.json of
    an HF directory, or the header of a GGUF file (one parse, reused by ``load_model`` and the tokenizer).

    path: a .gguf file, a directory holding config.json (+ model.safetensors or model.safetensors.index.json), or a
    directory holding exactly one .gguf file. Raises FileNotFoundError (nothing loadable at path), ValueError
    (unsupported architecture, malformed config).
    """
    p = builtin_model_path() if path is None else Path(path).expanduser()
    if p.is_dir():
        if (p / "config.json").is_file():
            config = json.loads((p / "config.json").read_text())
            return ModelSource(ModelSpec.from_hf_config(config, config.get("_name_or_path") or p.name), p, "hf")
        ggufs = sorted(p.glob("*.gguf"))
        if len(ggufs) != 1:
            raise FileNotFoundError(f"{p}: no config.json and {len(ggufs)} .gguf files (need exactly one)")
        p = ggufs[0]
    elif not p.is_file():
        raise FileNotFoundError(f"model path {p} does not exist")
    import gguf

    reader = gguf.GGUFReader(str(p))
    name = p.name[:-5] if p.name.endswith(".gguf") else p.name
    return ModelSource(ModelSpec.from_gguf_metadata(reader, name), p, "gguf", reader)


def load_model(path: str | Path | ModelSource | None = None, dtype: torch.dtype = torch.float32,
               batch_invariant: bool = False, progress=None, weight_format: str = "fp32") -> LoadedModel:
    """Load the model at `path` (a path, None for the built-in model, or the ModelSource of ``open_model``).

    weight_format (model.weight_format, DESIGN §6): "fp32" (default here: every tensor dequantized to fp32 by
    gguf.quants.dequantize, the exact reference of the oracle tests), "native" (GGUF Q4_0 / Q4_1 / Q8_0 tensors kept
    quantized, ignisd.model.quant, and run by the int4 kernels of ignisd.model.linear; other tensors and HF
    checkpoints as fp32) or "bf16" (the matmul weights and the token table in bf16).
    dtype: dense weight/compute dtype (fp32 on CPU). batch_invariant: see Decoder (bitwise batch-independent rows at ~2x
    single-lane matmul cost; settable later as loaded.model.batch_invariant). progress: wraps the tensor loops,
    ``progress(items, total, desc)`` (ignisd.progress.LoadProgress: a tqdm bar on a terminal, STATUS= lines).
    Raises FileNotFoundError (nothing loadable at path), ValueError (unsupported architecture / tensor type),
    KeyError (a required tensor is missing).
    """
    src = path if isinstance(path, ModelSource) else open_model(path)
    progress = progress or (lambda items, total=None, desc="": items)
    if src.kind == "hf":
        weights = _read_hf_weights(src.source, src.spec, progress)
    else:
        weights = _read_gguf_weights(src.source, src.gguf_reader, src.spec, progress,
                                     keep_quantized=weight_format != "fp32")
    weights = {k: v.to(dtype) if isinstance(v, torch.Tensor) else v for k, v in weights.items()}
    model = Decoder(src.spec, weights, batch_invariant=batch_invariant, weight_format=weight_format)
    return LoadedModel(spec=src.spec, model=model, source=src.source, kind=src.kind, weight_bytes=model.weight_bytes,
                       gguf_reader=src.gguf_reader)


def _gguf_name(name: str) -> str | None:
    """GGUF tensor name -> HF name, or None for tensors the model does not use (e.g. rope_freqs)."""
    if name in _GGUF_GLOBAL:
        return _GGUF_GLOBAL[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _GGUF_BLOCK:
        return f"model.layers.{parts[1]}.{_GGUF_BLOCK[parts[2]]}.{parts[3]}"
    return None


def unpermute_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: w [n_heads * d, ...] with each head's rows ordered (pair j, parity p)
    -> (parity p, pair j), i.e. rows for HF rotate-half rotary. Same as transformers' _reverse_permute_weights."""
    half = w.shape[0] // n_heads // 2
    return w.reshape(n_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _read_gguf_weights(path: Path, reader: Any, spec: ModelSpec, progress,
                       keep_quantized: bool = False) -> dict[str, Any]:
    """Every tensor of the open GGUF `reader` with HF names and row order: dequantised to fp32 torch tensors
    (gguf.quants.dequantize), or with keep_quantized the types of quant.QUANT_TYPES as layers.LazyWeight of a
    quant.GroupQuant (codes and scales, rows un-permuted the same way; unpacked from the memory map only when the
    decoder takes it, so the codes of one layer at a time are ever held beside the packed model) and the rest
    dequantised."""
    import gguf

    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise ValueError(f"{path}: rope_freqs (llama 3.1 rope scaling in GGUF) is not supported yet")
    weights: dict[str, torch.Tensor] = {}
    for t in progress(reader.tensors, len(reader.tensors), "weights"):
        hf = _gguf_name(t.name)
        if hf is None:
            continue
        shape = tuple(int(x) for x in reversed(t.shape))   # ggml lists dims fastest-first
        if keep_quantized and t.tensor_type.name in QUANT_TYPES and len(shape) == 2:
            heads = None
            if hf.endswith(("q_proj.weight", "k_proj.weight")):
                heads = spec.num_heads if hf.endswith("q_proj.weight") else spec.num_kv_heads
            weights[hf] = LazyWeight(shape, partial(_gguf_group_quant, t, shape, heads))
            continue
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise ValueError(f"{path}: tensor {t.name} has unsupported type {t.tensor_type.name}") from e
        arr = np.asarray(arr, dtype=np.float32).reshape(shape)
        if hf.endswith("q_proj.weight"):
            arr = unpermute_rows(arr, spec.num_heads)
        elif hf.endswith("k_proj.weight"):
            arr = unpermute_rows(arr, spec.num_kv_heads)
        weights[hf] = torch.from_numpy(arr.copy())  # own memory (F32 data is a view of the mmap)
    return weights


def _gguf_group_quant(t: Any, shape: tuple[int, int], heads: int | None):
    """The GroupQuant of GGUF tensor t (HF shape `shape`), its rows un-permuted for `heads` heads when not None."""
    gq = from_gguf_blocks(t.tensor_type.name, t.data, shape)
    if heads is not None:
        gq = gq.take_rows(torch.from_numpy(unpermute_rows(np.arange(shape[0]), heads)))
    return gq


def _read_hf_weights(path: Path, spec: ModelSpec, progress) -> dict[str, torch.Tensor]:
    """Read the safetensors weights of an HF directory (single file or sharded via model.safetensors.index.json).

    Tensor names go through hybrid_weights.hf_weight_name (`model.language_model.` -> `model.`); the vision tower
    and MTP tensors are never read, and their groups are listed in one `skipped_tensors` log line. A hybrid's fused
    GDN projections are split here (hybrid_weights.split_fused_gdn)."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        files = sorted(f.name for f in path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{path}: no safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    skipped: dict[str, int] = {}
    for f in files:
        with safe_open(str(path / f), framework="pt") as st:
            names = list(st.keys())
            for name in progress(names, len(names), f"weights {f}" if len(files) > 1 else "weights"):
                mapped = hf_weight_name(name)
                if mapped is None:
                    group = skipped_group(name)
                    skipped[group] = skipped.get(group, 0) + 1
                    continue
                weights[mapped] = st.get_tensor(name)
    if skipped:
        log.info("skipped_tensors", model=path.name,
                 groups=",".join(f"{g}:{n}" for g, n in sorted(skipped.items())))
    if spec.is_hybrid:
        split_fused_gdn(weights, spec)
    return weights
