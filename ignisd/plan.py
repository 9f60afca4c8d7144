"""Plan and sequence records of the scheduler: what a round runs and each request's live state (DESIGN §2, §4.1).

†: imports no torch. `Sequence` is a request's live state in the scheduler; a `RoundPlan` lists the round's
`RestoreOp`s and `PlanItem`s (each optionally carrying a `CaptureOp`); the runner answers with one `ItemResult` per
item. `AdmissionError` and `QueueFull` are the refusals of ``Scheduler.submit``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ignisd.request import Request, ReuseInfo
from ignisd.text.segments import TraversalPlan


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
    resume: int = 0                    # tokens restored from a retained state (0: cold)
    plan: TraversalPlan | None = None  # traversals and captures, set at admission
    restore: "RestoreOp | None" = None  # pending until the round carrying it has run
    tickets: list = field(default_factory=list)   # captures reserved for the round in flight
    reuse: ReuseInfo = field(default_factory=ReuseInfo)

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def bound_tokens(self) -> int:
        """prompt + max_tokens: what admission reserves."""
        return len(self.req.prompt_ids) + self.req.sampling.max_tokens


@dataclass
class RestoreOp:
    """Resume `seq` from retained state `state_id` before the round's passes: copy page `src_page` (the state's
    partial last page) into `dst_page` (the sequence's own page) when not None, and the image in retained slot
    (`slot_tier`, `slot`) into the sequence's live slot when `slot` is not None."""

    seq: Sequence
    state_id: str
    src_page: int | None
    dst_page: int | None
    slot_tier: str | None
    slot: int | None


@dataclass
class CaptureOp:
    """After the pass holding its item: copy the live image into retained slot (`slot_tier`, `slot`) when `slot` is
    not None, and the sequence's page `src_page` (its partial page at `pos`) into `copy_page` when not None."""

    ticket: object
    pos: int
    kind: str
    slot_tier: str | None
    slot: int | None
    src_page: int | None
    copy_page: int | None


@dataclass
class PlanItem:
    """One forward slice of one sequence: `token_ids` at positions [start, start+len).

    logits: "last" | "all" (prompt_logprobs) | "none". sample: draw the next token from the last row.
    capture: a CaptureOp to run after this item's pass, or None.
    """

    seq: Sequence
    start: int
    token_ids: list[int]
    logits: str
    sample: bool
    capture: CaptureOp | None = None


@dataclass
class RoundPlan:
    """What one round runs: `restores` first, then `items` in order (decode lanes first, then prefill chunks)."""

    items: list[PlanItem]
    restores: list[RestoreOp] = field(default_factory=list)

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
