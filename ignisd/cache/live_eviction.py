"""Live sequences moved down and resumed (DESIGN §4.5): the cache manager's side. †: imports no torch.

A mixin of `CacheManager`. When a higher-ranked request cannot fit, the scheduler picks the lowest-ranked running
sequence and the manager moves it down; then its pages and live slot are free for the waiting request. Later
`admit_evicted` gives it pages and a slot again, and a RestoreOp writes its bytes back before any pass, so it
continues exactly where it stopped (the sampler's generator and the stream position never leave the process: they
stay with the runner and the scheduler's sequence).

Where it goes: into the KV-RAM arena when an extent fits there once KV-RAM retained states have moved down or gone
(retained state is always discarded before any evicted live sequence), moved a window of pages a round
(`eviction_step`, between decode rounds, while the other lanes keep generating; the last window carries its live
state image). Otherwise, with KV-disk on, to a KV-disk file of kind "live" (cache/disk_format.py) once KV-disk
retained states have gone to make room: its pages and image leave the device the same way, a window a round, into a
staging buffer the runner keeps ("to_stage" moves); the round that fills it hands the bytes over, and the engine
writes the file off the round path (ignisd/disk_traffic.py). An evicted sequence already in the arena is never
pushed down by a later one (the later one goes to KV-disk instead: the same bytes move either way). Before its
restore the file is read back and verified; the sequence waits meanwhile, like a request whose match is on KV-disk
(while the file is being written, its bytes still in memory serve the restore). A write or read that fails loses its
bytes: `take_lost` then tells the scheduler to recompute it. When neither tier can hold it, `begin_eviction` says
so: the scheduler re-queues it to be recomputed with KV-disk off, and with KV-disk on (every tier full of live work)
lets the waiting request wait instead.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ignisd.cache.admission import Admission
from ignisd.cache.disk_format import DiskRecord, stamp_of
from ignisd.plan import MOVE_TO_RAM, MOVE_TO_STAGE, RestoreOp, TierMove
from ignisd.vocab import AGENT, DISK, LIVE, RAM

_OWNERS = itertools.count(1)


@dataclass
class Evicted:
    """One live sequence moved (or on its way) down. tier: "ram" | "disk". offset/nbytes: its arena extent (offset
    None on KV-disk; nbytes = its pages and image, bytes). pages: device pages being moved, in position order. moved:
    pages already planned. done: pages and slot released. with_image: its live image travels after the pages.
    KV-disk only: record (its file's DiskRecord), disk_bytes (counted against the ceiling), payload (its bytes in
    memory: produced by the round and not yet written, or read back for the restore), in_flight (the round that
    produces them has not run, or the file is not written yet), want_read (a restore waits for the file), lost (a
    write or read failed: recompute it)."""

    offset: int | None
    nbytes: int
    pages: list[int]
    moved: int = 0
    done: bool = False
    with_image: bool = False
    tier: str = RAM
    record: DiskRecord | None = None
    disk_bytes: int = 0
    payload: bytes | None = None
    in_flight: bool = False
    want_read: bool = False
    lost: bool = False


class LiveEviction:
    """Eviction of live sequences for the CacheManager (uses its pool, live slots, tiers and arena)."""

    @property
    def live_disk_on(self) -> bool:
        """KV-disk is on: no evicted live sequence is discarded (one no tier can hold stays where it is)."""
        return self.tiers.disk_capacity > 0

    def begin_eviction(self, seq_id: str, tokens: int, priority: str = AGENT) -> bool:
        """Start moving live sequence `seq_id` down: the pages of its first `tokens` tokens (those computed) and its
        image, into a KV-RAM extent (KV-RAM retained states move to KV-disk or go first) or, failing that and with
        KV-disk on, into a KV-disk file (KV-disk retained states go first). priority: the sequence's, for the file.
        Whether it can be moved (False: nothing changed for it; recompute it or let the waiting request wait).
        Raises KeyError for a sequence that holds no pages."""
        pages = self._live[seq_id][:self.pool.pages_for(tokens)]
        t = self.tiers
        with_image = seq_id in self._slot and t.image_bytes > 0
        nbytes = t.state_bytes(len(pages), with_image)
        if t.arena is not None and t.arena.rounded(nbytes) <= t.arena.total_bytes - self._live_arena_bytes() \
                and t._arena_room(self, nbytes):           # (retained states never move down for nothing)
            off = t.arena.alloc(nbytes)
            if off is not None:
                self._evicted[seq_id] = Evicted(off, nbytes, list(pages), with_image=with_image)
                return True
        return self._begin_disk_eviction(seq_id, pages, with_image, nbytes, priority)

    def _begin_disk_eviction(self, seq_id: str, pages: list[int], with_image: bool, nbytes: int,
                             priority: str) -> bool:
        t, store = self.tiers, self.retained
        need = nbytes + t.header_bytes
        if t.disk_capacity <= 0 or t.disk_foreign + self._live_disk_bytes() + need > t.disk_capacity:
            return False                              # KV-disk off, or full of live work
        while not t.disk_fits(nbytes):
            x = store.victim(tier=DISK) if store is not None else None
            if x is None:
                return False                          # pinned or being written: try again next round
            store.drop(x.id)
            t.counts["dropped"] += 1
        stamp = stamp_of(store.stamp) if store is not None else ("none", "none", "none")
        record = DiskRecord(LIVE, (), (), priority, False, *stamp, t.page_tokens, t.page_bytes, len(pages),
                            t.image_layout if with_image else (), owner=f"{seq_id}#{next(_OWNERS)}")
        self._evicted[seq_id] = Evicted(None, nbytes, list(pages), with_image=with_image, tier=DISK, record=record,
                                        disk_bytes=need, in_flight=True)
        t.disk_used += need
        return True

    def eviction_step(self, seq_id: str, window: int) -> bool:
        """Plan the next `window` pages of `seq_id` into its extent, or into its staging buffer for its KV-disk file
        (the last move adds its image, then its pages and live slot are released: the moves run before the next
        round's passes). Whether it is fully out."""
        ev = self._evicted[seq_id]
        if ev.done:
            return True
        chunk = ev.pages[ev.moved:ev.moved + max(1, window)]
        last = ev.moved + len(chunk) >= len(ev.pages)
        image = ("live", self._slot[seq_id]) if last and ev.with_image else None
        at = ev.moved * self.tiers.page_bytes
        if ev.tier == DISK:
            mv = TierMove(MOVE_TO_STAGE, seq_id, pages=tuple(chunk), image_slot=image, dst_offset=at,
                          nbytes=ev.nbytes)
        else:
            mv = TierMove(MOVE_TO_RAM, seq_id, pages=tuple(chunk), image_slot=image, dst_offset=ev.offset + at)
        self.tiers.moves.append(mv)
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
        bytes back (its extent or file is let go once that ran). Returns the Admission; one with `wait_for` set
        while its KV-disk bytes are not in memory (being produced or written, or the file is read back now: see
        ``loads_wanted``); or None when too few pages or no slot are free. Nothing is held unless admitted
        (retained states move down first). Call ``take_lost`` first: a lost sequence cannot be admitted."""
        ev = self._evicted[seq_id]
        if ev.tier == DISK and ev.payload is None:
            ev.want_read = True
            return Admission((), None, 0, None, None, wait_for=seq_id)
        n = self.pool.pages_for(bound_tokens)
        if (self.slots is not None and self.slots.free == 0) or not self._make_room(n):
            return None
        pages = self.pool.alloc(n)
        self._live[seq_id] = pages
        slot = None
        if self.slots is not None:
            slot = self.slots.alloc(seq_id)
            self._slot[seq_id] = slot
        own = tuple(pages[:len(ev.pages)])
        if ev.tier == DISK:
            op = RestoreOp(seq_id, seq_id, None, None, None, None, slot, tier=DISK, dst_pages=own,
                           payload=ev.payload, image_after_pages=ev.with_image)
        else:
            op = RestoreOp(seq_id, seq_id, None, None, None, None, slot, tier=RAM, dst_pages=own,
                           src_offset=ev.offset, image_after_pages=ev.with_image)
        self._restores[seq_id] = op
        return Admission(tuple(pages), slot, 0, None, op)

    def take_lost(self, seq_id: str) -> bool:
        """Whether evicted `seq_id` lost its bytes (its KV-disk write or read failed); if so it is forgotten here
        and the caller recomputes it."""
        ev = self._evicted.get(seq_id)
        if ev is None or not ev.lost:
            return False
        self._own_restore_done(seq_id)
        return True

    def _own_restore_done(self, seq_id: str) -> None:
        """The restore of an evicted sequence ran (or the sequence ended, or lost its bytes): free its extent, or
        its share of KV-disk and its file (a write still in flight is removed when it lands: ``disk_written`` then
        answers False)."""
        ev = self._evicted.pop(seq_id, None)
        if ev is None:
            return
        if ev.tier == RAM:
            self.tiers.arena.free(ev.offset)
        else:
            self.tiers.disk_used -= ev.disk_bytes
            self.tiers.deletes.append(ev.record.key)

    def is_evicted(self, seq_id: str) -> bool:
        """`seq_id` is fully out (its pages and slot released) and waits for `admit_evicted`."""
        ev = self._evicted.get(seq_id)
        return ev is not None and ev.done and seq_id not in self._live

    def _arena_holders(self) -> list[int]:
        """Arena offsets held by evicting or evicted live sequences."""
        return [ev.offset for ev in self._evicted.values() if ev.tier == RAM]

    def _live_arena_bytes(self) -> int:
        """Arena bytes held by evicting or evicted live sequences (what no retained state's move can free)."""
        return sum(self.tiers.arena.size_of(ev.offset) for ev in self._evicted.values() if ev.tier == RAM)

    def _live_disk_bytes(self) -> int:
        """KV-disk bytes counted for evicted live sequences."""
        return sum(ev.disk_bytes for ev in self._evicted.values() if ev.tier == DISK)

    # ------------------------------------------------------------ the KV-disk traffic of live files (disk_states)
    def _live_on_disk(self, seq_id: str) -> Evicted | None:
        ev = self._evicted.get(seq_id)
        return ev if ev is not None and ev.tier == DISK and ev.done and not ev.lost else None

    def _live_loads(self) -> list[str]:
        """Evicted sequences whose files a restore waits for (written, not in memory)."""
        return sorted(sid for sid, ev in self._evicted.items() if ev.tier == DISK and ev.want_read and ev.done
                      and not ev.lost and ev.payload is None and not ev.in_flight)

    def _live_written(self, seq_id: str, nbytes: int) -> bool:
        ev = self._live_on_disk(seq_id)
        if ev is None:
            return False
        self.tiers.disk_used += nbytes - ev.disk_bytes
        ev.disk_bytes, ev.payload, ev.in_flight = nbytes, None, False
        return True

    def _live_failed(self, seq_id: str) -> None:
        """Its write or read failed: its bytes are gone (recompute it, see ``take_lost``)."""
        ev = self._live_on_disk(seq_id)
        if ev is None:
            return
        self.tiers.disk_used -= ev.disk_bytes
        ev.disk_bytes, ev.payload, ev.in_flight, ev.lost = 0, None, False, True
