"""The decode-round scheduler: queues, ranking, admission against the cache manager, chunk plan (DESIGN §2, §4.1).

†: imports no torch. Every round `schedule()` admits waiting requests whose whole bound (prompt + max_tokens pages)
can be reserved, gives every decoding lane one token, and fills the round's prefill budget with whole prefill
chunks; `update()` folds the runner's result back and returns the events for the server.

Chunking: the prompt is cut into traversals at its resume point and capture points (DESIGN §4.3,
``traversal.plan_traversals``); chunk k of traversal [a, b) is [a + kC, min(b, a + (k+1)C)) with
C = min(server.prefill_chunk, server.round_prefill_tokens), so the same prompt is always split the same way whatever
else is running. A round may run several chunks of one sequence; they go to the runner in order and each sees the
K/V of the ones before it.

Prompt reuse (DESIGN §4.1-§4.4): admission goes through the cache manager (the only cache object the scheduler
touches), which looks up the longest retained state whose tokens are a prefix of the prompt, shares its full pages
and returns the RestoreOp the next round runs first. A chunk that ends at a capture point carries a CaptureOp
(reserved through the manager; the runner copies the image and the partial page after that chunk's pass; the
manager commits it in ``update()``), and the sequence runs no further chunk that round. The round plan holds plain
values only (``ignisd/plan.py``): the worker thread never sees a `Sequence`.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import replace

from ignisd.cache.manager import CacheManager
from ignisd.eviction import BLOCKED, LOST, Evictions
from ignisd.log import get_logger
from ignisd.plan import DECODE, PREFILL, CaptureOp, ItemResult, PlanItem, RoundPlan
from ignisd.request import AdmittedEvent, DoneEvent, FinishReason, Priority, Request, TokenEvent, context_message
from ignisd.reuse_report import is_short, queued_reuse_info, reuse_info
from ignisd.sequence import AdmissionError, QueueFull, Sequence, SeqState
from ignisd.traversal import plan_traversals

log = get_logger("sched")


class Scheduler:
    """Queues and lanes over one CacheManager.

    lanes: decode lanes (server.lanes). context_tokens: cap on prompt + generation. prefill_chunk and
    round_prefill_tokens: tokens (DESIGN §6). max_queue: waiting requests before `busy`.
    """

    def __init__(self, cache: CacheManager, *, lanes: int, context_tokens: int, prefill_chunk: int,
                 round_prefill_tokens: int, max_queue: int, metrics=None, evict_window_pages: int = 16):
        self.cache = cache
        self.metrics = metrics
        self.lanes = lanes
        self.context_tokens = context_tokens
        self.chunk = max(1, min(prefill_chunk, round_prefill_tokens))
        self.round_prefill_tokens = round_prefill_tokens
        self.max_queue = max_queue
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.admitted: list[AdmittedEvent] = []   # since the engine last took them (take_admitted)
        self._held_long = False      # the last round ran only the prefills that ended in it
        self.evictions = Evictions(self, evict_window_pages)

    # ---- commands ----
    def check(self, req: Request) -> None:
        """Refuse a request that could never be admitted. Raises AdmissionError (context_length / bad_request)."""
        n = len(req.prompt_ids)
        if n == 0:
            raise AdmissionError("bad_request", "the prompt renders to no tokens", "prompt")
        bound = n + req.sampling.max_tokens
        if bound > self.context_tokens:
            raise AdmissionError("context_length", context_message(n, self.context_tokens, req.sampling.max_tokens),
                                 "max_tokens")
        need = self.cache.pages_for(bound)
        if need > self.cache.pool.total:
            raise AdmissionError(
                "context_length",
                f"input length and max_tokens exceed context limit of the KV pool: prompt + max_tokens needs {need} "
                f"KV pages but the pool has {self.cache.pool.total} "
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
                self.evictions.maybe_evict(s)
                break
            if s.evicted:
                got = self.evictions.admit(s)
                if got == BLOCKED:
                    break
                if got != LOST:
                    continue     # admitted, or its KV-disk file is being read back (it holds nothing meanwhile)
            req = s.req
            reuse = self._capturing(s)
            if reuse:
                ahead = self._pending_capture(s)
                if ahead and self.cache.peek(req.prompt_ids) < ahead:
                    continue   # a running prefill is about to retain a longer shared prefix: resume from it then
            adm = self.cache.admit(s.rid, req.prompt_ids, s.bound_tokens, reuse=reuse)
            if adm is None:
                self.evictions.maybe_evict(s)
                break  # strict rank order: a later request never overtakes one that is waiting for pages
            if adm.wait_for is not None:
                continue   # its match's KV-disk file is being read back: admitted once the bytes are in memory
            self.waiting.remove(s)
            s.pages, s.slot = list(adm.pages), adm.slot
            s.state = SeqState.PREFILL
            s.restore = adm.restore
            if s.recompute:            # its KV was not kept: prefill prompt + generated, no capture, no new reply
                s.computed = adm.resumed
                s.plan = plan_traversals(adm.resumed, 0, None, len(s.prefill_ids), chunk_tokens=self.chunk,
                                         page_tokens=self.cache.page_tokens)
                self.running.append(s)
                continue
            s.admitted_at = time.monotonic()
            if req.prompt_logprobs is not None:
                s.prompt_logprobs = [None]
            s.resume = s.computed = adm.resumed
            s.reuse = reuse_info(self.cache, req, adm.match)
            self.admitted.append(AdmittedEvent(s.rid, adm.resumed))
            s.plan = plan_traversals(adm.resumed, req.publish, req.opener, len(req.prompt_ids),
                                     chunk_tokens=self.chunk, page_tokens=self.cache.page_tokens,
                                     split=not self.cache.free_captures)
            m = self.metrics
            if m is not None and adm.match is not None:
                m.reuse_lookups.inc()
                if adm.match.state_id is not None:
                    m.reuse_hits.labels(kind=adm.match.kind, tier=adm.match.tier).inc()
                    m.reuse_tokens_restored.inc(adm.resumed)
            self.running.append(s)
            match = adm.match if adm.match is not None and adm.match.state_id is not None else None
            log.debug("admitted", id=req.client_id or req.rid, prompt=len(req.prompt_ids), resumed=adm.resumed,
                      tier=match.tier if match else None, kind=match.kind if match else None,
                      pages=len(s.pages), waited_ms=round((s.admitted_at - req.arrival) * 1000, 1),
                      running=len(self.running), waiting=len(self.waiting))

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
        return self.cache.reuse_enabled and s.req.cache_prompt and s.req.prompt_logprobs is None

    def _reserve_captures(self, s: Sequence, start: int, end: int) -> tuple[CaptureOp, ...]:
        """Reserve the captures of the chunk [start, end) of `s` (``TraversalPlan.captures_in``): one at `end` with
        split traversals, any the chunk covers on an attention-only model in an exact format."""
        if s.plan is None or not self._capturing(s):
            return ()
        out = []
        for c in s.plan.captures_in(start, end):
            got = self.cache.plan_capture(s.rid, c.kind, s.req.prompt_ids[:c.pos], priority=s.req.priority,
                                          after_user=c.kind == "checkpoint" and s.req.after_user)
            if isinstance(got, str):
                self._capture_skipped(s, got)
            else:
                out.append(got)
        return tuple(out)

    def _capture_skipped(self, s: Sequence, why: str) -> None:
        if self.metrics is not None:
            self.metrics.reuse_captures_skipped.labels(reason=why).inc()
        if why == "no_slot" and s.reuse is not None and s.reuse.reason == "miss":
            s.reuse = replace(s.reuse, reason="no_slot")

    def _item(self, s: Sequence, start: int, ids: list[int], logits: str, sample: bool,
              captures: tuple[CaptureOp, ...] = ()) -> PlanItem:
        """The plan value of one slice of `s` (token ids, pages and sampling copied out of the live sequence)."""
        req = s.req
        targets = ()
        if logits == "all":
            targets = tuple(req.prompt_ids[start + 1:start + len(ids) + 1])
        forced = req.sampling.forced_token_ids
        force = forced[len(s.output)] if sample and len(s.output) < len(forced) else None
        generated = tuple(s.output) if sample and req.sampling.penalized else ()
        return PlanItem(s.rid, start, tuple(ids), tuple(s.pages), s.slot,
                        PREFILL if s.state is SeqState.PREFILL else DECODE, logits, sample, req.sampling,
                        req.prompt_logprobs, targets, captures, force, generated)

    def take_admitted(self) -> list[AdmittedEvent]:
        """The AdmittedEvents of the requests given a lane since the last call (first admissions only: not a
        readmission after eviction, nor a recompute)."""
        out, self.admitted = self.admitted, []
        return out

    def schedule(self) -> RoundPlan:
        """Admit what fits, then plan one round: a decode token per decoding lane and whole prefill chunks up to the
        round's prefill budget (shortest remaining prefill first within a priority class)."""
        self.evictions.step()
        self._admit()
        items = [self._item(s, s.computed, [s.output[-1]], "last", True)
                 for s in self.running if s.state is SeqState.DECODE and not s.evicting]
        restores = tuple(s.restore for s in self.running if s.restore is not None)
        budget = self.round_prefill_tokens
        prefills = sorted((s for s in self.running if s.state is SeqState.PREFILL and not s.evicting),
                          key=lambda s: (s.req.priority is not Priority.INTERACTIVE,
                                         len(s.prefill_ids) - s.computed, s.req.arrival))
        prefills = self._first_token_round(prefills)
        for s in prefills:
            pos = s.computed
            ids = s.prefill_ids
            n = len(ids)
            while pos < n:
                end = s.plan.chunk_end(pos)
                if end - pos > budget:
                    break
                budget -= end - pos
                last = end == n and not s.recompute       # a recompute's next token is already known
                want = "all" if s.req.prompt_logprobs is not None else ("last" if last else "none")
                caps = self._reserve_captures(s, pos, end) if not s.recompute else ()
                items.append(self._item(s, pos, ids[pos:end], want, last, caps))
                pos = end
                if caps and not self.cache.free_captures:
                    break      # the image is taken at `end`: this sequence runs no further chunk this round
            if budget <= 0:
                break
        return RoundPlan(tuple(items), restores, tuple(self.cache.plan_moves()))

    def _finishes_now(self, s: Sequence, budget: int) -> bool:
        """Whether `s`'s whole remaining prefill fits in `budget` tokens with no capture point left to stop at."""
        rest = len(s.prefill_ids) - s.computed
        if rest > budget:
            return False
        return self.cache.free_captures or not (self._capturing(s) and any(c.pos > s.computed for c in s.plan.captures))

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
                budget -= len(s.prefill_ids) - s.computed
        if ending and len(ending) < len(prefills):
            self._held_long = True
            return ending
        return prefills

    def update(self, plan: RoundPlan, results: list[ItemResult]) -> list:
        """Fold the runner's results into the sequences; returns TokenEvent / DoneEvent objects in order."""
        events: list = []
        now = time.monotonic()
        commits = self.cache.finish_round(plan)
        if self.metrics is not None:
            for c in commits:
                if not c.duplicate:
                    self.metrics.reuse_captures.labels(kind=c.state.kind).inc()
        live = {s.rid: s for s in self.running}
        for rs in plan.restores:
            s = live.get(rs.seq_id)
            if s is not None and s.restore is rs:
                s.restore = None
        for item, res in zip(plan.items, results):
            s = live.get(item.seq_id)
            if s is None or s.state is SeqState.FINISHED:
                continue
            s.computed = item.start + len(item.token_ids)
            if s.state is SeqState.PREFILL:
                if s.recompute:
                    if s.computed == len(s.prefill_ids):   # caught up: decode on from its last generated token
                        s.state, s.recompute = SeqState.DECODE, False
                    continue
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
            cached = len(s.req.prompt_ids) - s.prefilled if len(s.output) == 1 else None
            events.append(TokenEvent(s.rid, tok, res.logprob, res.top, cached))
            if len(s.output) >= sp.max_tokens:
                events.append(self._finish(s, FinishReason.LENGTH, now))
        return events

    def fail_round(self, plan: RoundPlan) -> None:
        """The round of `plan` raised: abort its captures and unpin its restores (the engine then cancels the
        sequences that were in it)."""
        self.cache.finish_round(plan, failed=True)
        live = {s.rid: s for s in self.running}
        for rs in plan.restores:
            s = live.get(rs.seq_id)
            if s is not None and s.restore is rs:
                s.restore = None

    def _finish(self, s: Sequence, reason: FinishReason, now: float | None = None) -> DoneEvent:
        now = now or time.monotonic()
        if s in self.running:
            self._retain_sequence(s, reason)
            self.running.remove(s)
        elif s.admitted_at is None:    # ended while queued: it never looked anything up
            s.reuse = queued_reuse_info(self.cache, s.req)
        self.cache.release(s.rid)      # pages, slot, captures of a round that never completed, a restore not run
        s.restore = None
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

    def _retain_sequence(self, s: Sequence, reason: FinishReason) -> None:
        """On an attention-only model in an exact format, a request that ended by stop or length leaves its whole
        sequence (prompt + generated tokens whose K/V are in its pages) retained, ranked below its checkpoint
        (DESIGN §4.3): a continuation that sends the reply back byte for byte resumes past it."""
        if not (self.cache.free_captures and self._capturing(s) and reason in (FinishReason.STOP, FinishReason.LENGTH)
                and s.state is SeqState.DECODE and not (s.evicting or s.evicted or s.recompute)):
            return
        if s.computed <= len(s.req.prompt_ids) or is_short(self.cache, s.req):
            return                    # no generated token reached the pages: the prompt's own captures cover it
        tokens = (s.req.prompt_ids + s.output)[:s.computed]
        got = self.cache.retain_sequence(s.rid, tokens, priority=s.req.priority)
        if isinstance(got, str):
            if self.metrics is not None:
                self.metrics.reuse_captures_skipped.labels(reason=got).inc()
        elif self.metrics is not None and not got.duplicate:
            self.metrics.reuse_captures.labels(kind=got.state.kind).inc()

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
            "evicted": sum(1 for s in self.waiting if s.evicted) + sum(1 for s in self.running if s.evicting),
            "waiting": len(self.waiting),
        }

    def requests(self) -> list[dict]:
        """The `status` op's per-request rows: id (the engine's key), request_id (the id its log lines name:
        Request.client_id), state, prompt_tokens, cached_tokens (restored), prefilled (prompt tokens run through the
        model so far: the prefill's progress) and generated (tokens)."""
        def row(s: Sequence, running: bool) -> dict:
            return {"id": s.rid, "request_id": s.req.client_id or s.rid, "state": s.state.value,
                    "prompt_tokens": len(s.req.prompt_ids), "cached_tokens": s.resume if running else 0,
                    "prefilled": s.prefilled if running else 0, "generated": len(s.output) if running else 0}
        return [row(s, True) for s in self.running] + [row(s, False) for s in self.waiting]
