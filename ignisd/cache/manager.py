"""The one cache API the scheduler sees (DESIGN §3, §4.1). †: imports no torch.

Today it owns the KV pool's page accounting for live sequences; retained states, state slots and tiers hang off
this same object as they arrive, so the scheduler never reaches into a pool directly.
"""
from __future__ import annotations

from collections.abc import Iterable

from ignisd.cache.page_pool import PagePool


class CacheManager:
    """Page reservation for live sequences over one `PagePool`.

    pool: the KV pool's accounting (pages of `pool.page_tokens` tokens). page_bytes: bytes of one page across every
    attention layer, K and V, in the pool's KV format (for status and metrics).
    """

    def __init__(self, pool: PagePool, page_bytes: int):
        self.pool = pool
        self.page_bytes = page_bytes
        self._live: dict[str, list[int]] = {}

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

    def reserve(self, holder: str, tokens: int) -> list[int] | None:
        """Reserve the whole bound for a live sequence: pages for `tokens` tokens (prompt + max_tokens).

        Returns the page ids (in position order) or None when too few pages are free (nothing is taken then).
        Raises ValueError if `holder` already holds pages.
        """
        if holder in self._live:
            raise ValueError(f"{holder} already holds pages")
        n = self.pool.pages_for(tokens)
        if n > self.pool.free:
            return None
        pages = self.pool.alloc(n)
        self._live[holder] = pages
        return pages

    def release(self, holder: str) -> None:
        """Return every page `holder` holds (no-op if it holds none)."""
        pages = self._live.pop(holder, None)
        if pages:
            self.pool.release(pages)

    def live_pages(self) -> int:
        """Pages held by live sequences."""
        return len({p for pages in self._live.values() for p in pages})

    def holders(self) -> Iterable[list[int]]:
        """Page lists of every holder (live sequences now; retained states later)."""
        return list(self._live.values())

    def check_integrity(self) -> None:
        """Prove free + held = total and refcounts = holders (raises page_pool.IntegrityError)."""
        self.pool.check_integrity(self.holders())
