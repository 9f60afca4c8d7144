"""ModelSpec: the architecture numbers of one model, from an HF config.json or GGUF metadata. †: imports no torch.

The spec is what the control plane (scheduler, cache manager, tiers) knows about the model: sizes, layer types, the
per-sequence state buffers and a structural hash used in retained-state stamps (DESIGN §4.4). A ModelSpec has the
attributes of a KV geometry (n_attention_layers, num_kv_heads, head_dim) and is passed as one to cache.kv_format.

HF configs (transformers 5.24's LlamaConfig, Qwen3_5TextConfig / Qwen3NextConfig; MODELS.md §3): Qwen3.5's
multimodal config (`Qwen3_5ForConditionalGeneration`) nests the text model under `text_config`, its top level adding
eos ids (248046 there, 248044 in the text config); the others are flat. Hybrid layer_types come from the config or
from `full_attention_interval` (default 4: layer i is "linear_attention" iff (i+1) % interval). rope: transformers
5's `rope_parameters` or the legacy top-level `rope_theta` / `rope_scaling` / `partial_rotary_factor` (hybrid
default 0.25); M-RoPE is ignored (for text-only input it equals plain partial RoPE, MODELS.md §2.4). MoE
(qwen3_next): layer i is sparse iff num_experts > 0, i not in mlp_only_layers and (i+1) % decoder_sparse_step == 0.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from ignisd.buffers import BufferSpec

# Architectures this build can run: llama (all full attention) and the Qwen hybrids (Gated DeltaNet + gated full
# attention, MODELS.md §2): qwen3_5 (dense MLP) and qwen3_next (MoE).
SUPPORTED_ARCHS = ("llama", "qwen3_5", "qwen3_next")
HYBRID_ARCHS = ("qwen3_5", "qwen3_next")
LAYER_TYPES = ("full_attention", "linear_attention")
KV_FORMAT_ACT_BYTES = {"fp32": 4, "bf16": 2, "hq-e8-2b": 4}
"""The KV formats state_bytes accepts (the names of cache.kv_format.KV_FORMATS; a test keeps them equal) and the
activation element size that goes with each."""
# HF `architectures` / `model_type` values accepted as llama, and those of the hybrids.
_HF_LLAMA_ARCHS = {"LlamaForCausalLM"}
_HF_HYBRID_ARCHS = {"Qwen3_5ForConditionalGeneration", "Qwen3_5ForCausalLM", "Qwen3NextForCausalLM"}
_HF_HYBRID_TYPES = {"qwen3_5", "qwen3_5_text", "qwen3_next"}
# the GDN shape keys of a hybrid config and transformers' defaults; rope_parameters keys that are not scaling ones
_HF_LINEAR_DEFAULTS = {"linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                       "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4}
_ROPE_NON_SCALING = ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")


def _index_among(layer_types: tuple[str, ...], kind: str) -> tuple[int | None, ...]:
    """Per layer: its index among the layers of type `kind`, or None for the other layers."""
    out: list[int | None] = []
    n = 0
    for t in layer_types:
        out.append(n if t == kind else None)
        n += t == kind
    return tuple(out)


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one loaded model.

    name: display name (health/status). arch: "llama" | "qwen3_5" | "qwen3_next" (SUPPORTED_ARCHS).
    vocab_size, hidden_size, intermediate_size, num_layers, num_heads (query heads), num_kv_heads, head_dim: counts.
    rms_norm_eps: RMSNorm epsilon. rope_theta: rotary base. rope_scaling: None (plain RoPE) or a dict with
    "rope_type" in {"linear", "llama3"} and that type's parameters (HF's keys: factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings).
    context_tokens: max_position_embeddings (HF) / llama.context_length (GGUF).
    tie_word_embeddings: the LM head reuses the token embedding matrix.
    bos_token_id, eos_token_ids: special ids from the config / GGUF tokenizer metadata.
    layer_types: one entry per layer, "full_attention" or "linear_attention" (GDN); all "full_attention" for llama.
    attention_bias, mlp_bias: whether the projections carry biases (HF llama options; False for GGUF llama).

    Hybrid fields (MODELS.md §2-§3; zero / defaults for llama):
    partial_rotary_factor: fraction of head_dim that is rotated (0.25 for the Qwen hybrids; rotary_dim).
    linear_num_key_heads (Hk), linear_num_value_heads (Hv), linear_key_head_dim (dk), linear_value_head_dim (dv),
    linear_conv_kernel_dim (K): the GDN layers' shape.
    num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size, norm_topk_prob: the MoE
    block (qwen3_next); moe_layers: indices of the layers whose MLP is the MoE block (the others use the dense
    SwiGLU MLP of intermediate_size).
    """

    name: str
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    context_tokens: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    layer_types: tuple[str, ...]
    attention_bias: bool = False
    mlp_bias: bool = False
    partial_rotary_factor: float = 1.0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = False
    moe_layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.arch not in SUPPORTED_ARCHS:
            raise ValueError(f"architecture {self.arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHS)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if len(self.layer_types) != self.num_layers:
            raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.num_layers} layers")
        bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
        if bad:
            raise ValueError(f"unknown layer types {bad}; supported: {', '.join(LAYER_TYPES)}")
        if self.n_gdn_layers:
            if self.arch not in HYBRID_ARCHS:
                raise ValueError(f"architecture {self.arch!r} has no linear_attention layers")
            hk, hv = self.linear_num_key_heads, self.linear_num_value_heads
            if min(hk, hv, self.linear_key_head_dim, self.linear_value_head_dim, self.linear_conv_kernel_dim) < 1:
                raise ValueError("linear_attention layers need positive linear_num_key_heads, linear_num_value_heads, "
                                 "linear_key_head_dim, linear_value_head_dim and linear_conv_kernel_dim")
            if hv % hk:
                raise ValueError(f"linear_num_value_heads {hv} is not a multiple of linear_num_key_heads {hk}")
        if not 0.0 < self.partial_rotary_factor <= 1.0 or self.rotary_dim % 2 or self.rotary_dim < 2:
            raise ValueError(f"partial_rotary_factor {self.partial_rotary_factor} gives an odd or empty rotary "
                             f"dimension for head_dim {self.head_dim}")
        if any(not 0 <= i < self.num_layers for i in self.moe_layers):
            raise ValueError(f"moe_layers {self.moe_layers} out of range for {self.num_layers} layers")
        moe_ok = 0 < self.num_experts_per_tok <= self.num_experts and self.moe_intermediate_size > 0
        if self.moe_layers and not moe_ok:
            raise ValueError(f"MoE layers need 0 < num_experts_per_tok ({self.num_experts_per_tok}) <= num_experts "
                             f"({self.num_experts}) and moe_intermediate_size > 0")

    def __hash__(self) -> int:   # rope_scaling is a dict: hash through the structural hash instead
        return hash((self.name, self.bos_token_id, self.eos_token_ids, self.context_tokens, self.structural_hash()))

    # ------------------------------------------------------------------ derived numbers
    @property
    def n_attention_layers(self) -> int:
        """Number of full-attention layers (the layers that keep KV pages)."""
        return sum(1 for t in self.layer_types if t == "full_attention")

    @property
    def attention_layer_index(self) -> tuple[int | None, ...]:
        """Per layer: its index among the full-attention layers (the layer index of the KV store), or None."""
        return _index_among(self.layer_types, "full_attention")

    @property
    def is_hybrid(self) -> bool:
        """A Qwen hybrid (GDN + gated attention, zero-centred norms), whatever its layer mix."""
        return self.arch in HYBRID_ARCHS

    @property
    def n_gdn_layers(self) -> int:
        """Number of linear-attention (Gated DeltaNet) layers: the layers that keep a recurrent + conv state."""
        return sum(1 for t in self.layer_types if t == "linear_attention")

    @property
    def gdn_layer_index(self) -> tuple[int | None, ...]:
        """Per layer: its index among the GDN layers (index into the state buffers' second dim), or None."""
        return _index_among(self.layer_types, "linear_attention")

    @property
    def rotary_dim(self) -> int:
        """Rotated dimensions of each attention head: int(head_dim * partial_rotary_factor) (64 of 256 on the Qwen
        hybrids; head_dim for llama), as transformers computes it."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def conv_dim(self) -> int:
        """Channels of a GDN layer's short conv: 2·Hk·dk + Hv·dv (q, k, v; MODELS.md §2.3). 0 without GDN layers."""
        return 2 * self.linear_num_key_heads * self.linear_key_head_dim + \
            self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def recurrent_state_bytes(self) -> int:
        """Bytes of one sequence's fp32 recurrent state: Σ_GDN Hv·dk·dv·4 (DESIGN §4.2; 144 MiB on Qwen3.5-27B)."""
        per_layer = self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim * 4
        return self.n_gdn_layers * per_layer

    def conv_state_bytes(self, act_bytes: int) -> int:
        """Bytes of one sequence's conv history: Σ_GDN conv_dim·(K−1)·act_bytes (the K−1 input columns a step
        needs; transformers keeps K)."""
        return self.n_gdn_layers * self.conv_dim * max(self.linear_conv_kernel_dim - 1, 0) * act_bytes

    def state_buffers(self, act_dtype: str = "float32") -> list[BufferSpec]:
        """The buffers of one live state slot the model needs (DESIGN §4.2), for cache.state_store.StateStore:
        [BufferSpec("recurrent", (n_gdn, Hv, dk, dv), "float32"), BufferSpec("conv", (n_gdn, conv_dim, K−1),
        act_dtype)] on a hybrid (the delta-rule state is always fp32; the conv history is kept in the activation
        dtype, act_dtype a torch dtype name: fp32 on the CPU, bf16 on CUDA); [] on an all-attention model.
        Raises ValueError for an unknown act_dtype."""
        n = self.n_gdn_layers
        if not n:
            return []
        hv, dk, dv = self.linear_num_value_heads, self.linear_key_head_dim, self.linear_value_head_dim
        return [BufferSpec("recurrent", (n, hv, dk, dv), "float32"),
                BufferSpec("conv", (n, self.conv_dim, max(self.linear_conv_kernel_dim - 1, 0)), act_dtype)]

    def state_bytes(self, kv_format: str, act_bytes: int | None = None) -> int:
        """Bytes of the model's part of one live state slot (DESIGN §4.2): recurrent_state_bytes +
        conv_state_bytes(act_bytes) (= total_bytes(state_buffers()) at that activation size).

        act_bytes: bytes of an activation element the conv history is kept in; default the element size that goes
        with the KV format (fp32 KV with fp32 activations on the CPU: 4; bf16 with bf16 on CUDA: 2). A format's own
        per-sequence state (hq-e8-2b's exact window) is listed by the format (KVFormat.seq_state_buffers), not here.
        0 on an all-attention model. Raises ValueError for a format other than KV_FORMAT_ACT_BYTES' names.
        """
        if kv_format not in KV_FORMAT_ACT_BYTES:
            raise ValueError(f"kv_format {kv_format!r} is not supported; allowed: {', '.join(KV_FORMAT_ACT_BYTES)}")
        act = KV_FORMAT_ACT_BYTES[kv_format] if act_bytes is None else act_bytes
        return self.recurrent_state_bytes + self.conv_state_bytes(act)

    def structural_hash(self) -> str:
        """SHA-256 hex digest of the architecture fields (everything but name and bos/eos ids).

        Two specs with the same hash produce KV / state of the same shape and meaning for the same weights.
        """
        fields = {
            "arch": self.arch, "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size, "num_layers": self.num_layers,
            "num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads, "head_dim": self.head_dim,
            "rms_norm_eps": float(self.rms_norm_eps), "rope_theta": float(self.rope_theta),
            "rope_scaling": self.rope_scaling, "tie_word_embeddings": self.tie_word_embeddings,
            "layer_types": list(self.layer_types), "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
        }
        if self.is_hybrid:
            fields.update({
                "partial_rotary_factor": float(self.partial_rotary_factor),
                "linear": [self.linear_num_key_heads, self.linear_num_value_heads, self.linear_key_head_dim,
                           self.linear_value_head_dim, self.linear_conv_kernel_dim],
                "moe": [self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size,
                        self.shared_expert_intermediate_size, self.norm_topk_prob, list(self.moe_layers)],
            })
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_hf_config(cls, config: dict, name: str) -> "ModelSpec":
        """Build from a parsed HF config.json (dict) of LlamaForCausalLM or a Qwen hybrid (see the module docstring).
        Accepts transformers 4 (`rope_theta`, `rope_scaling`) and 5 (`rope_parameters`) spellings. Raises ValueError
        for an unsupported architecture or rope type, or inconsistent sizes (ModelSpec's own checks)."""
        arch = _hf_arch(config)
        hybrid = arch in HYBRID_ARCHS
        text = config.get("text_config")
        cfg = text if hybrid and isinstance(text, dict) else config
        n_layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        rope = dict(cfg.get("rope_parameters") or {})
        theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        params = {**(cfg.get("rope_scaling") or {}), **{k: v for k, v in rope.items() if k not in _ROPE_NON_SCALING}}
        eos: list[int] = []
        for src in (config, cfg):     # top level first (Qwen3.5: <|im_end|> 248046), then the text config's
            eos += [e for e in _ids(src.get("eos_token_id")) if e not in eos]
        common = dict(
            name=name, arch=arch, vocab_size=int(cfg["vocab_size"]), hidden_size=hidden, num_layers=n_layers,
            num_heads=heads, num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads), rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta, rope_scaling=_normalise_rope_scaling(params),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
            bos_token_id=cfg.get("bos_token_id", config.get("bos_token_id")), eos_token_ids=tuple(eos),
            attention_bias=bool(cfg.get("attention_bias", False)))
        if not hybrid:
            return cls(**common, intermediate_size=int(cfg["intermediate_size"]),
                       context_tokens=int(cfg.get("max_position_embeddings", 2048)),
                       layer_types=("full_attention",) * n_layers, mlp_bias=bool(cfg.get("mlp_bias", False)))
        num_experts = int(cfg.get("num_experts") or 0) if arch == "qwen3_next" else 0
        moe_layers: tuple[int, ...] = ()
        if num_experts > 0:
            step = int(cfg.get("decoder_sparse_step") or 1)
            dense_only = set(cfg.get("mlp_only_layers") or [])
            moe_layers = tuple(i for i in range(n_layers) if i not in dense_only and (i + 1) % step == 0)

        def moe(key: str) -> int:
            return int(cfg.get(key) or 0) if num_experts else 0

        return cls(
            **common, intermediate_size=int(cfg.get("intermediate_size") or 0),
            context_tokens=int(cfg.get("max_position_embeddings", 32768)),
            layer_types=_hybrid_layer_types(cfg, n_layers),
            partial_rotary_factor=float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25))),
            **{k: int(cfg.get(k, default)) for k, default in _HF_LINEAR_DEFAULTS.items()},
            num_experts=num_experts, num_experts_per_tok=moe("num_experts_per_tok"),
            moe_intermediate_size=moe("moe_intermediate_size"),
            shared_expert_intermediate_size=moe("shared_expert_intermediate_size"),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)) if num_experts else False, moe_layers=moe_layers)

    @classmethod
    def from_gguf_metadata(cls, reader: Any, name: str) -> "ModelSpec":
        """Build from a gguf.GGUFReader's metadata fields (`{arch}.block_count`, `.embedding_length`, ...).

        Tied embeddings = no `output.weight` tensor in the file. vocab_size falls back to the token list length.
        Raises ValueError for an architecture other than llama or an unsupported `{arch}.rope.scaling.type`.
        """
        def get(key: str, default: Any = None) -> Any:
            f = reader.fields.get(key)
            return default if f is None else f.contents()

        arch = get("general.architecture")
        if arch != "llama":
            raise ValueError(f"GGUF architecture {arch!r} is not supported; supported: llama")
        hidden = int(get("llama.embedding_length"))
        heads = int(get("llama.attention.head_count"))
        kv_heads = int(get("llama.attention.head_count_kv", heads))
        head_dim = int(get("llama.attention.key_length", hidden // heads))
        rot_dim = int(get("llama.rope.dimension_count", head_dim))
        if rot_dim != head_dim:
            raise ValueError(f"partial rotary (rope.dimension_count {rot_dim} != head_dim {head_dim}) is not supported")
        vocab = get("llama.vocab_size")
        if vocab is None:
            vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
        scaling_type = get("llama.rope.scaling.type", "none")
        if scaling_type in ("none", None):
            scaling = None
        elif scaling_type == "linear":
            scaling = {"rope_type": "linear", "factor": float(get("llama.rope.scaling.factor"))}
        else:
            raise ValueError(f"GGUF rope scaling {scaling_type!r} is not supported; supported: none, linear")
        tensor_names = {t.name for t in reader.tensors}
        n_layers = int(get("llama.block_count"))
        eos = [get("tokenizer.ggml.eos_token_id")]
        eot = get("tokenizer.ggml.eot_token_id")
        if eot is not None and eot not in eos:
            eos.append(eot)
        return cls(
            name=name, arch="llama", vocab_size=int(vocab), hidden_size=hidden,
            intermediate_size=int(get("llama.feed_forward_length")), num_layers=n_layers, num_heads=heads,
            num_kv_heads=kv_heads, head_dim=head_dim,
            rms_norm_eps=float(get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(get("llama.rope.freq_base", 10000.0)), rope_scaling=scaling,
            context_tokens=int(get("llama.context_length", 2048)),
            tie_word_embeddings="output.weight" not in tensor_names,
            bos_token_id=get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=tuple(int(e) for e in eos if e is not None),
            layer_types=("full_attention",) * n_layers,
        )


def _normalise_rope_scaling(params: dict) -> dict | None:
    """HF rope parameters (without rope_theta; the type as `rope_type` or transformers 4's `type`) -> None for plain
    RoPE, else a dict with rope_type. Raises ValueError for rope types other than default / linear / llama3."""
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type == "linear":
        return {"rope_type": "linear", "factor": float(params["factor"])}
    if rope_type == "llama3":
        return {
            "rope_type": "llama3", "factor": float(params["factor"]),
            "low_freq_factor": float(params["low_freq_factor"]), "high_freq_factor": float(params["high_freq_factor"]),
            "original_max_position_embeddings": int(params["original_max_position_embeddings"]),
        }
    raise ValueError(f"rope type {rope_type!r} is not supported; supported: default, linear, llama3")


def _hf_arch(config: dict) -> str:
    """The arch of an HF config: "llama", "qwen3_5" or "qwen3_next". Raises ValueError for anything else."""
    archs = set(config.get("architectures") or [])
    model_type = config.get("model_type")
    if archs & _HF_HYBRID_ARCHS or (not archs & _HF_LLAMA_ARCHS and model_type in _HF_HYBRID_TYPES):
        text = config.get("text_config")
        kind = (text.get("model_type") if isinstance(text, dict) else None) or model_type
        return "qwen3_next" if "Qwen3NextForCausalLM" in archs or kind == "qwen3_next" else "qwen3_5"
    if archs & _HF_LLAMA_ARCHS or (not archs and model_type == "llama"):
        return "llama"
    raise ValueError(f"HF model {sorted(archs) or model_type!r} is not supported; supported: LlamaForCausalLM, "
                     f"{', '.join(sorted(_HF_HYBRID_ARCHS))}")


def _ids(v: Any) -> list[int]:
    """Token ids of a config value: an int, a list of ints (other entries dropped), else []."""
    if isinstance(v, bool) or v is None:
        return []
    if isinstance(v, int):
        return [v]
    if isinstance(v, list):
        return [int(x) for x in v if isinstance(x, int) and not isinstance(x, bool)]
    return []


def _hybrid_layer_types(cfg: dict, n_layers: int) -> tuple[str, ...]:
    """layer_types of a hybrid text config: the config's list, else from full_attention_interval (default 4).
    Raises ValueError when the list's length differs from n_layers or the interval is < 1."""
    lt = cfg.get("layer_types")
    if lt:
        if len(lt) != n_layers:
            raise ValueError(f"layer_types has {len(lt)} entries for num_hidden_layers {n_layers}")
        return tuple(str(t) for t in lt)
    interval = int(cfg.get("full_attention_interval") or 4)
    if interval < 1:
        raise ValueError(f"full_attention_interval {interval} < 1")
    return tuple("linear_attention" if (i + 1) % interval else "full_attention" for i in range(n_layers))
