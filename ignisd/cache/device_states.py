"""DeviceStates: the live per-sequence state of a hybrid model's GDN layers on the compute device (DESIGN §4.2).

One row per live state slot (the ids `cache/state_slots.py` hands out):
  recurrent: fp32 [num_slots, n_gdn, Hv, dk, dv]   the delta-rule state S of every GDN layer (key-major)
  conv:      [num_slots, n_gdn, conv_dim, K−1]     the last K−1 pre-conv q|k|v input columns of every GDN layer
A sequence's first chunk must start from zeros: the runner calls `zero(slot)` when it runs a chunk at position 0
(Model.forward never zeroes). An **image** is a byte-exact copy of one slot as a list of named buffers,
[("recurrent", Tensor), ("conv", Tensor)] — the list DESIGN §4.2 defines, so every tier moves every kind of state
through one code path; `restore` writes one back into any slot. On an all-attention model there are no GDN layers,
the tensors are empty and an image is [].
"""
from __future__ import annotations

import torch

from ignisd.model.spec import ModelSpec

IMAGE_BUFFERS = ("recurrent", "conv")


class DeviceStates:
    """Recurrent + conv state storage for `num_slots` live sequences.

    spec: the model (n_gdn_layers, linear_* sizes, conv_dim). num_slots: rows (>= 0). device: torch device.
    conv_dtype: dtype of the conv history (fp32 on the CPU; the activation dtype, bf16, on CUDA). The recurrent
    state is always fp32 (transformers' and the kernels' convention).
    Attributes recurrent, conv: the tensors above, zero-initialised.
    """

    def __init__(self, spec: ModelSpec, num_slots: int, device: str | torch.device = "cpu",
                 conv_dtype: torch.dtype = torch.float32) -> None:
        if num_slots < 0:
            raise ValueError(f"DeviceStates needs num_slots >= 0, got {num_slots}")
        self.spec = spec
        self.num_slots = num_slots
        self.device = torch.device(device)
        n = spec.n_gdn_layers
        kk = max(spec.linear_conv_kernel_dim - 1, 0)
        hv, dk, dv = spec.linear_num_value_heads, spec.linear_key_head_dim, spec.linear_value_head_dim
        self.recurrent = torch.zeros(num_slots, n, hv, dk, dv, dtype=torch.float32, device=self.device)
        self.conv = torch.zeros(num_slots, n, spec.conv_dim if n else 0, kk, dtype=conv_dtype, device=self.device)

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot (recurrent + conv) = spec.state_bytes(fmt, act_bytes=conv element size)."""
        return self.recurrent[0:1].nbytes + self.conv[0:1].nbytes if self.num_slots else \
            self.spec.state_bytes("fp32", act_bytes=self.conv.element_size())

    @property
    def nbytes(self) -> int:
        """Bytes held by all slots."""
        return self.recurrent.nbytes + self.conv.nbytes

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"state slot {slot} out of range [0, {self.num_slots})")

    def zero(self, slot: int) -> None:
        """Reset `slot` to the state before any token (zeros). Raises IndexError for a bad slot."""
        self._check(slot)
        self.recurrent[slot].zero_()
        self.conv[slot].zero_()

    def layer_views(self, gdn_layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of GDN layer `gdn_layer` over all slots: recurrent [num_slots, Hv, dk, dv] and conv
        [num_slots, conv_dim, K−1] (what the kernels' `slots` argument indexes; writes go to the storage)."""
        return self.recurrent[:, gdn_layer], self.conv[:, gdn_layer]

    def image(self, slot: int) -> list[tuple[str, torch.Tensor]]:
        """A byte copy of `slot`: [("recurrent", fp32 [n_gdn, Hv, dk, dv]), ("conv", [n_gdn, conv_dim, K−1])], new
        tensors on this device; [] on a model without GDN layers. Raises IndexError for a bad slot."""
        self._check(slot)
        if self.spec.n_gdn_layers == 0:
            return []
        return [("recurrent", self.recurrent[slot].clone()), ("conv", self.conv[slot].clone())]

    def restore(self, slot: int, image: list[tuple[str, torch.Tensor]]) -> None:
        """Write an image (from `image`, possibly of another slot or moved through other tiers) into `slot`, bit
        for bit. Raises IndexError for a bad slot, ValueError when the image's buffer names, shapes or dtypes do not
        match this model's (nothing is written then)."""
        self._check(slot)
        want = {"recurrent": self.recurrent[slot], "conv": self.conv[slot]} if self.spec.n_gdn_layers else {}
        got = dict(image)
        if len(got) != len(image) or set(got) != set(want):
            raise ValueError(f"state image buffers {[n for n, _ in image]} != {list(want)}")
        for name, dst in want.items():
            src = got[name]
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise ValueError(f"state image buffer {name}: {src.dtype} {tuple(src.shape)} != "
                                 f"{dst.dtype} {tuple(dst.shape)}")
        for name, dst in want.items():
            dst.copy_(got[name])

    def copy_slot(self, src: int, dst: int) -> None:
        """Copy slot `src` into slot `dst` (same as restore(dst, image(src)) without the intermediate copy)."""
        self._check(src)
        self._check(dst)
        self.recurrent[dst].copy_(self.recurrent[src])
        self.conv[dst].copy_(self.conv[src])
