"""Checkpoint tensor names and layouts of the Qwen hybrids, turned into the one layout the model runs
(MODELS.md §4):

- `hf_weight_name`: Qwen3.5's multimodal checkpoints keep the text model under `model.language_model.`; that prefix
  becomes `model.` (transformers' Qwen3_5ForCausalLM PrefixChange). The vision tower (`model.visual.*`) and the
  multi-token-prediction head (`mtp.*`) are not used by a text-only daemon and are skipped.
- `split_fused_gdn`: Qwen3-Next's fused, per-key-head grouped `in_proj_qkvz` / `in_proj_ba` become Qwen3.5's split
  `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` (a pure row permutation), once at load, so one GDN path
  serves both families.
- `expert_tensors`: per-expert `mlp.experts.{e}.{gate,up,down}_proj.weight` (what save_pretrained writes) or the
  in-memory fused `mlp.experts.gate_up_proj` [E, 2I, H] / `down_proj` [E, H, I] -> stacked tensors.
"""
from __future__ import annotations

import torch

SKIPPED_PREFIXES = ("model.visual.", "mtp.")
_LM_PREFIX = "model.language_model."


def hf_weight_name(name: str) -> str | None:
    """Checkpoint tensor name -> the name the model takes, or None for a tensor a text model skips
    (model.visual.*, mtp.*)."""
    if name.startswith(SKIPPED_PREFIXES):
        return None
    if name.startswith(_LM_PREFIX):
        return "model." + name[len(_LM_PREFIX):]
    return name


def skipped_group(name: str) -> str:
    """The group a skipped tensor is listed under in the load log: "model.visual" or "mtp"."""
    return next(p.rstrip(".") for p in SKIPPED_PREFIXES if name.startswith(p))


def split_fused_gdn(weights: dict[str, torch.Tensor], spec) -> int:
    """Replace, in place, every GDN layer's fused in_proj_qkvz [Hk·(2dk + 2r·dv), H] and in_proj_ba [Hk·2r, H]
    (rows grouped per key head: [q | k | v (r heads) | z (r heads)] and [b (r) | a (r)], r = Hv/Hk) by
    in_proj_qkv [2·Hk·dk + Hv·dv, H] ([q all heads | k all heads | v all heads]), in_proj_z [Hv·dv, H],
    in_proj_b, in_proj_a [Hv, H] (MODELS.md §2.3). Returns the number of layers converted.
    Raises ValueError on a fused tensor of the wrong shape.
    """
    hk, hv = spec.linear_num_key_heads, spec.linear_num_value_heads
    dk, dv = spec.linear_key_head_dim, spec.linear_value_head_dim
    converted = 0
    for i, kind in enumerate(spec.layer_types):
        if kind != "linear_attention":
            continue
        p = f"model.layers.{i}.linear_attn."
        if p + "in_proj_qkvz.weight" not in weights:
            continue
        r = hv // hk
        qkvz = weights.pop(p + "in_proj_qkvz.weight")
        ba = weights.pop(p + "in_proj_ba.weight")
        h = qkvz.shape[-1]
        if qkvz.shape != (hk * (2 * dk + 2 * r * dv), h) or ba.shape != (hk * 2 * r, h):
            raise ValueError(f"{p}in_proj_qkvz {tuple(qkvz.shape)} / in_proj_ba {tuple(ba.shape)} do not fit "
                             f"Hk={hk}, Hv={hv}, dk={dk}, dv={dv}")
        q, k, v, z = torch.split(qkvz.view(hk, 2 * dk + 2 * r * dv, h), [dk, dk, r * dv, r * dv], dim=1)
        weights[p + "in_proj_qkv.weight"] = torch.cat((q.reshape(-1, h), k.reshape(-1, h), v.reshape(-1, h)))
        weights[p + "in_proj_z.weight"] = z.reshape(-1, h).contiguous()
        b, a = torch.split(ba.view(hk, 2 * r, h), [r, r], dim=1)
        weights[p + "in_proj_b.weight"] = b.reshape(-1, h).contiguous()
        weights[p + "in_proj_a.weight"] = a.reshape(-1, h).contiguous()
        converted += 1
    return converted


def expert_tensors(weights: dict[str, torch.Tensor], prefix: str, num_experts: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pop the experts of the MoE block at `prefix` (e.g. "model.layers.0.mlp.") and return (gate_up [E, 2I, H]
    with each expert's gate rows first, down [E, H, I]). Accepts per-expert tensors or the fused pair.
    Raises KeyError naming the first missing tensor."""
    fused = prefix + "experts.gate_up_proj"
    if fused in weights:
        return weights.pop(fused), weights.pop(prefix + "experts.down_proj")
    gate_up, down = [], []
    for e in range(num_experts):
        p = f"{prefix}experts.{e}."
        names = [p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"]
        for n in names:
            if n not in weights:
                raise KeyError(f"missing tensor {n}")
        g, u, d = (weights.pop(n) for n in names)
        gate_up.append(torch.cat((g, u), dim=0))
        down.append(d)
    return torch.stack(gate_up), torch.stack(down)
