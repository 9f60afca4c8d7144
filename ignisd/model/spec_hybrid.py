"""ModelSpec of the Qwen hybrids (Qwen3.5, Qwen3-Next) from an HF config.json. †: imports no torch.

Config keys as MODELS.md §3 lists them (transformers 5.24's Qwen3_5TextConfig / Qwen3NextConfig):
- Qwen3.5's multimodal config (`Qwen3_5ForConditionalGeneration`, model_type `qwen3_5`) nests the text model under
  `text_config`; its top level adds eos ids (248046 there, 248044 in the text config). The text-only config
  (`qwen3_5_text`) is flat, as is Qwen3-Next's.
- layer_types come from the config or, absent, from `full_attention_interval` (default 4):
  layer i is "linear_attention" if (i+1) % interval else "full_attention".
- rope: `rope_parameters` (transformers 5: rope_theta, partial_rotary_factor, mrope_*) or the legacy top-level
  `rope_theta` / `partial_rotary_factor`; partial_rotary_factor defaults to 0.25 (transformers' default for both
  families). M-RoPE is ignored: for text-only input it equals plain partial RoPE (MODELS.md §2.4).
- MoE (qwen3_next): layer i uses the sparse block iff i not in mlp_only_layers and num_experts > 0 and
  (i+1) % decoder_sparse_step == 0 (Qwen3NextDecoderLayer).
"""
from __future__ import annotations

from typing import Any


def _ids(v: Any) -> list[int]:
    if isinstance(v, bool) or v is None:
        return []
    if isinstance(v, int):
        return [v]
    if isinstance(v, list):
        return [int(x) for x in v if isinstance(x, int) and not isinstance(x, bool)]
    return []


def hybrid_layer_types(cfg: dict, n_layers: int) -> tuple[str, ...]:
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


def hybrid_spec_from_hf_config(cls, config: dict, name: str):
    """Build a `cls` (ModelSpec) for a Qwen3.5 / Qwen3-Next config dict (see the module docstring).

    Raises ValueError for an unsupported rope type or inconsistent sizes (ModelSpec's own checks).
    """
    from ignisd.model.spec import _normalise_rope_scaling

    archs = list(config.get("architectures") or [])
    top_type = config.get("model_type")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    cfg = text if text is not None else config
    kind = cfg.get("model_type") or top_type
    if "Qwen3NextForCausalLM" in archs or kind == "qwen3_next":
        arch = "qwen3_next"
    else:
        arch = "qwen3_5"
    n_layers = int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    rope = dict(cfg.get("rope_parameters") or {})
    legacy = dict(cfg.get("rope_scaling") or {})
    theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    prf = float(rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))
    params = {**legacy, **{k: v for k, v in rope.items()
                           if k not in ("rope_theta", "partial_rotary_factor", "mrope_section", "mrope_interleaved")}}
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.pop("type", None)
    scaling = _normalise_rope_scaling(params)

    eos: list[int] = []
    for src in (config, cfg):     # top level first (Qwen3.5: <|im_end|> 248046), then the text config's
        for e in _ids(src.get("eos_token_id")):
            if e not in eos:
                eos.append(e)
    bos = cfg.get("bos_token_id", config.get("bos_token_id"))
    tie = cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False))

    num_experts = int(cfg.get("num_experts") or 0) if arch == "qwen3_next" else 0
    moe_layers: tuple[int, ...] = ()
    if num_experts > 0:
        step = int(cfg.get("decoder_sparse_step") or 1)
        dense_only = set(cfg.get("mlp_only_layers") or [])
        moe_layers = tuple(i for i in range(n_layers) if i not in dense_only and (i + 1) % step == 0)
    return cls(
        name=name, arch=arch, vocab_size=int(cfg["vocab_size"]), hidden_size=hidden,
        intermediate_size=int(cfg.get("intermediate_size") or 0), num_layers=n_layers, num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads), head_dim=head_dim,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
        context_tokens=int(cfg.get("max_position_embeddings", 32768)),
        tie_word_embeddings=bool(tie), bos_token_id=bos, eos_token_ids=tuple(eos),
        layer_types=hybrid_layer_types(cfg, n_layers),
        attention_bias=bool(cfg.get("attention_bias", False)), mlp_bias=False,
        partial_rotary_factor=prf,
        linear_num_key_heads=int(cfg.get("linear_num_key_heads", 16)),
        linear_num_value_heads=int(cfg.get("linear_num_value_heads", 32)),
        linear_key_head_dim=int(cfg.get("linear_key_head_dim", 128)),
        linear_value_head_dim=int(cfg.get("linear_value_head_dim", 128)),
        linear_conv_kernel_dim=int(cfg.get("linear_conv_kernel_dim", 4)),
        num_experts=num_experts,
        num_experts_per_tok=int(cfg.get("num_experts_per_tok") or 0) if num_experts else 0,
        moe_intermediate_size=int(cfg.get("moe_intermediate_size") or 0) if num_experts else 0,
        shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0) if num_experts else 0,
        norm_topk_prob=bool(cfg.get("norm_topk_prob", False)) if num_experts else False,
        moe_layers=moe_layers,
    )
