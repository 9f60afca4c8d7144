"""Live-sequence eviction in the scheduler (DESIGN §4.5). †: imports no torch.

When the highest-ranked waiting request is interactive and cannot be admitted (no lane, no pages or no live slot),
the lowest-ranked running agent sequence is moved down: `reuse.evict_window_pages` pages a round into the KV-RAM
arena between decode rounds, while the other lanes keep generating (it is not scheduled meanwhile). Once it is out,
its lane, pages and slot go to the waiting request; it waits in the queue by its own rank and is admitted again
with a restore of its bytes, continuing exactly where it stopped (same KV bytes, state image, sampler generator and
stream position: no token is repeated or lost on its client's stream). When the arena cannot take it, it is
re-queued to be recomputed instead: its prefill then covers the prompt and every token generated so far but the
last, and decoding continues from that last token.
"""
from __future__ import annotations

from ignisd.request import Priority
from ignisd.sequence import Sequence, SeqState


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
        if sched.cache.begin_eviction(v.rid, v.computed):
            v.evicting = True
            v.resume_state = v.state
            self._count("moved")
            return True
        sched.cache.release(v.rid)
        sched.running.remove(v)
        v.recompute = bool(v.output)
        v.state = SeqState.WAITING
        v.computed, v.pages, v.slot, v.plan = 0, [], None, None
        sched.waiting.append(v)
        self.recomputed_total += 1
        self._count("recomputed")
        return True

    def _count(self, how: str) -> None:
        m = self.sched.metrics
        if m is not None:
            m.live_evictions.labels(how=how).inc()
            m.preemptions.inc()

    def admit(self, s: Sequence) -> bool:
        """Admit evicted `s` again with the restore of its bytes. Whether it got pages and a slot."""
        sched = self.sched
        adm = sched.cache.admit_evicted(s.rid, s.bound_tokens)
        if adm is None:
            return False
        sched.waiting.remove(s)
        s.pages, s.slot, s.restore = list(adm.pages), adm.slot, adm.restore
        s.evicted, s.state = False, s.resume_state or SeqState.DECODE
        sched.running.append(s)
        return True
