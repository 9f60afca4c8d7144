"""The one cache API the scheduler sees (DESIGN §3, §4.1). †: imports no torch.

Today it owns the KV pool's page accounting for live sequences; retained states, state slots and tiers hang off
this same object as they arrive, so the scheduler never reaches into a pool directly.
"""
from __future__ import annotations

from collections.abc import Iterable

from ignisd.cache.page_pool import PagePool
from ignisd.cache.state_slots import StateSlots


class CacheManager:
    """Page and state-slot reservation for live sequences over one `PagePool` and one `StateSlots`.

    pool: the KV pool's accounting (pages of `pool.page_tokens` tokens). page_bytes: bytes of one page across every
    attention layer, K and V, in the pool's KV format (for status and metrics). slots: live state slots of a hybrid
    model (None on an all-attention model: sequences then hold no slot). state_bytes: bytes of one slot.
    """

    def __init__(self, pool: PagePool, page_bytes: int, slots: StateSlots | None = None, state_bytes: int = 0):
        self.pool = pool
        self.page_bytes = page_bytes
        self.slots = slots
        self.state_bytes = state_bytes
        self._live: dict[str, list[int]] = {}
        self._slot: dict[str, int] = {}

    @property
    def page_tokens(self) -> int:
        """Tokens per page (64)."""
        return self.pool.page_tokens

    def pages_for(self, tokens: int) -> int:
        """Pages that hold `tokens` tokens."""
        return self.pool.pages_for(tokens)

    def can_reserve(self, tokens: int) -> bool:
        """Whether pages for `tokens` tokens are free right now."""
        return self.pool.pages_for(tokens) <= self.pool.free

    def reserve(self, holder: str, tokens: int) -> tuple[list[int], int | None] | None:
        """Reserve the whole bound for a live sequence: pages for `tokens` tokens (prompt + max_tokens) and, on a
        hybrid model, one live state slot.

        Returns (page ids in position order, slot id or None) or None when too few pages or no slot are free
        (nothing is taken then). Raises ValueError if `holder` already holds pages.
        """
        if holder in self._live:
            raise ValueError(f"{holder} already holds pages")
        n = self.pool.pages_for(tokens)
        if n > self.pool.free or (self.slots is not None and self.slots.free == 0):
            return None
        pages = self.pool.alloc(n)
        self._live[holder] = pages
        slot = None
        if self.slots is not None:
            slot = self.slots.alloc(holder)
            self._slot[holder] = slot
        return pages, slot

    def release(self, holder: str) -> None:
        """Return every page and the state slot `holder` holds (no-op for what it does not hold)."""
        pages = self._live.pop(holder, None)
        if pages:
            self.pool.release(pages)
        slot = self._slot.pop(holder, None)
        if slot is not None:
            self.slots.release(slot)

    def live_pages(self) -> int:
        """Pages held by live sequences."""
        return len({p for pages in self._live.values() for p in pages})

    def holders(self) -> Iterable[list[int]]:
        """Page lists of every holder (live sequences now; retained states later)."""
        return list(self._live.values())

    def live_state_bytes(self) -> int:
        """Bytes of the live state slots in use (0 on an all-attention model)."""
        return len(self._slot) * self.state_bytes

    def check_integrity(self) -> None:
        """Prove free + held = total and refcounts = holders for pages, and the same for state slots
        (raises page_pool.IntegrityError)."""
        self.pool.check_integrity(self.holders())
        if self.slots is not None:
            self.slots.check_integrity(self._slot.values())
