"""The cache manager's side of the KV-disk traffic (DESIGN §4.5): what the engine reads, writes and deletes.

†: imports no torch. A mixin of `CacheManager` (cache/manager.py), kept apart because it is the interface to
ignisd/disk_traffic.py: the engine asks which files to read (`loads_wanted`), reports bytes that a round produced or
a read returned (`bytes_ready`), a file written (`disk_written`) or a fault (`disk_failed`), and removes the files of
dropped states (`take_disk_deletes`). At shutdown `plan_flush` lists the states to write. The same verbs serve
the "live" files of evicted live sequences (cache/live_eviction.py), named by their sequence id: a fault there loses
the sequence's bytes (it is recomputed) instead of dropping a retained state.
"""
from __future__ import annotations

from ignisd.cache.page_pool import IntegrityError
from ignisd.cache.tiers import disk_record
from ignisd.plan import TierMove
from ignisd.vocab import DEVICE, DISK


class DiskStates:
    """KV-disk bookkeeping of the CacheManager (uses its retained store, tiers and page size)."""

    def loads_wanted(self) -> list[str]:
        """KV-disk states whose files a waiting request needs read (and that are not in memory already), then the
        evicted live sequences whose files their restore waits for."""
        out = []
        for sid in sorted(self._loads):
            s = self._state(sid)
            if s is None or s.tier != DISK or s.placement.payload is not None:
                self._loads.discard(sid)
            elif not s.placement.in_flight:
                out.append(sid)
        return out + self._live_loads()

    def _state(self, state_id: str):
        r = self.retained
        return r.get(state_id) if r is not None and state_id in r else None

    def disk_file(self, state_id: str) -> str | None:
        """The KV-disk key of `state_id` (None when it is gone or not on disk)."""
        ev = self._live_on_disk(state_id)
        if ev is not None:
            return ev.record.key
        s = self._state(state_id)
        return s.placement.disk_file if s is not None and s.tier == DISK else None

    def payload_of(self, state_id: str):
        """The in-memory bytes a restore of `state_id` would read (its placement's payload), or None."""
        ev = self._live_on_disk(state_id)
        if ev is not None:
            return ev.payload
        s = self._state(state_id)
        return s.placement.payload if s is not None else None

    def payload_free(self, state_id: str, payload) -> bool:
        """Whether no restore can read `payload` (bytes a round produced for `state_id`, or a read returned) any
        more, so that its buffer may be reused: it is not what a restore of `state_id` would read, and no lookup
        holds the state (a restore already planned pins it until its round ran)."""
        if payload is self.payload_of(state_id):
            return False
        s = self._state(state_id)
        return s is None or s.pins == 0

    def lend_extent(self, state_id: str, nbytes: int) -> int | None:
        """Lend a free KV-RAM arena extent of `nbytes` bytes to the KV-disk read of `state_id`: memory allocated and
        touched (mlock'ed) at load, so a read into it pays no page faults. Returns its byte offset in the arena, or
        None when there is no arena or no free piece that large (nothing is taken then, and nothing is moved to
        make room: a read never pushes a state down). The extent counts as held (``check_integrity``) until
        ``return_extent``; the borrower returns it once ``payload_free`` says no restore can read it."""
        arena = self.tiers.arena
        if arena is None or nbytes <= 0:
            return None
        off = arena.alloc(nbytes)
        if off is not None:
            self._extent_loans[off] = state_id
        return off

    def return_extent(self, offset: int) -> None:
        """Give back the extent at arena byte `offset` that ``lend_extent`` lent. Raises IntegrityError when no
        extent is lent there."""
        if self._extent_loans.pop(offset, None) is None:
            raise IntegrityError(f"return of arena offset {offset}, which no KV-disk read borrowed")
        self.tiers.arena.free(offset)

    def bytes_ready(self, state_id: str, payload: bytes) -> bool:
        """The round produced the bytes of `state_id` (a "to_bytes" move) or its KV-disk file was read back and
        verified: restores may use them now. Whether the state is still retained (or the live sequence evicted)."""
        ev = self._live_on_disk(state_id)
        if ev is not None:
            ev.payload = payload
            return True
        s = self._state(state_id)
        if s is None or s.tier != DISK:
            return False
        s.placement.payload = payload
        return True

    def disk_written(self, state_id: str, nbytes: int, key: str | None = None) -> bool:
        """The KV-disk file `key` (None: any) of `state_id` is written (renamed into place, `nbytes` long): its
        bytes leave memory. Whether the state is still retained, or the live sequence still evicted to that file
        (False: the caller removes the file)."""
        if self._live_on_disk(state_id) is not None:
            return key in (None, self.disk_file(state_id)) and self._live_written(state_id, nbytes)
        s = self._state(state_id)
        if s is None or s.tier != DISK:
            return False
        p = s.placement
        self.tiers.disk_used += nbytes - p.disk_bytes
        p.disk_bytes, p.payload, p.in_flight = nbytes, None, False
        return True

    def disk_failed(self, state_id: str, key: str | None = None) -> None:
        """Writing or reading the KV-disk file `key` (None: any) of `state_id` failed (no space, I/O error, removed,
        corrupt): the state is dropped (pinned: when its restore lets go), or the evicted live sequence loses its
        bytes (``take_lost``: it is recomputed); the error is counted."""
        self.tiers.counts["disk_errors"] += 1
        if self._live_on_disk(state_id) is not None:
            if key in (None, self.disk_file(state_id)):
                self._live_failed(state_id)
            return
        s = self._state(state_id)
        self._loads.discard(state_id)
        if s is not None:
            self.retained.drop(state_id)

    def plan_flush(self) -> list[TierMove]:
        """Shutdown with KV-disk on (DESIGN §4.5): "to_bytes" moves of every retained state not yet on disk, highest
        rank first, that fits under the ceiling. The states stay where they are (the process is ending); the engine
        writes their files, and the next start indexes them."""
        r, t = self.retained, self.tiers
        if r is None or t.disk_capacity <= 0:
            return []
        moves, budget = [], t.disk_capacity - t.disk_used - t.disk_foreign
        for s in sorted((x for x in r.states() if x.tier != DISK and not x.doomed),
                        key=lambda x: r.rank(x), reverse=True):
            with_image = s.slot is not None or s.placement.image_in_extent
            if with_image != (t.image_bytes > 0):
                continue
            need = t.state_bytes(len(s.pages) if s.tier == DEVICE else r.state_pages(s.n_tokens),
                                 with_image) + t.header_bytes
            if need > budget:
                continue
            budget -= need
            image = (s.slot_tier, s.slot) if s.slot is not None else None     # else none or in the extent
            if s.tier == DEVICE:
                moves.append(TierMove("to_bytes", s.id, pages=tuple(s.pages), image_slot=image))
            else:
                off, nbytes = s.placement.extents[0]
                moves.append(TierMove("to_bytes", s.id, src_offset=off, nbytes=nbytes, image_slot=image))
        return moves

    def disk_record(self, state_id: str, any_tier: bool = False):
        """The DiskRecord (file header) of KV-disk state `state_id` (of any tier with `any_tier`, for a flush), or
        None when it is gone; of an evicted live sequence, its "live" file's record."""
        ev = self._live_on_disk(state_id)
        if ev is not None:
            return ev.record
        s = self._state(state_id)
        if s is None or (s.tier != DISK and not any_tier):
            return None
        t = self.tiers
        return disk_record(s, t.page_tokens, t.page_bytes, t.image_layout, t.image_bytes > 0,
                           self.retained.state_pages(s.n_tokens))

    def take_disk_deletes(self) -> list[str]:
        """Keys of KV-disk files whose states were dropped since the last call (the engine removes them)."""
        out, self.tiers.deletes = self.tiers.deletes, []
        return out
