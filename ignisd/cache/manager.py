"""The one cache API the scheduler and the engine see (DESIGN §3, §4.1-§4.5). †: imports no torch.

`CacheManager` owns one page pool per tier (only the device KV pool exists today), the live state slots and the
retained-state store, and it alone takes and drops page references. Its verbs come in pairs over plain records:

* ``admit(seq_id, …)`` → `Admission` (pages for the whole bound, the live slot, the reuse match, the restore op)
  … ``release(seq_id)`` (pages, slot, pending captures and restores of a sequence that ended);
* ``plan_capture(seq_id, …)`` → `CaptureOp` or a refusal … ``finish_round(plan)`` (commit the round's captures,
  unpin and touch what its restores read) or, for a round that failed, ``finish_round(plan, failed=True)``;
* ``plan_moves()`` → the tier moves of the next round (none until KV-RAM and KV-disk exist);
* ``status()`` and ``check_integrity()``; ``reset()`` drops every retained state.
"""
from __future__ import annotations

from collections.abc import Sequence

from ignisd.cache.admission import Admission, ReuseMatch
from ignisd.cache.page_pool import IntegrityError, PagePool
from ignisd.cache.placement import Placement
from ignisd.cache.retained import RetainedStore
from ignisd.cache.retained_state import CaptureTicket, CommitResult
from ignisd.cache.state_slots import StateSlots
from ignisd.cache.disk_states import DiskStates
from ignisd.cache.live_eviction import LiveEviction
from ignisd.cache.tiers import Tiers
from ignisd.plan import CaptureOp, RestoreOp, RoundPlan, TierMove
from ignisd.vocab import CHECKPOINT, DEVICE, DISK, RAM, SLOT_TIERS

REFUSED_REUSE_OFF = "reuse_off"


