"""Live sequences moved down and resumed (DESIGN §4.5): the cache manager's side. †: imports no torch.

A mixin of `CacheManager`. When a higher-ranked request cannot fit, the scheduler picks the lowest-ranked running
sequence and the manager moves it into the KV-RAM arena a window of pages a round (`eviction_step`, between decode
rounds, while the other lanes keep generating); the last window carries its live state image. Then its pages and
live slot are free for the waiting request. Later `admit_evicted` gives it pages and a slot again, and a RestoreOp
writes its bytes back before any pass, so it continues exactly where it stopped (the sampler's generator and the
stream position never leave the process: they stay with the runner and the scheduler's sequence). In KV-RAM,
retained state is discarded before any evicted live sequence. When the arena cannot hold it, `begin_eviction`
says so and the scheduler re-queues the sequence to be recomputed instead (prefill of prompt + generated).
"""
from __future__ import annotations

from dataclasses import dataclass

from ignisd.plan import MOVE_TO_RAM, RestoreOp, TierMove
from ignisd.vocab import RAM


@dataclass
class Evicted:
    """One live sequence in (or on its way into) the arena: offset/nbytes of its extent, pages (device pages being
    moved, in position order), moved (pages already planned), done (pages and slot released), with_image."""

    offset: int
    nbytes: int
    pages: list[int]
    moved: int = 0
    done: bool = False
    with_image: bool = False


class LiveEviction:
    """Eviction of live sequences for the CacheManager (uses its pool, live slots, tiers and arena)."""

    def begin_eviction(self, seq_id: str, tokens: int) -> bool:
        """Reserve an arena extent for the pages of the first `tokens` tokens (those computed) of live sequence
        `seq_id` and its image, making room by moving KV-RAM retained states to KV-disk or dropping them. Whether
        it can be evicted (False: recompute it instead). Raises KeyError for a sequence that holds no pages."""
        pages = self._live[seq_id][:self.pool.pages_for(tokens)]
        t = self.tiers
        if t.arena is None:
            return False
        with_image = seq_id in self._slot and t.image_bytes > 0
        nbytes = t.state_bytes(len(pages), with_image)
        if t.arena.rounded(nbytes) > t.arena.total_bytes or not t._arena_room(self, nbytes):
            return False
        off = t.arena.alloc(nbytes)
        if off is None:
            return False
        self._evicted[seq_id] = Evicted(off, nbytes, list(pages), with_image=with_image)
        return True

    def eviction_step(self, seq_id: str, window: int) -> bool:
        """Plan the next `window` pages of `seq_id` into its extent (the last window adds its image, then its pages
        and live slot are released: the moves run before the next round's passes). Whether it is fully out."""
        ev = self._evicted[seq_id]
        if ev.done:
            return True
        chunk = ev.pages[ev.moved:ev.moved + max(1, window)]
        last = ev.moved + len(chunk) >= len(ev.pages)
        image = ("live", self._slot[seq_id]) if last and ev.with_image else None
        self.tiers.moves.append(TierMove(MOVE_TO_RAM, seq_id, pages=tuple(chunk), image_slot=image,
                                         dst_offset=ev.offset + ev.moved * self.tiers.page_bytes))
        ev.moved += len(chunk)
        if last:
            self.pool.release(self._live.pop(seq_id))
            slot = self._slot.pop(seq_id, None)
            if slot is not None:
                self.slots.release(slot)
            ev.done = True
        return last

    def admit_evicted(self, seq_id: str, bound_tokens: int):
        """Give evicted `seq_id` pages for its bound and a live slot again, with the RestoreOp that writes its
        bytes back (its extent is freed once that ran). Returns the Admission, or None when too few pages or no
        slot are free (nothing is held then; retained states move down first)."""
        from ignisd.cache.manager import Admission
        ev = self._evicted[seq_id]
        n = self.pool.pages_for(bound_tokens)
        if (self.slots is not None and self.slots.free == 0) or not self._make_room(n):
            return None
        pages = self.pool.alloc(n)
        self._live[seq_id] = pages
        slot = None
        if self.slots is not None:
            slot = self.slots.alloc(seq_id)
            self._slot[seq_id] = slot
        op = RestoreOp(seq_id, seq_id, None, None, None, None, slot, tier=RAM, dst_pages=tuple(pages[:len(ev.pages)]),
                       src_offset=ev.offset, image_after_pages=ev.with_image)
        self._restores[seq_id] = op
        return Admission(tuple(pages), slot, 0, None, op)

    def _own_restore_done(self, seq_id: str) -> None:
        """The restore of an evicted sequence ran (or the sequence ended): free its extent."""
        ev = self._evicted.pop(seq_id, None)
        if ev is not None:
            self.tiers.arena.free(ev.offset)

    def is_evicted(self, seq_id: str) -> bool:
        """`seq_id` is fully out (its pages and slot released) and waits for `admit_evicted`."""
        ev = self._evicted.get(seq_id)
        return ev is not None and ev.done and seq_id not in self._live

    def _arena_holders(self) -> list[int]:
        """Arena offsets held by evicting or evicted live sequences."""
        return [ev.offset for ev in self._evicted.values()]
