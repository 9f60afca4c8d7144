"""Accounting of per-sequence state slots (DESIGN §4.2). †: imports no torch.

A hybrid model's GDN layers keep a fixed-size recurrent state and conv history per sequence. Each live sequence owns
one live slot (allocated at admission, freed at the end); the tensors behind slot ids live in
`device_states.py`. On an all-attention model no slot holds any bytes, and sequences get none.
"""
from __future__ import annotations

from collections.abc import Iterable

from ignisd.cache.page_pool import IntegrityError


class StateSlots:
    """Free list of `total` slot ids; each slot is free or held by exactly one holder."""

    def __init__(self, total: int):
        if total < 0:
            raise ValueError(f"state slots must be >= 0, got {total}")
        self.total = total
        self._free: list[int] = list(range(total - 1, -1, -1))
        self._owner: dict[int, str] = {}

    @property
    def free(self) -> int:
        """Number of free slots."""
        return len(self._free)

    def alloc(self, holder: str) -> int | None:
        """Give `holder` a free slot id, or None when none is free."""
        if not self._free:
            return None
        s = self._free.pop()
        self._owner[s] = holder
        return s

    def release(self, slot: int) -> None:
        """Return `slot` to the free list. Raises IntegrityError if it is not held."""
        if slot not in self._owner:
            raise IntegrityError(f"release of free state slot {slot}")
        del self._owner[slot]
        self._free.append(slot)

    def check_integrity(self, held: Iterable[int]) -> None:
        """Prove free + held = total and that `held` (the slots the holders say they own) matches the owner table."""
        held = list(held)
        if len(set(held)) != len(held):
            raise IntegrityError("a state slot has two holders")
        if set(held) != set(self._owner):
            raise IntegrityError(f"state slots held {sorted(set(self._owner))} but holders list {sorted(set(held))}")
        if len(self._free) + len(self._owner) != self.total or set(self._free) & set(self._owner):
            raise IntegrityError(f"state slots: free {len(self._free)} + held {len(self._owner)} != {self.total}")
