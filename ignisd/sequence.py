"""A request's live state in the scheduler, and the scheduler's refusals (DESIGN §2, §4.1). †: imports no torch.

`Sequence` never leaves the engine coroutine: the round plan the worker thread sees carries plain values
(``ignisd/plan.py``). `AdmissionError` and `QueueFull` are the refusals of ``Scheduler.submit``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ignisd.plan import RestoreOp
from ignisd.request import Request, ReuseInfo
from ignisd.traversal import TraversalPlan


class SeqState(enum.Enum):
    """Where a sequence is: waiting for a lane, prefilling its prompt, decoding, or finished."""

    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    FINISHED = "finished"


@dataclass
class Sequence:
    """A request's live state in the scheduler. Token counts are tokens; times are time.monotonic() seconds.

    pages / slot: what the cache manager reserved at admission (KV pages for the whole bound in position order;
    the live state slot or None). computed: tokens whose K/V are in the pool. resume: tokens restored from a
    retained state (0: cold). plan: traversals and captures, set at admission. restore: the RestoreOp pending until
    the round carrying it has run. reuse: what the reply's ``ignis.reuse`` reports. evicting / evicted /
    resume_state / recompute: live eviction (ignisd/eviction.py).
    """

    req: Request
    state: SeqState = SeqState.WAITING
    pages: list[int] = field(default_factory=list)
    slot: int | None = None
    computed: int = 0
    output: list[int] = field(default_factory=list)
    prompt_logprobs: list | None = None
    admitted_at: float | None = None
    first_token_at: float | None = None
    prefilled: int = 0
    resume: int = 0
    plan: TraversalPlan | None = None
    restore: RestoreOp | None = None
    reuse: ReuseInfo = field(default_factory=ReuseInfo)
    evicting: bool = False             # being moved down a window a round (not scheduled meanwhile)
    evicted: bool = False              # its bytes are in KV-RAM: waiting to be admitted again
    resume_state: SeqState | None = None  # the state it continues in once restored
    recompute: bool = False            # re-queued to prefill prompt + generated (its KV was not kept)

    @property
    def prefill_ids(self) -> list[int]:
        """The tokens its prefill covers: the prompt, or when recomputing the prompt and every generated token but
        the last (which is the next decode step's input)."""
        if self.recompute and self.output:
            return self.req.prompt_ids + self.output[:-1]
        return self.req.prompt_ids

    @property
    def rid(self) -> str:
        """The request's engine-wide id."""
        return self.req.rid

    @property
    def bound_tokens(self) -> int:
        """prompt + max_tokens: what admission reserves."""
        return len(self.req.prompt_ids) + self.req.sampling.max_tokens


class AdmissionError(Exception):
    """A request that can never run (context or pool too small); code/field are wire error fields."""

    def __init__(self, code: str, message: str, field: str | None):
        super().__init__(message)
        self.code, self.message, self.field = code, message, field


class QueueFull(Exception):
    """server.max_queue requests are already waiting (wire code `busy`)."""
