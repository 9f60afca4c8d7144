"""Sparse mixture-of-experts block of Qwen3-Next (`mlp`, MODELS.md §2.5; Qwen3NextSparseMoeBlock):

    p = softmax(x @ gateᵀ) in fp32;  w, idx = topk(p, k);  w /= Σw (norm_topk_prob);  w cast to x's dtype
    y = Σ_k w_k · down_e(silu(gate_e x) ⊙ up_e x)           (e = idx_k; SwiGLU experts)
    y += sigmoid(x @ shared_expert_gateᵀ) · shared_expert(x)  (a dense SwiGLU; the gate is one scalar per token)

Experts run grouped: the tokens routed to an expert are gathered, pushed through its two matmuls and added back
(index_add_) in ascending expert order, as transformers does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ignisd.model.layers import MLP, linear_t


class SparseMoE:
    """One MoE block.

    router: [E, H] (mlp.gate.weight). gate_up: [E, 2I, H] (each expert's gate rows, then its up rows);
    down: [E, H, I]. shared: the shared expert (layers.MLP). shared_gate: [1, H]. top_k: experts per token;
    norm_topk_prob: renormalise the top-k probabilities to sum to 1.
    """

    def __init__(self, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, shared: MLP,
                 shared_gate: torch.Tensor, top_k: int, norm_topk_prob: bool) -> None:
        self.num_experts = router.shape[0]
        self.inter = down.shape[-1]
        self.w_route_t = torch.cat((router, shared_gate), dim=0).t().contiguous()   # [H, E + 1]
        self.gate_up_t = gate_up.transpose(1, 2).contiguous()                      # [E, H, 2I]
        self.down_t = down.transpose(1, 2).contiguous()                            # [E, I, H]
        self.shared = shared
        self.top_k, self.norm_topk_prob = top_k, norm_topk_prob

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The resident weight tensors (for weight_bytes)."""
        return [self.w_route_t, self.gate_up_t, self.down_t, *self.shared.tensors]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [T, H] -> (weights [T, k] in x's dtype, expert ids LongTensor [T, k], shared-gate logits [T, 1])."""
        logits = linear_t(x, self.w_route_t)
        probs = torch.softmax(logits[:, :self.num_experts], dim=-1, dtype=torch.float32)
        w, idx = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            w = w / w.sum(dim=-1, keepdim=True)
        return w.to(x.dtype), idx, logits[:, self.num_experts:]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        w, idx, shared_logit = self.route(x)
        out = torch.zeros_like(x)
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // self.top_k                     # token of each (token, k) pair, grouped by expert
        weights = w.reshape(-1).index_select(0, order)
        pos = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            rows = tokens[pos:pos + n]
            h = torch.mm(x.index_select(0, rows), self.gate_up_t[e])
            h = F.silu(h[:, :self.inter]) * h[:, self.inter:]
            y = torch.mm(h, self.down_t[e]) * weights[pos:pos + n, None]
            out.index_add_(0, rows, y)
            pos += n
        return out + torch.sigmoid(shared_logit) * self.shared(x)
