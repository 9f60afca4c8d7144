"""Live-sequence eviction in the scheduler (DESIGN §4.5). †: imports no torch.

When the highest-ranked waiting request is interactive and cannot be admitted (no lane, no pages or no live slot),
the lowest-ranked running agent sequence is moved down: `reuse.evict_window_pages` pages a round into the KV-RAM
arena between decode rounds, while the other lanes keep generating (it is not scheduled meanwhile), or, when the
arena cannot take it and KV-disk is on, into a KV-disk file (cache/live_eviction.py). Once it is out, its lane,
pages and slot go to the waiting request; it waits in the queue by its own rank and is admitted again with a
restore of its bytes (from KV-disk once its file is read back and verified), continuing exactly where it stopped
(same KV bytes, state image, sampler generator and stream position: no token is repeated or lost on its client's
stream). With KV-disk on no evicted sequence is discarded: when no tier can take one, the waiting request waits.
With KV-disk off, one the arena cannot take is re-queued to be recomputed; so is one whose KV-disk write or read
failed: its prefill then covers the prompt and every token generated so far but the last, and decoding continues
from that last token.
"""
from __future__ import annotations

from ignisd.request import Priority
from ignisd.sequence import Sequence, SeqState

ADMITTED, BLOCKED, READING, LOST = "admitted", "blocked", "reading", "lost"


class Evictions:
    """The scheduler's evictions. sched: the Scheduler. window_pages: pages moved per round (>= 1)."""

    def __init__(self, sched, window_pages: int = 16):
        self.sched = sched
        self.window = max(1, window_pages)
        self.evicted_total = 0
        self.recomputed_total = 0

    @property
    def in_flight(self) -> bool:
        """A sequence is being moved down now."""
        return any(s.evicting for s in self.sched.running)

    def step(self) -> None:
        """Plan the next window of every sequence being moved down; one that is fully out leaves its lane and waits
        in the queue (its own rank) to be admitted again."""
        sched = self.sched
        for s in [x for x in sched.running if x.evicting]:
            if sched.cache.eviction_step(s.rid, self.window):
                sched.running.remove(s)
                s.evicting, s.evicted = False, True
                s.pages, s.slot = [], None
                sched.waiting.append(s)
                self.evicted_total += 1

    def victim(self, waiting: Sequence) -> Sequence | None:
        """The running sequence to move down for `waiting`: only for an interactive request, the latest-arrived
        running agent sequence that has no restore pending and asks for no prompt_logprobs."""
        if waiting.req.priority is not Priority.INTERACTIVE or self.in_flight:
            return None
        pool = [s for s in self.sched.running if s.req.priority is Priority.AGENT and s.restore is None
                and not s.evicting and s.req.prompt_logprobs is None and s.state in (SeqState.PREFILL,
                                                                                    SeqState.DECODE)]
        return max(pool, key=lambda s: s.req.arrival) if pool else None

    def maybe_evict(self, waiting: Sequence) -> bool:
        """`waiting` could not be admitted: start moving a lower-ranked running sequence down (or re-queue it for
        recompute when KV-RAM cannot hold it). Whether one was chosen."""
        v = self.victim(waiting)
        if v is None:
            return False
        sched = self.sched
        if sched.cache.begin_eviction(v.rid, v.computed, v.req.priority.value):
            v.evicting = True
            v.resume_state = v.state
            self._count("moved")
            return True
        if sched.cache.live_disk_on:
            return False               # every tier is full of live work: the waiting request waits
        sched.cache.release(v.rid)
        sched.running.remove(v)
        sched.waiting.append(v)
        self._recompute(v)
        return True

    def _recompute(self, v: Sequence) -> None:
        """Re-queued `v` (already in the waiting queue, holding nothing) prefills again from scratch: prompt +
        generated but the last when it has output (no new reply), else its prompt as a fresh admission."""
        v.recompute = bool(v.output)
        v.state = SeqState.WAITING
        v.evicted, v.evicting = False, False
        if not v.output:
            v.prefilled = 0
        v.computed, v.pages, v.slot, v.plan = 0, [], None, None
        self.recomputed_total += 1
        self._count("recomputed")

    def _count(self, how: str) -> None:
        m = self.sched.metrics
        if m is not None:
            m.live_evictions.labels(how=how).inc()
            m.preemptions.inc()

    def admit(self, s: Sequence) -> str:
        """Admit evicted `s` again with the restore of its bytes. Returns ADMITTED; BLOCKED (too few pages or no
        slot: later requests must not overtake it); READING (its KV-disk bytes are being produced, written or read
        back: it holds nothing, later requests may go first); or LOST (a KV-disk write or read failed: it is now a
        request to recompute, to be admitted like one)."""
        sched = self.sched
        if sched.cache.take_lost(s.rid):
            self._recompute(s)
            return LOST
        adm = sched.cache.admit_evicted(s.rid, s.bound_tokens)
        if adm is None:
            return BLOCKED
        if adm.wait_for is not None:
            return READING
        sched.waiting.remove(s)
        s.pages, s.slot, s.restore = list(adm.pages), adm.slot, adm.restore
        s.evicted, s.state = False, s.resume_state or SeqState.DECODE
        sched.running.append(s)
        return ADMITTED
