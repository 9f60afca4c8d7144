"""Retained states: retained prefixes and prompt checkpoints and their lifetime (DESIGN §4.4; ranking: ranking.py).

†: imports no torch. A retained state outlives its request: it holds the KV pages of its tokens (shared in place,
reference counted, never written; its partial last page is a private copy) and, on a hybrid model, an image of the
per-sequence state at its end in a retained slot. It carries its tokens, image digests, kind, priority class, last
use, placement (tier and where its bytes are) and a stamp.

Ownership: the store keeps the records, the content index, the ranking and the retained image slots; it never
touches a page pool. The cache manager (``cache/manager.py``) takes the page references a state holds before
``commit`` and drops them when the store lets the state go: the store hands every placement it frees to the
``on_free`` hook its owner gives it. A capture is two-phase, because the scheduler plans it before the round and
the runner copies during it:

1. ``reserve_capture(...)``: refuses a duplicate or, on a hybrid, finds a retained slot — a free one (device first,
   then host), else the slot of the lowest-ranked unpinned state ranking *below the new one* (that state is
   dropped); none: refused with ``no_slot`` and the request runs without leaving reuse behind.
2. ``commit(ticket, pages)``: after the runner copied the image into ``ticket.slot`` and the partial last page;
   ``pages`` are the state's page ids in position order, one reference on each taken by the caller for the store.
   ``abort(ticket)`` frees the slot of a capture that will not happen.

The conversation rule is a ranking, not a drop: a new checkpoint marks the older checkpoints of its conversation
(those whose content is a prefix of its own) superseded, except the latest one taken right after a real user
message; superseded states stay and rank below all others, so forks, edits and regenerations still resume at
their parent until room is needed.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from ignisd.cache import ranking
from ignisd.cache.page_pool import IntegrityError
from ignisd.cache.placement import Placement
from ignisd.cache.prefix_index import ImageSpan, PrefixIndex, normalize_spans
from ignisd.cache.retained_state import (DEFAULT_INTERACTIVE_TTL, REASON_MISS, REASON_STAMP, REFUSED_DUPLICATE,
                                         REFUSED_NO_SLOT, CaptureTicket, CommitResult, LookupResult,
                                         RetainedState, Stamp, _priority)
from ignisd.cache.state_slots import StateSlots
from ignisd.vocab import DEVICE, DISK, KINDS, PAGE_TOKENS, SLOT_TIERS, TIERS


class RetainedStore:
    """The retained states of one daemon, over the KV pool and the retained slots.

    stamp: this daemon's stamp (given to every capture). page_tokens: tokens per KV page.
    device_slots / host_slots: the retained-slot pools reserved at load (``reuse.device_slots`` and
    ``reuse.host_slots_per_lane`` × lanes); separate from the live slots. needs_slot: a hybrid model (its image
    has bytes); on an all-attention model (False) a capture takes no slot. interactive_ttl: seconds an interactive
    checkpoint may idle in KV-RAM before it ranks as an agent one. clock: seconds (time.monotonic; tests inject).
    on_free: called with the Placement of every state (or duplicate commit) whose bytes the store lets go, after
    the store released its slot; the owner drops the page references (the cache manager's job).
    kv_format: the pool's KVFormat, whose ``retained_pages`` says how many device pages a state of n tokens holds
    (None: pages_for(n), the dense rule; hq-e8-2b: only its encoded pages).
    """

    def __init__(self, stamp: Stamp, *, page_tokens: int = PAGE_TOKENS, device_slots: StateSlots | None = None,
                 host_slots: StateSlots | None = None, needs_slot: bool = True,
                 interactive_ttl: float = DEFAULT_INTERACTIVE_TTL, clock: Callable[[], float] = time.monotonic,
                 on_free: Callable[[Placement], None] | None = None, kv_format=None):
        self.page_tokens = page_tokens
        self.kv_format = kv_format
        self.stamp = stamp
        self.on_free = on_free
        self.move_down: Callable[[RetainedState], bool] | None = None   # the owner's tier policy (slot victims)
        self.slot_pools: dict[str, StateSlots] = {}
        if device_slots is not None:
            self.slot_pools["device"] = device_slots
        if host_slots is not None:
            self.slot_pools["host"] = host_slots
        self.needs_slot = needs_slot
        self.interactive_ttl = interactive_ttl
        self.clock = clock
        self.index = PrefixIndex(page_tokens)
        self._states: dict[str, RetainedState] = {}
        self._tickets: dict[str, CaptureTicket] = {}
        self._next = 0

    # ---------------------------------------------------------------- introspection
    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, state_id: str) -> bool:
        return state_id in self._states

    def get(self, state_id: str) -> RetainedState:
        """The state ``state_id`` (doomed ones included). Raises KeyError."""
        return self._states[state_id]

    def states(self) -> list[RetainedState]:
        """Every state still holding its pages (doomed pinned ones included), oldest first."""
        return list(self._states.values())

    def holders(self) -> list[list[int]]:
        """One page list per retained state, for ``PagePool.check_integrity`` beside the live sequences'."""
        return [list(s.pages) for s in self._states.values()]

    def pages_held(self) -> int:
        """Distinct KV pages held by retained states (``status.kv_pool.pages_retained``)."""
        return len({p for s in self._states.values() for p in s.pages})

    def slots_free(self, slot_tier: str) -> int:
        """Free retained slots in the "device" or "host" pool (0 when there is no such pool)."""
        pool = self.slot_pools.get(slot_tier)
        return pool.free if pool is not None else 0

    def rows(self) -> list[dict]:
        """The ``status`` op's ``retained`` rows: kind, tier, tokens, priority, age_s, idle_s, holders (pins), and
        image_slot (the state's image is in a retained slot; False on an attention-only model, on KV-disk, or in
        KV-RAM with the image in the arena extent after its pages)."""
        now = self.clock()
        return [{"kind": s.kind, "tier": s.tier, "tokens": s.n_tokens, "priority": s.priority,
                 "age_s": now - s.created, "idle_s": now - s.last_use, "holders": s.pins,
                 "image_slot": s.slot is not None}
                for s in self._states.values() if not s.doomed]

    # ---------------------------------------------------------------- ranking
    def rank(self, state: RetainedState, now: float | None = None) -> tuple[int, int, float]:
        """The state's rank (cache/ranking.py: higher keeps longer) at `now` (default: the store's clock)."""
        return ranking.rank(state, self.clock() if now is None else now, self.interactive_ttl)

    def victim(self, *, below: tuple | None = None, with_slot: bool = False, tier: str | None = None,
               now: float | None = None) -> RetainedState | None:
        """The lowest-ranked state that can be dropped or moved down (cache/ranking.py ``lowest``), or None."""
        return ranking.lowest(self._states.values(), self.clock() if now is None else now, self.interactive_ttl,
                              below=below, with_slot=with_slot, tier=tier)

    # ---------------------------------------------------------------- capture
    def _find(self, kind: str, tokens: tuple[int, ...], spans: tuple[ImageSpan, ...], stamp: Stamp):
        for m in self.index.matches(tokens, spans):
            s = self._states[m.state_id]
            if m.matched_tokens == len(tokens) and s.kind == kind and s.stamp == stamp \
                    and s.image_spans == spans:
                return s
        return None

    def state_pages(self, tokens: int) -> int:
        """Device pages a retained state of `tokens` tokens holds: pages_for(tokens) (dense), or the KV format's
        retained_pages (shared + copied partial page; hq-e8-2b: its encoded pages)."""
        if self.kv_format is None:
            return -(-tokens // self.page_tokens)
        n, copy = self.kv_format.retained_pages(tokens, self.page_tokens)
        return n + int(copy)

    def reserve_capture(self, kind: str, tokens: Sequence[int], image_spans: Iterable[Sequence] = (), *,
                        priority="interactive", after_user: bool = False,
                        stamp: Stamp | None = None, whole: bool = False) -> CaptureTicket:
        """Phase 1 of a capture of ``kind`` after ``tokens``. See the module docstring.

        A state of the same kind, content and stamp already retained: refused "duplicate" (its last use is
        refreshed, and an interactive capture promotes it to interactive). On a hybrid: a free retained slot, device
        first, else the slot of the lowest-ranked unpinned state ranking below the new one (dropped:
        ``ticket.dropped``), else refused "no_slot". whole: a finished request's whole sequence (attention-only,
        exact format): committed superseded (ranked below every current state, DESIGN §4.3), and it supersedes
        nothing.
        Raises ValueError for an unknown kind or priority, or malformed image spans.
        """
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} not one of {KINDS}")
        tokens = tuple(int(t) for t in tokens)
        spans = normalize_spans(image_spans, len(tokens))
        stamp = stamp or self.stamp
        self._next += 1
        t = CaptureTicket(f"ret-{self._next}", kind, tokens, spans, _priority(priority), bool(after_user), stamp,
                          whole=whole)
        now = self.clock()
        same = self._find(kind, tokens, spans, stamp)
        if same is not None:
            same.last_use = now
            if t.priority == "interactive":
                same.priority = "interactive"      # what an interactive request would have left behind
            t.refused = REFUSED_DUPLICATE
            return t
        if self.needs_slot:
            got = self._take_slot(t.id)
            if got is None:
                new_rank = (1, 1 if t.priority == "interactive" else 0, now)
                v = self.victim(below=new_rank, with_slot=True, now=now)
                if v is not None:
                    if self.move_down is None or not self.move_down(v):
                        t.dropped.append(v.id)
                        self._free(v)
                    got = self._take_slot(t.id)
            if got is None:
                t.refused = REFUSED_NO_SLOT
                return t
            t.slot_tier, t.slot = got
        self._tickets[t.id] = t
        return t

    def _take_slot(self, holder: str) -> tuple[str, int] | None:
        for tier in SLOT_TIERS:
            pool = self.slot_pools.get(tier)
            if pool is not None:
                slot = pool.alloc(holder)
                if slot is not None:
                    return tier, slot
        return None

    def abort(self, ticket: CaptureTicket) -> None:
        """Give back what ``ticket`` reserved (its slot); no-op for a refused or already settled ticket."""
        if self._tickets.pop(ticket.id, None) is not None and ticket.slot is not None:
            self.slot_pools[ticket.slot_tier].release(ticket.slot)

    def commit(self, ticket: CaptureTicket, pages: Sequence[int]) -> CommitResult:
        """Phase 2: retain the state of ``ticket`` with ``pages`` (one reference each taken for the store; see the
        module docstring), index it, and for a checkpoint apply the conversation rule: the older checkpoints whose
        content is a prefix of this one's are the same conversation's; all of them but the latest one taken right
        after a real user message (none when this one is) are marked superseded — kept, ranked below every current
        state. If an identical state was committed meanwhile, this one's pages (through ``on_free``) and slot are
        released and that one is returned.

        Raises ValueError for a ticket that is not reserved, or a page count other than state_pages(len(tokens)).
        """
        if self._tickets.get(ticket.id) is not ticket:
            raise ValueError(f"ticket {ticket.id} is not reserved (refused, aborted or committed)")
        pages = list(pages)
        want = self.state_pages(len(ticket.tokens))
        if len(pages) != want:
            raise ValueError(f"{len(pages)} pages for {len(ticket.tokens)} tokens (want {want})")
        del self._tickets[ticket.id]
        now = self.clock()
        placement = Placement(DEVICE, pages, slot_tier=ticket.slot_tier, slot=ticket.slot)
        same = self._find(ticket.kind, ticket.tokens, ticket.image_spans, ticket.stamp)
        if same is not None:
            self._release(placement)
            same.last_use = now
            if ticket.priority == "interactive":
                same.priority = "interactive"
            return CommitResult(same, duplicate=True)
        s = RetainedState(ticket.id, ticket.kind, ticket.tokens, ticket.image_spans, placement, ticket.priority,
                          now, now, ticket.stamp, after_user=ticket.after_user)
        older = []
        s.superseded = s.whole = ticket.whole
        if s.kind == "checkpoint" and not ticket.whole:
            older = [self._states[m.state_id] for m in self.index.matches(s.tokens, s.image_spans)]
            older = [o for o in older if o.kind == "checkpoint" and o.stamp == s.stamp]
        self._states[s.id] = s
        self.index.insert(s.id, s.tokens, s.image_spans)
        keep = None
        if not s.after_user:
            users = [o for o in older if o.after_user]
            keep = max(users, key=lambda o: (o.n_tokens, o.created)) if users else None
        superseded = []
        for o in older:
            if o is keep:
                o.superseded = False
            elif not o.superseded:
                o.superseded = True
                superseded.append(o.id)
        return CommitResult(s, superseded=superseded)

    # ---------------------------------------------------------------- lookup
    def stamp_ok(self, state: RetainedState) -> bool:
        """Whether ``state`` was computed by this daemon's model, KV format and drafter."""
        return state.stamp == self.stamp

    def lookup(self, prompt: Sequence[int], image_spans: Iterable[Sequence] = (), *, limit: int | None = None,
               pin: bool = True, explain: bool = True, floors: dict[str, int] | None = None) -> LookupResult:
        """The retained state to restore for ``prompt``: among the states whose tokens and images are a prefix of it
        (at most ``limit`` tokens; None: len(prompt) - 1, so a token is left to prefill and sample from), the longest
        on the device; a KV-RAM match only if it reuses at least ``floors["ram"]`` more tokens than that, and a
        KV-disk match only if it reuses at least ``floors["disk"]`` more than the best above it (restore floors,
        DESIGN §4.5; each floor is at least 1, so a tie goes to the tier above); equally long ones by rank. A state
        of another stamp is refused before anything moves (reason "stamp_mismatch" when it was the only kind of
        match). On a hit the state is pinned (``pin``: until ``unpin`` after the restore finished or was abandoned)
        and its last use set. explain: also find ``candidate`` (the diverging state sharing more than the match)."""
        prompt = list(prompt)
        spans = normalize_spans(image_spans)
        now = self.clock()
        found = self.index.matches(prompt, spans, len(prompt) - 1 if limit is None else limit)
        good = [m for m in found if self.stamp_ok(self._states[m.state_id])]
        hit = None
        for tier in TIERS:                      # device, ram, disk: a lower tier must beat the one above by a floor
            here = [m for m in good if self._states[m.state_id].tier == tier]
            if not here:
                continue
            best = max(m.matched_tokens for m in here)
            floor = 0 if tier == DEVICE else max(1, (floors or {}).get(tier, 1))
            if best - (hit.matched_tokens if hit is not None else 0) < floor:
                continue
            hit = max((m for m in here if m.matched_tokens == best),
                      key=lambda m: (self.rank(self._states[m.state_id], now), self._states[m.state_id].created))
        cand = cand_state = None
        if explain:
            cand = self.index.best_candidate(prompt, spans, key=lambda sid: self.rank(self._states[sid], now))
            if cand is not None and hit is not None and cand.common_tokens <= hit.matched_tokens:
                cand = None
            cand_state = self._states[cand.state_id] if cand is not None else None
        if hit is None:
            return LookupResult(None, 0, REASON_STAMP if found and not good else REASON_MISS, cand, cand_state)
        s = self._states[hit.state_id]
        if pin:                                 # a peek (pin=False) changes no rank
            s.last_use = now
            s.pins += 1
        return LookupResult(s, hit.matched_tokens, None, cand, cand_state)

    def pin(self, state_id: str) -> None:
        """Add one pin to ``state_id``: it cannot be dropped until as many unpins. Raises KeyError."""
        self._states[state_id].pins += 1

    def unpin(self, state_id: str) -> None:
        """Drop one pin; a doomed state is freed at its last unpin. Raises KeyError, or IntegrityError when not
        pinned."""
        s = self._states[state_id]
        if s.pins <= 0:
            raise IntegrityError(f"unpin of unpinned retained state {state_id}")
        s.pins -= 1
        if not s.pins and s.doomed:
            self._free(s)

    def touch(self, state_id: str) -> None:
        """Mark ``state_id`` used now (e.g. when its restore finishes). Raises KeyError."""
        self._states[state_id].last_use = self.clock()

    # ---------------------------------------------------------------- dropping
    def drop(self, state_id: str) -> bool:
        """Drop ``state_id``: release its pages and slot now, or, while pinned, take it out of the index and free it
        at its last unpin (doomed). Returns True when freed now. Raises KeyError."""
        s = self._states[state_id]
        if s.pins:
            if not s.doomed:
                s.doomed = True
                self.index.remove(s.id)
            return False
        self._free(s)
        return True

    def _release(self, placement: Placement) -> None:
        """Let go of `placement`: free its retained slot here, then hand its page references to ``on_free``."""
        if placement.slot is not None:
            self.slot_pools[placement.slot_tier].release(placement.slot)
        held = Placement(placement.tier, list(placement.pages), list(placement.extents), placement.disk_file,
                         placement.disk_bytes)
        placement.pages, placement.extents, placement.disk_file, placement.disk_bytes = [], [], None, 0
        placement.slot_tier, placement.slot, placement.payload = None, None, None
        placement.image_in_extent = False
        if self.on_free is not None and not held.holds_nothing:
            self.on_free(held)

    def release_slot(self, s: RetainedState) -> None:
        """Give back the retained slot of `s` (its image now travels with its bytes: the tier policy copied it out
        in the round that follows)."""
        if s.placement.slot is not None:
            self.slot_pools[s.placement.slot_tier].release(s.placement.slot)
            s.placement.slot_tier, s.placement.slot = None, None

    def add(self, state: RetainedState) -> None:
        """Index a state that was already retained elsewhere (a KV-disk file found at start). Raises ValueError for
        an id already present."""
        if state.id in self._states:
            raise ValueError(f"retained state {state.id} already present")
        self._states[state.id] = state
        self.index.insert(state.id, state.tokens, state.image_spans)

    def _free(self, s: RetainedState) -> None:
        if not s.doomed:
            self.index.remove(s.id)
        del self._states[s.id]
        self._release(s.placement)

    def reset(self) -> int:
        """The ``reset`` op: drop every retained state. Pinned ones (a restore in flight) are doomed — out of the
        index at once, freed when the restore lets go. Returns how many were freed now."""
        return sum(self.drop(sid) for sid in list(self._states))

    # ---------------------------------------------------------------- integrity
    def slot_holders(self) -> dict[str, list[int]]:
        """Retained slots held per slot pool ("device" / "host"): by states and by reserved tickets."""
        out: dict[str, list[int]] = {t: [] for t in self.slot_pools}
        for x in list(self._states.values()) + list(self._tickets.values()):
            if x.slot is not None:
                out[x.slot_tier].append(x.slot)
        return out

    def check_integrity(self) -> None:
        """Prove the retained slots (free + held = total, each held by exactly one state or ticket), the index (it
        holds exactly the states that are not doomed), the pins (never negative; a doomed state is pinned) and the
        page counts of device-tier states. The pages themselves are proven by ``PagePool.check_integrity`` with
        ``holders()``. Raises IntegrityError."""
        for tier, held in self.slot_holders().items():
            self.slot_pools[tier].check_integrity(held)
        live = {sid for sid, s in self._states.items() if not s.doomed}
        if set(self.index.ids()) != live:
            raise IntegrityError(f"prefix index holds {sorted(map(str, self.index.ids()))} but the live retained "
                                 f"states are {sorted(live)}")
        try:
            self.index.check_integrity()
        except AssertionError as e:
            raise IntegrityError(str(e)) from None
        for s in self._states.values():
            if s.pins < 0 or (s.doomed and not s.pins):
                raise IntegrityError(f"retained state {s.id}: pins {s.pins}, doomed {s.doomed}")
            if self.needs_slot and s.slot is None and s.tier != DISK and not s.placement.image_in_extent:
                raise IntegrityError(f"retained state {s.id} in {s.tier} holds no image slot on a hybrid model")
            if s.tier == DISK and s.slot is not None:
                raise IntegrityError(f"retained state {s.id} on KV-disk still holds an image slot")
            if s.tier == DEVICE and len(s.pages) != self.state_pages(s.n_tokens):
                raise IntegrityError(f"retained state {s.id}: {len(s.pages)} pages for {s.n_tokens} tokens")
