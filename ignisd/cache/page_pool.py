"""The KV pool's page accounting: free list and reference counts (DESIGN §4.1). †: imports no torch.

A page is either free or held by N ≥ 1 holders (live sequences, later retained states); its refcount is N.
The tensors that hold page contents live in `kv_store.py`; this module only hands out page ids.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable


class PoolExhausted(Exception):
    """Raised by `alloc` when fewer pages are free than asked for; nothing is allocated then."""


class IntegrityError(AssertionError):
    """Raised by `check_integrity` when the pool's accounting is inconsistent."""


class PagePool:
    """Free list + refcounts for `total` pages of `page_tokens` tokens each.

    Pages are ints in [0, total). Allocation is LIFO (recently freed pages are reused first).
    """

    def __init__(self, total: int, page_tokens: int = 64):
        if total < 1:
            raise ValueError(f"kv pool needs at least 1 page, got {total}")
        self.total = total
        self.page_tokens = page_tokens
        self._free: list[int] = list(range(total - 1, -1, -1))
        self._refs: list[int] = [0] * total

    @property
    def free(self) -> int:
        """Number of free pages."""
        return len(self._free)

    @property
    def used(self) -> int:
        """Number of pages held by at least one holder."""
        return self.total - len(self._free)

    def pages_for(self, tokens: int) -> int:
        """Pages needed to hold `tokens` tokens (ceil division by page_tokens)."""
        return -(-tokens // self.page_tokens)

    def alloc(self, n: int) -> list[int]:
        """Take `n` free pages, each with refcount 1. Raises PoolExhausted (allocating nothing) if fewer are free."""
        if n > len(self._free):
            raise PoolExhausted(f"asked for {n} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._refs[p] = 1
        return pages

    def incref(self, pages: Iterable[int]) -> None:
        """Add one holder to each of `pages` (all must be held already)."""
        for p in pages:
            if self._refs[p] <= 0:
                raise IntegrityError(f"incref of free page {p}")
            self._refs[p] += 1

    def release(self, pages: Iterable[int]) -> None:
        """Drop one holder from each of `pages`; a page whose refcount reaches 0 returns to the free list. They
        return last first, so a run of pages freed together is taken again in its own ascending order (single-lane
        decode reads a consecutive run of pages in place: AttentionPlan.decode_single)."""
        for p in reversed(list(pages)):
            if self._refs[p] <= 0:
                raise IntegrityError(f"release of free page {p}")
            self._refs[p] -= 1
            if self._refs[p] == 0:
                self._free.append(p)

    def refcount(self, page: int) -> int:
        """Current number of holders of `page`."""
        return self._refs[page]

    def check_integrity(self, holders: Iterable[Iterable[int]]) -> None:
        """Prove free + held = total and every refcount equals the number of holders listing that page.

        holders: one page list per holder (live sequence or retained state). Raises IntegrityError on any mismatch.
        """
        counts = Counter(p for pages in holders for p in pages)
        free = set(self._free)
        if len(free) != len(self._free):
            raise IntegrityError("a page is on the free list twice")
        held = {p for p in range(self.total) if self._refs[p] > 0}
        if free & held:
            raise IntegrityError(f"pages both free and held: {sorted(free & held)[:8]}")
        if len(free) + len(held) != self.total:
            raise IntegrityError(f"free {len(free)} + held {len(held)} != total {self.total}")
        for p in range(self.total):
            if self._refs[p] != counts.get(p, 0):
                raise IntegrityError(f"page {p}: refcount {self._refs[p]} but {counts.get(p, 0)} holders")
