"""The decode-round scheduler: queues, ranking, admission against the cache manager, chunk plan (DESIGN §2, §4.1).

†: imports no torch. Every round `schedule()` admits waiting requests whose whole bound (prompt + max_tokens pages)
can be reserved, gives every decoding lane one token, and fills the round's prefill budget with whole prefill
chunks; `update()` folds the runner's result back and returns the events for the server.

Chunking: the prompt is cut into traversals at its resume point and capture points (DESIGN §4.3,
``text.segments.plan_traversals``); chunk k of traversal [a, b) is [a + kC, min(b, a + (k+1)C)) with
C = min(server.prefill_chunk, server.round_prefill_tokens), so the same prompt is always split the same way whatever
else is running. A round may run several chunks of one sequence; they go to the runner in order and each sees the
K/V of the ones before it.

Prompt reuse (DESIGN §4.1-§4.4): at admission a request looks up the longest retained state whose tokens are a
prefix of its prompt (pinned until its restore ran), shares its full pages in place and resumes after it; the round
that follows carries a RestoreOp (copy of the partial last page into the sequence's own page, image into its live
slot). A chunk that ends at a capture point carries a CaptureOp (reserved here; the runner copies the image and the
partial page after that chunk's pass; committed in ``update()``), and the sequence runs no further chunk that round.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import replace

from ignisd.cache.manager import CacheManager
from ignisd.plan import (  # noqa: F401  (re-exported: callers import these from ignisd.scheduler)
    AdmissionError,
    CaptureOp,
    ItemResult,
    PlanItem,
    QueueFull,
    RestoreOp,
    RoundPlan,
    SeqState,
    Sequence,
)
from ignisd.request import (
    DoneEvent,
    ErrorEvent,
    FinishReason,
    Priority,
    Request,
    ReuseInfo,
    TokenEvent,
)
from ignisd.text.segments import TraversalPlan, plan_traversals  # noqa: F401


class Scheduler:
    """Queues and lanes over one CacheManager.

    lanes: decode lanes (server.lanes). context_tokens: cap on prompt + generation. prefill_chunk and
    round_prefill_tokens: tokens (DESIGN §6). max_queue: waiting requests before `busy`.
    """

    def __init__(self, cache: CacheManager, *, lanes: int, context_tokens: int, prefill_chunk: int,
                 round_prefill_tokens: int, max_queue: int, metrics=None):
        self.cache = cache
        self.metrics = metrics
        self.lanes = lanes
        self.context_tokens = context_tokens
        self.chunk = max(1, min(prefill_chunk, round_prefill_tokens))
        self.round_prefill_tokens = round_prefill_tokens
        self.max_queue = max_queue
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.finished_events: list = []
        self._held_long = False      # the last round ran only the prefills that ended in it

    # ---- commands ----
    def check(self, req: Request) -> None:
        """Refuse a request that could never be admitted. Raises AdmissionError (context_length / bad_request)."""
        n = len(req.prompt_ids)
        if n == 0:
            raise AdmissionError("bad_request", "the prompt renders to no tokens", "prompt")
        bound = n + req.sampling.max_tokens
        if bound > self.context_tokens:
            raise AdmissionError(
                "context_length",
                f"prompt ({n} tokens) + max_tokens ({req.sampling.max_tokens}) = {bound} exceeds the context of "
                f"{self.context_tokens} tokens", "max_tokens")
        need = self.cache.pages_for(bound)
        if need > self.cache.pool.total:
            raise AdmissionError(
                "context_length",
                f"prompt + max_tokens needs {need} KV pages but the pool has {self.cache.pool.total} "
                f"({self.cache.pool.total * self.cache.page_tokens} tokens; raise vram.kv_pool_bytes)", "max_tokens")

    def submit(self, req: Request) -> None:
        """Queue `req` and admit what fits now. Raises AdmissionError if it can never run, QueueFull when
        max_queue requests are already waiting (a request that gets a lane at once never waits)."""
        self.check(req)
        self._admit()
        if len(self.waiting) >= self.max_queue:
            raise QueueFull(f"{len(self.waiting)} requests waiting (server.max_queue = {self.max_queue})")
        self.waiting.append(Sequence(req))
        self._admit()

    def cancel(self, rid: str, reason: FinishReason) -> list:
        """End `rid` now (it must not be in the round in flight). Returns its DoneEvent list ([] if unknown)."""
        for s in list(self.waiting):
            if s.rid == rid:
                self.waiting.remove(s)
                return [self._finish(s, reason)]
        for s in self.running:
            if s.rid == rid:
                return [self._finish(s, reason)]
        return []

    # ---- one round ----
    def _admit(self) -> None:
        order = sorted(self.waiting, key=lambda s: (s.req.priority is not Priority.INTERACTIVE, s.req.arrival))
        for s in order:
            if len(self.running) >= self.lanes:
                break
            store = self.cache.retained
            req = s.req
            n = len(req.prompt_ids)
            lk = None
            if self._capturing(s):
                ahead = self._pending_capture(s)
                if ahead and store.lookup(req.prompt_ids, pin=False, explain=False).matched_tokens < ahead:
                    continue   # a running prefill is about to retain a longer shared prefix: resume from it then
                lk = store.lookup(req.prompt_ids)          # pins a hit until its restore ran
            match = lk.state if lk is not None else None
            r = lk.matched_tokens if match is not None else 0
            pt = self.cache.page_tokens
            got = self.cache.reserve(s.rid, s.bound_tokens, match.pages[:r // pt] if match is not None else ())
            if got is None:
                if match is not None:
                    store.unpin(match.id)
                break  # strict rank order: a later request never overtakes one that is waiting for pages
            self.waiting.remove(s)
            s.pages, s.slot = got
            s.state = SeqState.PREFILL
            s.admitted_at = time.monotonic()
            if req.prompt_logprobs is not None:
                s.prompt_logprobs = [None]
            s.resume = s.computed = r
            s.reuse = self._reuse_info(s, lk)
            if match is not None:
                partial = r % pt != 0
                s.restore = RestoreOp(s, match.id, match.pages[r // pt] if partial else None,
                                      s.pages[r // pt] if partial else None, match.slot_tier, match.slot)
            s.plan = plan_traversals(r, req.publish, req.opener, n, chunk_tokens=self.chunk, page_tokens=pt)
            m = self.metrics
            if m is not None and lk is not None:
                m.reuse_lookups.inc()
                if match is not None:
                    m.reuse_hits.labels(kind=match.kind, tier=match.tier).inc()
                    m.reuse_tokens_restored.inc(r)
            self.running.append(s)

    def _reuse_info(self, s: Sequence, lk) -> ReuseInfo:
        req = s.req
        if lk is None:
            reason = "prompt_logprobs" if (req.prompt_logprobs is not None and req.cache_prompt
                                           and self.cache.retained is not None) else "reuse_off"
            return ReuseInfo(reason=reason)
        cand = lk.candidate_state
        extra = {}
        if cand is not None:
            extra = dict(candidate_tokens=tuple(cand.tokens), candidate_kind=cand.kind, candidate_tier=cand.tier,
                         candidate_common=lk.candidate.common_tokens)
        if lk.state is not None:
            return ReuseInfo(tier=lk.state.tier, kind=lk.state.kind, cached_tokens=lk.matched_tokens, reason=None,
                             **extra)
        return ReuseInfo(reason=self._miss_reason(req, lk.reason), **extra)

    def _miss_reason(self, req: Request, found: str) -> str:
        """Why a lookup that restored nothing missed (``ignis.reuse.reason``, DESIGN §5), most specific first:
        stamp_mismatch (only states of another stamp matched); short (the prompt has at most one page of tokens: no
        retained state, at least a page long, can leave a token of it to prefill, and it captures nothing); no_slot
        (a hybrid model with no retained slot at all can keep no image, so nothing is ever retained); the prompt's
        missing cut (cut_unaligned, below_page); else miss. A miss whose own capture is then refused for want of a
        slot is re-labelled no_slot when that happens (``_reserve_capture``)."""
        if found != "miss":
            return found
        store = self.cache.retained
        if len(req.prompt_ids) <= self.cache.page_tokens:
            return "short"
        if store.needs_slot and not any(p.total for p in store.slot_pools.values()):
            return "no_slot"
        return req.cut_reason or "miss"

    def _pending_capture(self, s: Sequence) -> int:
        """The longest capture point that a running prefill has yet to reach and whose tokens start `s`'s prompt
        (0: none). A burst of requests sharing a system + tools block then waits for the first to publish it instead
        of prefilling it again beside it."""
        ids = s.req.prompt_ids
        best = 0
        for t in self.running:
            if t.state is not SeqState.PREFILL or t.plan is None or not self._capturing(t):
                continue
            for c in t.plan.captures:
                if best < c.pos < len(ids) and c.pos > t.computed and t.req.prompt_ids[:c.pos] == ids[:c.pos]:
                    best = c.pos
        return best

    def _capturing(self, s: Sequence) -> bool:
        return self.cache.retained is not None and s.req.cache_prompt and s.req.prompt_logprobs is None

    def _reserve_capture(self, s: Sequence, end: int) -> CaptureOp | None:
        c = s.plan.capture_at(end) if s.plan is not None and self._capturing(s) else None
        if c is None:
            return None
        ticket, copy = self.cache.reserve_capture(
            c.kind, s.req.prompt_ids[:end], priority=s.req.priority,
            after_user=c.kind == "checkpoint" and s.req.after_user)
        if not ticket.ok:
            if self.metrics is not None:
                self.metrics.reuse_captures_skipped.labels(reason=ticket.refused).inc()
            if ticket.refused == "no_slot" and s.reuse is not None and s.reuse.reason == "miss":
                s.reuse = replace(s.reuse, reason="no_slot")
            return None
        s.tickets.append(ticket)
        pt = self.cache.page_tokens
        return CaptureOp(ticket, end, c.kind, ticket.slot_tier, ticket.slot,
                         s.pages[end // pt] if copy is not None else None, copy)

    def schedule(self) -> RoundPlan:
        """Admit what fits, then plan one round: a decode token per decoding lane and whole prefill chunks up to the
        round's prefill budget (shortest remaining prefill first within a priority class)."""
        self._admit()
        items = [PlanItem(s, s.computed, [s.output[-1]], "last", True)
                 for s in self.running if s.state is SeqState.DECODE]
        restores = [s.restore for s in self.running if s.restore is not None]
        budget = self.round_prefill_tokens
        prefills = sorted((s for s in self.running if s.state is SeqState.PREFILL),
                          key=lambda s: (s.req.priority is not Priority.INTERACTIVE,
                                         len(s.req.prompt_ids) - s.computed, s.req.arrival))
        prefills = self._first_token_round(prefills)
        for s in prefills:
            pos = s.computed
            n = len(s.req.prompt_ids)
            while pos < n:
                end = s.plan.chunk_end(pos)
                if end - pos > budget:
                    break
                budget -= end - pos
                last = end == n
                want = "all" if s.req.prompt_logprobs is not None else ("last" if last else "none")
                cap = self._reserve_capture(s, end)
                items.append(PlanItem(s, pos, s.req.prompt_ids[pos:end], want, last, cap))
                pos = end
                if cap is not None:
                    break      # the image is taken at `end`: this sequence runs no further chunk this round
            if budget <= 0:
                break
        return RoundPlan(items, restores)

    def _finishes_now(self, s: Sequence, budget: int) -> bool:
        """Whether `s`'s whole remaining prefill fits in `budget` tokens with no capture point left to stop at."""
        rest = len(s.req.prompt_ids) - s.computed
        if rest > budget:
            return False
        return not (self._capturing(s) and any(c.pos > s.computed for c in s.plan.captures))

    def _first_token_round(self, prefills: list[Sequence]) -> list[Sequence]:
        """The prefills this round runs (head-of-line blocking, DESIGN §6 server.round_prefill_tokens).

        A round in which a prefill ends (its request gets its first token) runs only the prefills that end in it, so
        a short request that arrives while a long prompt is being prefilled waits for at most the round in flight
        plus a round of its own size, not a full-budget round. The long prefill loses that round, never two in a
        row (the next round gives it the budget again), so a stream of short arrivals slows it by at most half."""
        if self._held_long:
            self._held_long = False
            return prefills
        budget = self.round_prefill_tokens
        ending = []
        for s in prefills:
            if self._finishes_now(s, budget):
                ending.append(s)
                budget -= len(s.req.prompt_ids) - s.computed
        if ending and len(ending) < len(prefills):
            self._held_long = True
            return ending
        return prefills

    def update(self, plan: RoundPlan, results: list[ItemResult]) -> list:
        """Fold the runner's results into the sequences; returns TokenEvent / DoneEvent objects in order."""
        events: list = []
        now = time.monotonic()
        store = self.cache.retained
        for rs in plan.restores:
            if rs.seq.restore is rs:
                rs.seq.restore = None
                store.touch(rs.state_id)
                store.unpin(rs.state_id)
        for item, res in zip(plan.items, results):
            s = item.seq
            cap = item.capture
            if cap is not None and cap.ticket in s.tickets:
                s.tickets.remove(cap.ticket)
                if s.state is SeqState.FINISHED:
                    self.cache.abort_capture(cap.ticket)
                else:
                    self.cache.commit_capture(cap.ticket, s.pages)
                    if self.metrics is not None:
                        self.metrics.reuse_captures.labels(kind=cap.kind).inc()
            if s.state is SeqState.FINISHED:
                continue
            s.computed = item.start + len(item.token_ids)
            if s.state is SeqState.PREFILL:
                s.prefilled += len(item.token_ids)
                if res.prompt_logprobs and s.prompt_logprobs is not None:
                    s.prompt_logprobs.extend(res.prompt_logprobs)
            if not item.sample:
                continue
            if s.state is SeqState.PREFILL:
                s.state = SeqState.DECODE
                s.first_token_at = now
            tok = res.token_id
            s.output.append(tok)
            sp = s.req.sampling
            if tok in sp.stop_token_ids:
                events.append(self._finish(s, FinishReason.STOP, now))
                continue
            events.append(TokenEvent(s.rid, tok, res.logprob, res.top))
            if len(s.output) >= sp.max_tokens:
                events.append(self._finish(s, FinishReason.LENGTH, now))
        return events

    def _finish(self, s: Sequence, reason: FinishReason, now: float | None = None) -> DoneEvent:
        now = now or time.monotonic()
        if s in self.running:
            self.running.remove(s)
        for t in s.tickets:          # captures of a round that never completed
            self.cache.abort_capture(t)
        s.tickets = []
        if s.restore is not None:    # a restore that never ran
            self.cache.retained.unpin(s.restore.state_id)
            s.restore = None
        self.cache.release(s.rid)
        s.pages, s.slot = [], None
        s.state = SeqState.FINISHED
        arrival = s.req.arrival
        admitted = s.admitted_at or now
        first = s.first_token_at
        prefill_s = (first - admitted) if first else 0.0
        decode_s = (now - first) if first else 0.0
        gen = len(s.output)
        return DoneEvent(
            rid=s.rid, finish_reason=reason, prompt_tokens=len(s.req.prompt_ids),
            cached_tokens=len(s.req.prompt_ids) - s.prefilled if first else 0,
            prefilled_tokens=s.prefilled, generated_tokens=gen,
            queue_ms=(admitted - arrival) * 1e3, ttft_ms=((first - arrival) * 1e3) if first else 0.0,
            prefill_tokens_per_s=(s.prefilled / prefill_s) if prefill_s > 0 else 0.0,
            decode_tokens_per_s=((gen - 1) / decode_s) if decode_s > 0 and gen > 1 else 0.0,
            prompt_logprobs=s.prompt_logprobs, reuse=s.reuse)

    # ---- introspection ----
    def idle(self) -> bool:
        """No request is waiting or running."""
        return not self.waiting and not self.running

    def counts(self) -> dict:
        """Lane and queue counts for status and metrics."""
        return {
            "total": self.lanes,
            "prefill": sum(1 for s in self.running if s.state is SeqState.PREFILL),
            "decode": sum(1 for s in self.running if s.state is SeqState.DECODE),
            "evicted": 0,
            "waiting": len(self.waiting),
        }

    def requests(self) -> list[dict]:
        """The `status` op's per-request rows: id, state, prompt_tokens, cached_tokens (restored), prefilled (prompt
        tokens run through the model so far: the prefill's progress) and generated (tokens)."""
        rows = [{"id": s.rid, "state": s.state.value, "prompt_tokens": len(s.req.prompt_ids),
                 "cached_tokens": s.resume, "prefilled": s.prefilled, "generated": len(s.output)}
                for s in self.running]
        rows += [{"id": s.rid, "state": s.state.value, "prompt_tokens": len(s.req.prompt_ids),
                  "cached_tokens": 0, "prefilled": 0, "generated": 0} for s in self.waiting]
        return rows
