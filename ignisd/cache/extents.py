"""ExtentAllocator: byte ranges of the KV-RAM arena (DESIGN §4.5). †: imports no torch.

The arena is one block of host memory fixed at load; a state moved into it takes one extent (its pages' bytes, and
for an evicted live sequence its state image too). Extents are aligned to `align` bytes; allocation is first fit over
a free list kept sorted by offset, and a freed extent coalesces with its free neighbours, so the free list is always
the complement of the held extents.
"""
from __future__ import annotations

from bisect import insort
from collections.abc import Iterable

from ignisd.cache.page_pool import IntegrityError


class ExtentAllocator:
    """Extents of a `total_bytes` arena.

    total_bytes: arena size (bytes, >= 0). align: every extent starts at and is rounded up to a multiple of it
    (bytes, >= 1). Raises ValueError for negative sizes.
    """

    def __init__(self, total_bytes: int, align: int = 4096):
        if total_bytes < 0 or align < 1:
            raise ValueError(f"arena of {total_bytes} bytes aligned to {align}: both must be >= 0 / >= 1")
        self.align = align
        self.total_bytes = total_bytes - total_bytes % align
        self._free: list[tuple[int, int]] = [(0, self.total_bytes)] if self.total_bytes else []
        self._held: dict[int, int] = {}

    def rounded(self, nbytes: int) -> int:
        """`nbytes` rounded up to the alignment (what an extent of that size takes)."""
        return -(-max(nbytes, 1) // self.align) * self.align

    @property
    def used_bytes(self) -> int:
        """Bytes held by extents (aligned sizes)."""
        return sum(self._held.values())

    @property
    def free_bytes(self) -> int:
        """Bytes not held (possibly in several pieces)."""
        return self.total_bytes - self.used_bytes

    def largest_free(self) -> int:
        """The largest extent that can be allocated now (bytes)."""
        return max((n for _, n in self._free), default=0)

    def fits(self, nbytes: int) -> bool:
        """Whether an extent of `nbytes` can be allocated now."""
        return self.rounded(nbytes) <= self.largest_free()

    def alloc(self, nbytes: int) -> int | None:
        """Take an extent of at least `nbytes` (first fit); returns its offset, or None when no free piece is large
        enough (nothing is taken then)."""
        need = self.rounded(nbytes)
        for i, (off, n) in enumerate(self._free):
            if n >= need:
                if n == need:
                    del self._free[i]
                else:
                    self._free[i] = (off + need, n - need)
                self._held[off] = need
                return off
        return None

    def free(self, offset: int) -> None:
        """Return the extent at `offset`. Raises IntegrityError when no extent starts there."""
        n = self._held.pop(offset, None)
        if n is None:
            raise IntegrityError(f"free of arena offset {offset}, which holds no extent")
        insort(self._free, (offset, n))
        merged: list[tuple[int, int]] = []
        for off, size in self._free:
            if merged and merged[-1][0] + merged[-1][1] == off:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((off, size))
        self._free = merged

    def size_of(self, offset: int) -> int:
        """The aligned size of the extent at `offset` (KeyError when none starts there)."""
        return self._held[offset]

    def check_integrity(self, held: Iterable[int]) -> None:
        """Prove that the extents the holders list (`held`: offsets, one per holder) are exactly the allocated ones,
        that none overlap, and that free + held pieces tile [0, total_bytes). Raises IntegrityError."""
        held = list(held)
        if len(set(held)) != len(held):
            raise IntegrityError("an arena extent has two holders")
        if set(held) != set(self._held):
            raise IntegrityError(f"arena extents held {sorted(self._held)} but holders list {sorted(held)}")
        pieces = sorted(list(self._held.items()) + self._free)
        pos = 0
        for off, n in pieces:
            if off != pos or n <= 0:
                raise IntegrityError(f"arena pieces do not tile: {pieces[:8]}")
            pos += n
        if pos != self.total_bytes:
            raise IntegrityError(f"arena pieces cover {pos} of {self.total_bytes} bytes")
