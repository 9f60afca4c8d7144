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

    def __init__(self, pool: PagePool, page_bytes: int, slots: StateSlots | None = None, state_bytes: int = 0,
                 retained=None):
        self.pool = pool
        self.page_bytes = page_bytes
        self.slots = slots
        self.state_bytes = state_bytes
        self.retained = retained          # RetainedStore, or None with reuse.prompt off
        self._live: dict[str, list[int]] = {}
        self._slot: dict[str, int] = {}
        self._capture_pages: dict[str, list[int]] = {}   # ticket id -> the partial-page copy taken for a capture

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

    def reserve(self, holder: str, tokens: int, shared: list[int] | tuple[int, ...] = ()
                ) -> tuple[list[int], int | None] | None:
        """Reserve the whole bound for a live sequence: pages for `tokens` tokens (prompt + max_tokens) and, on a
        hybrid model, one live state slot. shared: full pages of a matched retained state that the sequence shares
        in place (one reference each is taken for it); only the rest is allocated. Retained states are evicted
        (lowest rank first) before a reservation is refused: retained state never refuses an admission.

        Returns (page ids in position order, slot id or None) or None when too few pages or no slot are free
        (nothing is taken then). Raises ValueError if `holder` already holds pages.
        """
        if holder in self._live:
            raise ValueError(f"{holder} already holds pages")
        shared = list(shared)
        n = self.pool.pages_for(tokens) - len(shared)
        if n < 0:
            raise ValueError(f"{len(shared)} shared pages exceed the bound of {tokens} tokens")
        if self.slots is not None and self.slots.free == 0:
            return None
        if n > self.pool.free and self.retained is not None:
            self.retained.evict_for_pages(n)
        if n > self.pool.free:
            return None
        self.pool.incref(shared)
        pages = shared + self.pool.alloc(n)
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
        """Page lists of every holder: live sequences, pending capture copies and retained states."""
        out = list(self._live.values()) + list(self._capture_pages.values())
        if self.retained is not None:
            out += self.retained.holders()
        return out

    def retained_pages(self) -> int:
        """Distinct pages held by retained states (0 with reuse off)."""
        return self.retained.pages_held() if self.retained is not None else 0

    # ---- captures (two-phase, DESIGN §4.3-§4.4) ----
    def reserve_capture(self, kind: str, tokens, *, priority, after_user: bool):
        """Phase 1 of a capture after `tokens`: a retained slot (RetainedStore.reserve_capture) and, when the
        position is not page-aligned, one page for the copy of the partial last page. Returns (ticket, copy page or
        None); ticket.refused says why nothing was taken ("no_slot" also when no page is left for the copy)."""
        t = self.retained.reserve_capture(kind, tokens, priority=priority, after_user=after_user)
        if not t.ok:
            return t, None
        copy = None
        if len(t.tokens) % self.page_tokens:
            if self.pool.free < 1:
                self.retained.evict_for_pages(1)
            if self.pool.free < 1:
                self.retained.abort(t)
                t.refused = "no_slot"
                return t, None
            copy = self.pool.alloc(1)[0]
            self._capture_pages[t.id] = [copy]
        return t, copy

    def commit_capture(self, ticket, live_pages: list[int]):
        """Phase 2: retain the state with the live sequence's full pages (one more reference each, for the store)
        plus the partial-page copy. Returns the CommitResult."""
        full = list(live_pages[:len(ticket.tokens) // self.page_tokens])
        self.pool.incref(full)
        copy = self._capture_pages.pop(ticket.id, [])
        return self.retained.commit(ticket, full + copy)

    def abort_capture(self, ticket) -> None:
        """Give back what a capture reserved (its retained slot and its copy page)."""
        copy = self._capture_pages.pop(ticket.id, None)
        if copy:
            self.pool.release(copy)
        self.retained.abort(ticket)

    def live_state_bytes(self) -> int:
        """Bytes of the live state slots in use (0 on an all-attention model)."""
        return len(self._slot) * self.state_bytes

    def check_integrity(self) -> None:
        """Prove free + held = total and refcounts = holders for pages, and the same for state slots
        (raises page_pool.IntegrityError)."""
        self.pool.check_integrity(self.holders())
        if self.slots is not None:
            self.slots.check_integrity(self._slot.values())
        if self.retained is not None:
            self.retained.check_integrity()
