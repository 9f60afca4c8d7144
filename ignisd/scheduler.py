"""The decode-round scheduler: queues, ranking, admission against the cache manager, chunk plan (DESIGN §2, §4.1).

†: imports no torch. Every round `schedule()` admits waiting requests whose whole bound (prompt + max_tokens pages)
can be reserved, gives every decoding lane one token, and fills the round's prefill budget with whole prefill
chunks; `update()` folds the runner's result back and returns the events for the server.

Chunking: chunk k of a prompt is [kC, min(n, (k+1)C)) with C = min(server.prefill_chunk, server.round_prefill_tokens),
so the same prompt is always split the same way whatever else is running. A round may run several chunks of one
sequence; they go to the runner in order and each sees the K/V of the ones before it.
"""
from __future__ import annotations

import enum
import time
from collections import deque
from dataclasses import dataclass, field

from ignisd.cache.manager import CacheManager
from ignisd.request import (
    DoneEvent,
    ErrorEvent,
    FinishReason,
    Priority,
    Request,
    TokenEvent,
)


class SeqState(enum.Enum):
    """Where a sequence is: waiting for a lane, prefilling its prompt, decoding, or finished."""

    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


@dataclass
class Sequence:
    """A request's live state in the scheduler. Token counts are tokens; times are time.monotonic() seconds."""

    req: Request
    state: SeqState = SeqState.WAITING
    pages: list[int] = field(default_factory=list)
    slot: int | None = None            # live state slot (hybrid models)
    computed: int = 0                  # tokens whose K/V are in the pool
    output: list[int] = field(default_factory=list)
    prompt_logprobs: list | None = None
    admitted_at: float | None = None
    first_token_at: float | None = None
    prefilled: int = 0

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def bound_tokens(self) -> int:
        """prompt + max_tokens: what admission reserves."""
        return len(self.req.prompt_ids) + self.req.sampling.max_tokens


@dataclass
class PlanItem:
    """One forward slice of one sequence: `token_ids` at positions [start, start+len).

    logits: "last" | "all" (prompt_logprobs) | "none". sample: draw the next token from the last row.
    """

    seq: Sequence
    start: int
    token_ids: list[int]
    logits: str
    sample: bool


@dataclass
class RoundPlan:
    """What one round runs: `items` in order (decode lanes first, then prefill chunks)."""

    items: list[PlanItem]

    @property
    def prefill_tokens(self) -> int:
        return sum(len(i.token_ids) for i in self.items if i.seq.state is SeqState.PREFILL)

    @property
    def decode_tokens(self) -> int:
        return sum(1 for i in self.items if i.seq.state is SeqState.DECODE)


@dataclass
class ItemResult:
    """The runner's answer for one PlanItem: the sampled token (when sample) with its logprob info, and for
    logits == "all" the prompt-logprob entries of the tokens this chunk predicts (dicts of DESIGN §5)."""

    token_id: int | None = None
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None
    prompt_logprobs: list | None = None


class AdmissionError(Exception):
    """A request that can never run (context or pool too small); code/field are wire error fields."""

    def __init__(self, code: str, message: str, field: str | None):
        super().__init__(message)
        self.code, self.message, self.field = code, message, field


class QueueFull(Exception):
    """server.max_queue requests are already waiting (wire code `busy`)."""


class Scheduler:
    """Queues and lanes over one CacheManager.

    lanes: decode lanes (server.lanes). context_tokens: cap on prompt + generation. prefill_chunk and
    round_prefill_tokens: tokens (DESIGN §6). max_queue: waiting requests before `busy`.
    """

    def __init__(self, cache: CacheManager, *, lanes: int, context_tokens: int, prefill_chunk: int,
                 round_prefill_tokens: int, max_queue: int):
        self.cache = cache
        self.lanes = lanes
        self.context_tokens = context_tokens
        self.chunk = max(1, min(prefill_chunk, round_prefill_tokens))
        self.round_prefill_tokens = round_prefill_tokens
        self.max_queue = max_queue
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.finished_events: list = []

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
            got = self.cache.reserve(s.rid, s.bound_tokens)
            if got is None:
                break  # strict rank order: a later request never overtakes one that is waiting for pages
            self.waiting.remove(s)
            s.pages, s.slot = got
            s.state = SeqState.PREFILL
            s.admitted_at = time.monotonic()
            if s.req.prompt_logprobs is not None:
                s.prompt_logprobs = [None]
            self.running.append(s)

    def schedule(self) -> RoundPlan:
        """Admit what fits, then plan one round: a decode token per decoding lane and whole prefill chunks up to the
        round's prefill budget (shortest remaining prefill first within a priority class)."""
        self._admit()
        items = [PlanItem(s, s.computed, [s.output[-1]], "last", True)
                 for s in self.running if s.state is SeqState.DECODE]
        budget = self.round_prefill_tokens
        prefills = sorted((s for s in self.running if s.state is SeqState.PREFILL),
                          key=lambda s: (s.req.priority is not Priority.INTERACTIVE,
                                         len(s.req.prompt_ids) - s.computed, s.req.arrival))
        for s in prefills:
            pos = s.computed
            n = len(s.req.prompt_ids)
            while pos < n:
                end = min(n, (pos // self.chunk + 1) * self.chunk)
                if end - pos > budget:
                    break
                budget -= end - pos
                last = end == n
                want = "all" if s.req.prompt_logprobs is not None else ("last" if last else "none")
                items.append(PlanItem(s, pos, s.req.prompt_ids[pos:end], want, last))
                pos = end
            if budget <= 0:
                break
        return RoundPlan(items)

    def update(self, plan: RoundPlan, results: list[ItemResult]) -> list:
        """Fold the runner's results into the sequences; returns TokenEvent / DoneEvent objects in order."""
        events: list = []
        now = time.monotonic()
        for item, res in zip(plan.items, results):
            s = item.seq
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
            prompt_logprobs=s.prompt_logprobs)

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
        """The `status` op's per-request rows."""
        rows = [{"id": s.rid, "state": s.state.value, "prompt_tokens": len(s.req.prompt_ids),
                 "cached_tokens": 0, "generated": len(s.output)} for s in self.running]
        rows += [{"id": s.rid, "state": s.state.value, "prompt_tokens": len(s.req.prompt_ids),
                  "cached_tokens": 0, "generated": 0} for s in self.waiting]
        return rows