class CacheManager(DiskStates, LiveEviction):
    """Pages, live slots and retained states of one daemon.

    pool: the device KV pool's accounting (pages of ``pool.page_tokens`` tokens). page_bytes: bytes of one page in
    the pool's KV format, every attention layer (status, metrics). slots: live state slots (None when neither the
    model nor the KV format keeps per-sequence state: sequences then hold no slot). state_bytes: bytes of one live
    slot. retained: the RetainedStore (None with reuse.prompt off); the manager becomes its ``on_free`` owner.
    kv_format: the pool's KVFormat (cache/kv_format.py), whose ``retained_pages(pos, page_tokens)`` says which pages
    a state captured at pos holds and whether its partial page is copied (None: dense — full pages shared, the
    partial page copied; hq-e8-2b: only the pages already encoded, no copy: the window travels in the image).
    """

    def __init__(self, pool: PagePool, page_bytes: int, slots: StateSlots | None = None, state_bytes: int = 0,
                 retained: RetainedStore | None = None, tiers: Tiers | None = None, kv_format=None):
        self.kv_format = kv_format
        self.pools: dict[str, PagePool] = {DEVICE: pool}
        self.page_bytes = page_bytes
        self.slots = slots
        self.state_bytes = state_bytes
        self.retained = retained
        self.tiers = tiers if tiers is not None else Tiers(None, 0, page_bytes, page_tokens=pool.page_tokens)
        self._loads: set[str] = set()                                    # KV-disk states a waiting request wants
        self._evicted: dict = {}                                         # live seq id -> Evicted (live_eviction)
        self._extent_loans: dict[int, str] = {}                          # arena offset -> state id (disk_states)
        if retained is not None:
            retained.on_free = self._free_placement
            retained.move_down = lambda s: self.tiers.move_down(self, s)
        self._live: dict[str, list[int]] = {}
        self._slot: dict[str, int] = {}
        self._restores: dict[str, RestoreOp] = {}                          # seq id -> restore not yet run
        self._captures: dict[str, tuple[str, CaptureTicket, int | None]] = {}  # ticket id -> (seq id, ticket, copy)

    # ---------------------------------------------------------------- geometry
    @property
    def pool(self) -> PagePool:
        """The device KV pool."""
        return self.pools[DEVICE]

    @property
    def page_tokens(self) -> int:
        """Tokens per page (64)."""
        return self.pool.page_tokens

    def held_pages(self, pos: int) -> tuple[int, bool]:
        """(pages shared by a state of `pos` tokens, whether its partial page is copied): the KV format's rule."""
        if self.kv_format is None:
            return pos // self.page_tokens, pos % self.page_tokens != 0
        return self.kv_format.retained_pages(pos, self.page_tokens)

    def pages_for(self, tokens: int) -> int:
        """Pages that hold `tokens` tokens."""
        return self.pool.pages_for(tokens)

    @property
    def reuse_enabled(self) -> bool:
        """Retained states exist (reuse.prompt on)."""
        return self.retained is not None

    @property
    def can_keep_images(self) -> bool:
        """A capture can ever be retained: the model keeps no image, or some retained slot exists."""
        r = self.retained
        return r is not None and (not r.needs_slot or any(p.total for p in r.slot_pools.values()))

    @property
    def free_captures(self) -> bool:
        """Captures cost no traversal (DESIGN §4.3): reuse is on, the model keeps no per-sequence image and the KV
        format is exact (no exact window: every position's K/V in the pages is final once written). Then prefill is
        not split at cut points, every opener is kept and a finished request keeps its whole sequence."""
        r = self.retained
        exact = self.kv_format is None or self.kv_format.exact_window_pages is None
        return r is not None and not r.needs_slot and exact

    # ---------------------------------------------------------------- admission
    def peek(self, prompt: Sequence[int]) -> int:
        """Prompt tokens the best retained state would restore now, without pinning anything (0 with reuse off)."""
        if self.retained is None:
            return 0
        return self.retained.lookup(prompt, pin=False, explain=False).matched_tokens

    def admit(self, seq_id: str, prompt: Sequence[int], bound_tokens: int, *, reuse: bool) -> Admission | None:
        """Admit sequence `seq_id`: look up the retained state to restore for `prompt` across the tiers, with the
        restore floors (when `reuse` and reuse is on; a hit stays pinned until its restore ran or the sequence is
        released), reserve pages for `bound_tokens` (prompt + max_tokens) — sharing a device match's full pages,
        copying a KV-RAM or KV-disk match's pages into its own — and a live slot when slots exist. Device-resident
        retained states move down (or go), lowest rank first, before pages are refused: retained state never refuses
        an admission. Returns None when too few pages or no live slot are free (nothing is held then), or an
        Admission with `wait_for` set when the match's KV-disk bytes must be read first (nothing is held; the engine
        reads them, see ``loads_wanted``, and the request is admitted on a later try).
        Raises ValueError when `seq_id` is already admitted.
        """
        if seq_id in self._live:
            raise ValueError(f"{seq_id} already holds pages")
        floors = self.tiers.floors if self.retained is not None else None
        lk = self.retained.lookup(prompt, floors=floors) if reuse and self.retained is not None else None
        state = lk.state if lk is not None else None
        if state is not None and state.tier == DISK and state.placement.payload is None:
            self.retained.unpin(state.id)
            self._loads.add(state.id)
            return Admission((), None, 0, ReuseMatch.of(lk), None, wait_for=state.id)
        resumed = lk.matched_tokens if state is not None else 0
        n_shared = self.held_pages(resumed)[0]
        shared = list(state.pages[:n_shared]) if state is not None and state.tier == DEVICE else []
        n = self.pool.pages_for(bound_tokens) - len(shared)
        if n < 0:
            raise ValueError(f"{len(shared)} shared pages exceed the bound of {bound_tokens} tokens")
        if (self.slots is not None and self.slots.free == 0) or not self._make_room(n):
            if state is not None:
                self.retained.unpin(state.id)
            return None
        self.pool.incref(shared)
        pages = shared + self.pool.alloc(n)
        self._live[seq_id] = pages
        slot = None
        if self.slots is not None:
            slot = self.slots.alloc(seq_id)
            self._slot[seq_id] = slot
        restore = None
        if state is not None:
            restore = self._restore_op(seq_id, state, resumed, pages, slot)
            self._restores[seq_id] = restore
        return Admission(tuple(pages), slot, resumed, ReuseMatch.of(lk) if lk is not None else None, restore)

    def _restore_op(self, seq_id: str, state, resumed: int, pages: list[int], slot: int | None) -> RestoreOp:
        pt = self.page_tokens
        p = state.placement
        n_full, copied = self.held_pages(resumed)
        if p.tier == DEVICE:
            partial = copied and resumed % pt != 0
            return RestoreOp(seq_id, state.id, p.pages[n_full] if partial else None,
                             pages[n_full] if partial else None, p.slot_tier, p.slot, slot)
        own = tuple(pages[:self.retained.state_pages(resumed)])
        if p.tier == RAM:
            return RestoreOp(seq_id, state.id, None, None, p.slot_tier, p.slot, slot, tier=RAM, dst_pages=own,
                             src_offset=p.extents[0][0], image_after_pages=p.image_in_extent)
        self._loads.discard(state.id)
        return RestoreOp(seq_id, state.id, None, None, None, None, slot, tier=DISK, dst_pages=own,
                         payload=p.payload, image_after_pages=self.tiers.image_bytes > 0)

    def evict_for_pages(self, pages: int) -> list[str]:
        """Make `pages` device pages free: lowest-ranked unpinned retained states (superseded checkpoints first)
        move to KV-RAM or KV-disk, or are dropped when no lower tier takes them. Returns their ids. A state that
        leaves the device frees only the pages no one else holds."""
        return self.tiers.make_device_room(self, pages)

    def _make_room(self, pages: int) -> bool:
        self.evict_for_pages(pages)
        return self.pool.free >= pages

    def release(self, seq_id: str) -> None:
        """Sequence `seq_id` ended: abort its pending captures, unpin a restore that never ran, and return its
        pages and live slot (no-op for what it does not hold)."""
        for tid in [t for t, (sid, _, _) in self._captures.items() if sid == seq_id]:
            self._abort(tid)
        rs = self._restores.pop(seq_id, None)
        if rs is not None and rs.state_id != seq_id:
            self.retained.unpin(rs.state_id)
        self._own_restore_done(seq_id)          # an evicted sequence that ends: its extent goes back
        pages = self._live.pop(seq_id, None)
        if pages:
            self.pool.release(pages)
        slot = self._slot.pop(seq_id, None)
        if slot is not None:
            self.slots.release(slot)

    # ---------------------------------------------------------------- captures and rounds
    def plan_capture(self, seq_id: str, kind: str, tokens: Sequence[int], *, priority,
                     after_user: bool) -> CaptureOp | str:
        """Reserve a capture of `kind` after `tokens` (the first len(tokens) prompt tokens of live sequence
        `seq_id`): a retained slot and, when the position is not page-aligned, one device page for the copy of
        the partial last page. Returns the CaptureOp for the round plan, or the refusal: "duplicate" (already
        retained: its last use is refreshed), "no_slot" (no retained slot, or no page for the copy), "reuse_off".
        Raises KeyError for a sequence that holds no pages."""
        if self.retained is None:
            return REFUSED_REUSE_OFF
        pages = self._live[seq_id]
        t = self.retained.reserve_capture(kind, tokens, priority=priority, after_user=after_user)
        if not t.ok:
            return t.refused
        pos = len(t.tokens)
        copy = src = None
        if self.held_pages(pos)[1]:
            if not self._make_room(1):
                self.retained.abort(t)
                return "no_slot"
            copy = self.pool.alloc(1)[0]
            src = pages[pos // self.page_tokens]
        self._captures[t.id] = (seq_id, t, copy)
        return CaptureOp(t.id, seq_id, pos, kind, t.slot_tier, t.slot, self._slot.get(seq_id), src, copy)

    def retain_sequence(self, seq_id: str, tokens: Sequence[int], *, priority) -> CommitResult | str:
        """Keep the whole sequence of `seq_id`, which has ended, as a retained checkpoint of `tokens` (its prompt and
        generated tokens whose K/V are in its pages), ranked below every current state (``reserve_capture(whole=
        True)``). Only under ``free_captures``: its pages are final and no longer written, so the partial last page
        is shared, not copied. Call before ``release(seq_id)``. Returns the CommitResult, or the refusal
        ("duplicate", "reuse_off"). Raises KeyError for a sequence that holds no pages, ValueError when captures
        are not free or `tokens` exceed its pages."""
        if self.retained is None:
            return REFUSED_REUSE_OFF
        if not self.free_captures:
            raise ValueError("retain_sequence needs an attention-only model in an exact KV format")
        pages = self._live[seq_id]
        n = len(tokens)
        if self.pages_for(n) > len(pages):
            raise ValueError(f"{n} tokens need {self.pages_for(n)} pages, sequence {seq_id} holds {len(pages)}")
        t = self.retained.reserve_capture(CHECKPOINT, tokens, priority=priority, after_user=False, whole=True)
        if not t.ok:
            return t.refused
        keep = list(pages[:self.pages_for(n)])
        self.pool.incref(keep)
        return self.retained.commit(t, keep)

    def _abort(self, ticket_id: str) -> None:
        _, t, copy = self._captures.pop(ticket_id)
        if copy is not None:
            self.pool.release([copy])
        self.retained.abort(t)

    def _commit(self, ticket_id: str) -> CommitResult:
        seq_id, t, copy = self._captures.pop(ticket_id)
        full = list(self._live[seq_id][:self.held_pages(len(t.tokens))[0]])
        self.pool.incref(full)
        return self.retained.commit(t, full + ([copy] if copy is not None else []))

    def finish_round(self, plan: RoundPlan, *, failed: bool = False) -> list[CommitResult]:
        """The round of `plan` ran (or, with `failed`, did not): unpin and touch the states its restores read,
        and commit its captures (abort them when failed; and drop the states its tier moves were copying, whose
        bytes may be half-moved). Captures and restores of sequences released meanwhile were settled by
        ``release`` and are skipped. Returns the commits' results."""
        if failed:
            for mv in plan.moves:
                if self._state(mv.state_id) is not None:
                    self.retained.drop(mv.state_id)
        for rs in plan.restores:
            if self._restores.get(rs.seq_id) is rs:
                del self._restores[rs.seq_id]
                if rs.state_id == rs.seq_id:            # an evicted live sequence's own bytes
                    self._own_restore_done(rs.seq_id)
                    continue
                if not failed:
                    self.retained.touch(rs.state_id)
                st = self._state(rs.state_id)
                if rs.tier == DISK and st is not None and not st.placement.in_flight:
                    st.placement.payload = None         # read back for this restore: its file is the copy
                self.retained.unpin(rs.state_id)
        out = []
        for cap in (c for it in plan.items for c in it.captures):
            if cap.ticket_id not in self._captures:
                continue
            if failed:
                self._abort(cap.ticket_id)
            else:
                out.append(self._commit(cap.ticket_id))
        return out

    def plan_moves(self) -> list[TierMove]:
        """The tier moves decided since the last round, in order (DESIGN §4.5); the next round runs them first."""
        return self.tiers.take_moves()

    def _free_placement(self, placement: Placement) -> None:
        """The store let go of `placement`: drop its device page references, its arena extent, its disk share."""
        if placement.pages:
            self.pool.release(placement.pages)
        self.tiers.freed(placement)

    # ---------------------------------------------------------------- status and integrity
    def reset(self) -> int:
        """Drop every retained state (pinned ones when their restore lets go). Returns how many were freed now."""
        return self.retained.reset() if self.retained is not None else 0

    def live_pages(self) -> int:
        """Distinct pages held by live sequences."""
        return len({p for pages in self._live.values() for p in pages})

    def retained_pages(self) -> int:
        """Distinct pages held by retained states (0 with reuse off)."""
        return self.retained.pages_held() if self.retained is not None else 0

    def live_state_bytes(self) -> int:
        """Bytes of the live state slots in use (0 when there are none)."""
        return len(self._slot) * self.state_bytes

    def holders(self) -> list[list[int]]:
        """Page lists of every holder of a device page: live sequences, pending capture copies, retained states."""
        out = list(self._live.values()) + [[c] for _, _, c in self._captures.values() if c is not None]
        if self.retained is not None:
            out += self.retained.holders()
        return out

    def status(self) -> dict:
        """The cache's part of the ``status`` op (DESIGN §5): kv_pool, slots, tiers, retained, live_states."""
        pool, r = self.pool, self.retained
        slots = {}
        for tier in SLOT_TIERS:
            p = r.slot_pools.get(tier) if r is not None else None
            slots[f"{tier}_total"] = p.total if p is not None else 0
            slots[f"{tier}_free"] = p.free if p is not None else 0
        return {
            "kv_pool": {"pages_total": pool.total, "pages_free": pool.free, "pages_live": self.live_pages(),
                        "pages_retained": self.retained_pages()},
            "slots": slots,
            "tiers": self.tiers.rows(self),
            "retained": r.rows() if r is not None else [],
            "live_states": {"slots_total": self.slots.total if self.slots else 0,
                            "slots_used": (self.slots.total - self.slots.free) if self.slots else 0,
                            "bytes_used": self.live_state_bytes()},
        }

    def check_integrity(self) -> None:
        """Prove, for pages and live slots, free + held = total and refcounts = holders; the retained store's slots,
        index and pins; and that every pending restore and capture belongs to a live sequence. Raises
        page_pool.IntegrityError."""
        self.pool.check_integrity(self.holders())
        if self.slots is not None:
            self.slots.check_integrity(self._slot.values())
        if self.retained is not None:
            self.retained.check_integrity()
        stray = [s for s in self._restores if s not in self._live]
        stray += [sid for sid, _, _ in self._captures.values() if sid not in self._live]
        if stray:
            raise IntegrityError(f"restores/captures pending for sequences that hold no pages: {sorted(stray)}")
        states = self.retained.states() if self.retained is not None else []
        if self.tiers.arena is not None:
            self.tiers.arena.check_integrity([off for st in states for off, _ in st.placement.extents]
                                             + self._arena_holders() + list(self._extent_loans))
        disk = sum(st.placement.disk_bytes for st in states if st.tier == DISK) + self._live_disk_bytes()
        if disk != self.tiers.disk_used:
            raise IntegrityError(f"KV-disk: states and evicted live sequences hold {disk} bytes but "
                                 f"{self.tiers.disk_used} are counted")


