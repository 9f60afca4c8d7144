"""Tier policy: retained state moves down one tier only when the tier above needs room (DESIGN §4.5). †: no torch.

Device (the KV pool and the retained image slots) → KV-RAM (one host arena, cache/extents.py accounting) → KV-disk
(one file per state, cache/disk_store.py). Lazy: nothing is copied while it is resident; a move is decided when
room is needed and planned as a TierMove that the next round's transfer step runs before any pass, so the pages and
slots it frees can be handed to others in the same plan. On the device a retained state never delays or refuses an
admission (it is moved or dropped at once); in KV-RAM, retained state goes before evicted live sequences; the
lowest rank goes first (superseded checkpoints, then agent, then least recently used), so a conversation's newest
checkpoint is the last of it to go. The owner (the cache manager) calls `make_device_room` (page pressure: the
state's pages go to KV-RAM, its image stays in its retained slot) and `move_down` (slot pressure: a device state's
pages and image go to KV-RAM in one extent, the slot is given back; a KV-RAM state goes to KV-disk).

Restore floors: a lower tier's match must reuse at least floor more prompt tokens than the best match above it. The
default floor of a tier is the prefill a restore from it costs, in tokens: ceil(prefill_tok_s × (latency_s +
REFERENCE_TOKENS × bytes_per_token / bandwidth)), at least 1, with the measured prefill rate and the tier's measured
latency and bandwidth (a cost model: restoring a REFERENCE_TOKENS-token match from that tier against prefilling).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ignisd.cache.disk_format import DiskRecord
from ignisd.cache.extents import ExtentAllocator
from ignisd.cache.placement import Placement
from ignisd.plan import MOVE_TO_BYTES, MOVE_TO_RAM, TierMove
from ignisd.vocab import DEVICE, DISK, RAM

REFERENCE_TOKENS = 1024


@dataclass(frozen=True)
class TierCost:
    """Measured cost of one restore from a tier: latency_s (seconds, fixed), bandwidth (bytes/s)."""

    latency_s: float
    bandwidth: float


def default_floor(prefill_tok_s: float, bytes_per_token: int, cost: TierCost) -> int:
    """The restore floor of a tier in tokens (see the module docstring), at least 1."""
    seconds = cost.latency_s + REFERENCE_TOKENS * bytes_per_token / max(cost.bandwidth, 1.0)
    return max(1, math.ceil(prefill_tok_s * seconds))


def disk_record(state, page_tokens: int, page_bytes: int, image_layout: tuple, with_image: bool,
                n_pages: int | None = None) -> DiskRecord:
    """The DiskRecord of retained state `state` (its KV-disk file's header; its key names the file). n_pages: the
    pages its payload holds (None: pages_for(n_tokens); the store's state_pages under a format that keeps fewer)."""
    st = state.stamp
    return DiskRecord(state.kind, tuple(state.tokens), tuple(state.image_spans), state.priority, state.after_user,
                      st.structural_hash, st.kv_format, st.drafter, page_tokens, page_bytes,
                      -(-state.n_tokens // page_tokens) if n_pages is None else n_pages,
                      image_layout if with_image else ())


class Tiers:
    """KV-RAM and KV-disk accounting and the moves between tiers.

    arena: the KV-RAM arena's ExtentAllocator (None or 0 bytes: no KV-RAM tier). disk_capacity: KV-disk ceiling in
    bytes (0: off). page_bytes: bytes of one KV page. image_layout: (name, dtype, shape, bytes) of each buffer of a
    state image (cache/transfer.image_layout; empty on an all-attention model). floors: {"ram": tokens, "disk":
    tokens}. header_bytes: what a KV-disk file adds to its payload at most (reserved with it).
    """

    def __init__(self, arena: ExtentAllocator | None, disk_capacity: int, page_bytes: int,
                 image_layout: tuple = (), floors: dict[str, int] | None = None, header_bytes: int = 1 << 16,
                 page_tokens: int = 64):
        self.arena = arena if arena is not None and arena.total_bytes else None
        self.disk_capacity = disk_capacity
        self.page_bytes = page_bytes
        self.page_tokens = page_tokens
        self.image_layout = tuple(image_layout)
        self.image_bytes = sum(b[3] for b in self.image_layout)
        self.floors = dict(floors or {RAM: 1, DISK: 1})
        self.header_bytes = header_bytes
        self.disk_used = 0                       # bytes of files written or being written (this stamp's)
        self.disk_foreign = 0                    # bytes of the files of other stamps in the directory
        self.moves: list[TierMove] = []          # planned for the next round, in order
        self.deletes: list[str] = []             # keys of KV-disk files to remove (their states were dropped)
        self.counts = {"demotions_ram": 0, "demotions_disk": 0, "dropped": 0, "disk_errors": 0}

    # ---------------------------------------------------------------- sizes
    def state_bytes(self, n_pages: int, with_image: bool) -> int:
        """Bytes of a state's pages (and image) in the pages layout."""
        return n_pages * self.page_bytes + (self.image_bytes if with_image else 0)

    def disk_fits(self, payload: int) -> bool:
        """Whether a file of `payload` bytes fits under the KV-disk ceiling now."""
        used = self.disk_used + self.disk_foreign
        return self.disk_capacity > 0 and used + payload + self.header_bytes <= self.disk_capacity

    def take_moves(self) -> list[TierMove]:
        """The moves planned since the last call (the next round runs them first)."""
        out, self.moves = self.moves, []
        return out

    # ---------------------------------------------------------------- retained states
    def make_device_room(self, mgr, pages: int) -> list[str]:
        """Free device pages until `pages` are free: the lowest-ranked unpinned device-resident retained state moves
        to KV-RAM (or, with no arena, to KV-disk), or is dropped when neither can take it; a whole sequence (its pages
        mostly shared with its checkpoint, DESIGN §4.3) is dropped. Returns the ids moved or dropped."""
        store, done = mgr.retained, []
        while mgr.pool.free < pages and store is not None:
            v = store.victim(tier=DEVICE)
            if v is None:
                break
            done.append(v.id)
            if v.whole or not (self._to_ram(mgr, v) or self._to_disk(mgr, v)):
                store.drop(v.id)
                self.counts["dropped"] += 1
        return done

    def move_down(self, mgr, s) -> bool:
        """Move `s` (unpinned, holding a retained slot) one tier down and free its slot (the store asks when it
        needs a slot): from the device into KV-RAM, its image appended to its pages in one extent, when the arena
        can take it (lower-ranked KV-RAM states make room); otherwise, or from KV-RAM, to KV-disk, where the image
        travels with the pages. Whether it moved (False: drop it). A state that is mostly image (hq-e8-2b's exact
        window: a few encoded pages) goes down by slot pressure, not page pressure, and so still passes KV-RAM."""
        if s.tier == DEVICE and s.slot is not None and self._to_ram(mgr, s, with_image=True):
            return True
        return self._to_disk(mgr, s)

    def _arena_room(self, mgr, nbytes: int, below: tuple | None = None) -> bool:
        """Make an extent of `nbytes` allocatable: lowest-ranked unpinned KV-RAM retained states (ranking below
        `below` when given: a state never pushes out a higher-ranked one) move to KV-disk, or are dropped. Whether
        it now fits."""
        store = mgr.retained
        while not self.arena.fits(nbytes):
            w = store.victim(tier=RAM, below=below) if store is not None else None
            if w is None:
                return False
            if w.whole or not self._to_disk(mgr, w):
                store.drop(w.id)
                self.counts["dropped"] += 1
        return True

    def _to_ram(self, mgr, s, with_image: bool = False) -> bool:
        """Plan the device pages of `s` into one KV-RAM extent (with_image: its retained slot's image after them,
        and the slot given back); free its pages at once. Whether it moved (False: no arena, or no room there
        without pushing out a higher-ranked state)."""
        nbytes = self.state_bytes(len(s.pages), with_image)
        if self.arena is None or self.arena.rounded(nbytes) > self.arena.total_bytes:
            return False
        if not self._arena_room(mgr, nbytes, below=mgr.retained.rank(s)):
            return False
        off = self.arena.alloc(nbytes)
        image = (s.slot_tier, s.slot) if with_image else None
        self.moves.append(TierMove(MOVE_TO_RAM, s.id, pages=tuple(s.pages), image_slot=image, dst_offset=off))
        pages = list(s.pages)
        if with_image:
            mgr.retained.release_slot(s)
        s.placement.pages = []
        s.placement.tier = RAM
        s.placement.extents = [(off, nbytes)]
        s.placement.image_in_extent = with_image
        mgr.pool.release(pages)
        self.counts["demotions_ram"] += 1
        return True

    def _to_disk(self, mgr, s) -> bool:
        """Plan the bytes of `s` (device pages or its arena extent, plus its image slot) for a KV-disk file; free
        what it held at once. Whether it moved (False: no KV-disk or no room under the ceiling)."""
        if self.disk_capacity <= 0 or s.tier == DISK:
            return False
        n_pages = mgr.retained.state_pages(s.n_tokens)
        with_image = s.slot is not None or s.placement.image_in_extent
        if with_image != (self.image_bytes > 0):
            return False                     # a hybrid's state without its image cannot be restored from disk
        payload = self.state_bytes(n_pages, with_image)
        store = mgr.retained
        while not self.disk_fits(payload):
            x = store.victim(tier=DISK, below=store.rank(s))
            if x is None or self.disk_capacity < self.disk_foreign + payload + self.header_bytes:
                return False
            store.drop(x.id)
            self.counts["dropped"] += 1
        image = (s.slot_tier, s.slot) if s.slot is not None else None      # else none or already in the extent
        p = s.placement
        if p.tier == DEVICE:
            self.moves.append(TierMove(MOVE_TO_BYTES, s.id, pages=tuple(p.pages), image_slot=image))
            mgr.pool.release(list(p.pages))
        else:
            off, nbytes = p.extents[0]
            self.moves.append(TierMove(MOVE_TO_BYTES, s.id, src_offset=off, nbytes=nbytes, image_slot=image))
            self.arena.free(off)
        store.release_slot(s)
        key = disk_record(s, self.page_tokens, self.page_bytes, self.image_layout, with_image, n_pages).key
        s.placement = Placement(DISK, disk_file=key, disk_bytes=payload + self.header_bytes, in_flight=True)
        self.disk_used += s.placement.disk_bytes
        self.counts["demotions_disk"] += 1
        return True

    def freed(self, placement: Placement) -> None:
        """A state let go of `placement` (the manager's on_free): its arena extent or its share of the disk."""
        for off, _ in placement.extents:
            self.arena.free(off)
        if placement.tier == DISK:
            self.disk_used -= placement.disk_bytes
            if placement.disk_file is not None:
                self.deletes.append(placement.disk_file)

    # ---------------------------------------------------------------- status
    def rows(self, mgr) -> list[dict]:
        """The status op's ``tiers`` rows: tier, bytes_total, bytes_used, states."""
        states = mgr.retained.states() if mgr.retained is not None else []
        count = {t: sum(1 for s in states if s.tier == t and not s.doomed) for t in (DEVICE, RAM, DISK)}
        pool = mgr.pool
        rows = [{"tier": DEVICE, "bytes_total": pool.total * self.page_bytes,
                 "bytes_used": pool.used * self.page_bytes, "states": count[DEVICE]}]
        if self.arena is not None:
            rows.append({"tier": RAM, "bytes_total": self.arena.total_bytes, "bytes_used": self.arena.used_bytes,
                         "states": count[RAM]})
        if self.disk_capacity > 0:
            rows.append({"tier": DISK, "bytes_total": self.disk_capacity, "bytes_used": self.disk_used,
                         "states": count[DISK]})
        return rows
