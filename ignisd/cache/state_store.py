"""StateStore: per-sequence state slots on one device, as a list of named buffers (DESIGN §4.2).

The buffers are listed by whoever needs them, as BufferSpecs: the model (ModelSpec.state_buffers(): a hybrid's GDN
recurrent and conv state) and the KV format (KVFormat.seq_state_buffers(): hq-e8-2b's exact window). The daemon
builds the live slots as StateStore(spec.state_buffers() + fmt.seq_state_buffers(geom), lanes), and the retained
image slots the same way. Each buffer is one tensor [num_slots, *shape]; a slot is one row of every buffer. The slot
ids are handed out by cache/state_slots.py; this class only stores bytes.

An **image** is a byte-exact copy of one slot, [(name, Tensor), ...] in buffer order, so that every tier moves every
kind of state through one code path; `restore` writes one back into any slot. With no buffers (an all-attention
model in a dense format) a slot holds nothing and its image is [].
A sequence's first chunk must start from zeros: the runner calls `zero(slot)` before a chunk at position 0 (the
model's forward never zeroes).
"""
from __future__ import annotations

import torch

from ignisd.buffers import BufferSpec, total_bytes


class StateStore:
    """State storage for `num_slots` slots.

    buffers: the BufferSpecs of one slot (names unique; shapes per slot). num_slots: slots (>= 0). device: torch
    device. Every buffer is zero-initialised. Raises ValueError for a negative count or a repeated buffer name.
    Attributes: buffers (the specs), num_slots, device.
    """

    def __init__(self, buffers: list[BufferSpec], num_slots: int, device: str | torch.device = "cpu") -> None:
        if num_slots < 0:
            raise ValueError(f"StateStore needs num_slots >= 0, got {num_slots}")
        names = [b.name for b in buffers]
        if len(set(names)) != len(names):
            raise ValueError(f"state buffers {names}: a name appears twice")
        self.buffers = list(buffers)
        self.num_slots = num_slots
        self.device = torch.device(device)
        self._tensors: dict[str, torch.Tensor] = {
            b.name: torch.zeros((num_slots, *b.shape), dtype=getattr(torch, b.dtype), device=self.device)
            for b in self.buffers}

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot (Σ buffer bytes; defined even with num_slots 0)."""
        return total_bytes(self.buffers)

    @property
    def nbytes(self) -> int:
        """Bytes held by all slots (num_slots × slot_bytes)."""
        return sum(t.nbytes for t in self._tensors.values())

    def buffer(self, name: str) -> torch.Tensor:
        """Buffer `name` of every slot: [num_slots, *shape] in its dtype (the storage itself, not a copy; what the
        kernels' `slots` argument indexes). Raises KeyError naming the buffers for an unknown name."""
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"state buffer {name!r} not in {list(self._tensors)}") from None

    def _check(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:
            raise IndexError(f"state slot {slot} out of range [0, {self.num_slots})")

    def zero(self, slot: int) -> None:
        """Reset `slot` to the state before any token (zeros in every buffer). Raises IndexError for a bad slot."""
        self._check(slot)
        for t in self._tensors.values():
            t[slot].zero_()

    def image(self, slot: int) -> list[tuple[str, torch.Tensor]]:
        """A byte copy of `slot`: [(name, Tensor [*shape])] per buffer in order, new tensors on this device; [] with
        no buffers. Raises IndexError for a bad slot."""
        self._check(slot)
        return [(name, t[slot].clone()) for name, t in self._tensors.items()]

    def restore(self, slot: int, image: list[tuple[str, torch.Tensor]]) -> None:
        """Write an image (from `image`, possibly of another slot or moved through other tiers) into `slot`, bit for
        bit. Raises IndexError for a bad slot, ValueError when the image's buffer names, shapes or dtypes do not match
        this store's (nothing is written then)."""
        self._check(slot)
        got = dict(image)
        if len(got) != len(image) or set(got) != set(self._tensors):
            raise ValueError(f"state image buffers {[n for n, _ in image]} != {list(self._tensors)}")
        for name, t in self._tensors.items():
            src, dst = got[name], t[slot]
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise ValueError(f"state image buffer {name}: {src.dtype} {tuple(src.shape)} != "
                                 f"{dst.dtype} {tuple(dst.shape)}")
        for name, t in self._tensors.items():
            t[slot].copy_(got[name])

    def copy_slot(self, src: int, dst: int) -> None:
        """Copy slot `src` into slot `dst` (restore(dst, image(src)) without the intermediate copy). Raises
        IndexError for a bad slot."""
        self._check(src)
        self._check(dst)
        for t in self._tensors.values():
            t[dst].copy_(t[src])
