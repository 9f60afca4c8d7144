"""The round plan: what one round runs, as plain values (DESIGN §2). †: imports no torch.

The scheduler builds a `RoundPlan` and the runner executes it in the forward worker thread, so every record here is
a frozen value — sequence ids, positions, token ids, page ids, slots, sampling parameters — and never a live
scheduler object: the worker cannot see (or race with) the scheduler's state. A plan lists the tier moves that a
transfer step runs first (none until tiers exist), then `RestoreOp`s, then `PlanItem`s in order, each optionally
carrying a `CaptureOp` run after its pass. The runner answers with one `ItemResult` per item.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ignisd.request import SamplingParams

PREFILL, DECODE = "prefill", "decode"
LOGITS_MODES = ("last", "all", "none")


MOVE_TO_RAM, MOVE_TO_BYTES, MOVE_TO_STAGE = "to_ram", "to_bytes", "to_stage"


@dataclass(frozen=True)
class TierMove:
    """Copy one state's bytes out of its tier before the round's passes (DESIGN §4.5: moves run first, so pages and
    slots that the same plan hands to others are read before anything writes them).

    op: "to_ram" (write into the KV-RAM arena at `dst_offset`) | "to_bytes" (return the bytes to the engine, which
    writes the KV-disk file off the round path) | "to_stage" (one window of a live sequence bound for KV-disk:
    write at byte `dst_offset` of its staging buffer of `nbytes` bytes, which the runner keeps across rounds; the
    move that fills its last byte returns the whole buffer to the engine as a "to_bytes" move would). state_id: the
    retained state or live sequence moved. Source, in the pages layout of cache/transfer.py: device `pages`, or
    `nbytes` of the arena at `src_offset` (not for "to_stage"); then, when `image_slot` is set, the image of that
    slot appended: ("live" | "device" | "host", slot id).
    """

    op: str
    state_id: str
    pages: tuple[int, ...] = ()
    src_offset: int | None = None
    nbytes: int = 0
    image_slot: tuple[str, int] | None = None
    dst_offset: int | None = None


@dataclass(frozen=True)
class RestoreOp:
    """Resume sequence `seq_id` from state `state_id` (a retained state or its own evicted image) before the round's
    passes. tier "device": copy page `src_page` (the state's partial last page) into `dst_page` when not None (its
    full pages are shared in place). tier "ram": write `dst_pages` from the arena bytes at `src_offset` (pages
    layout). tier "disk": write `dst_pages` from `payload` (the verified KV-disk file's pages + image bytes). Then the
    image: from retained slot (`slot_tier`, `slot`) when `slot` is not None, else from the bytes after the pages
    (arena or payload) when `image_after_pages`; into the sequence's live slot `dst_slot`."""

    seq_id: str
    state_id: str
    src_page: int | None
    dst_page: int | None
    slot_tier: str | None
    slot: int | None
    dst_slot: int | None
    tier: str = "device"
    dst_pages: tuple[int, ...] = ()
    src_offset: int | None = None
    payload: bytes | None = None
    image_after_pages: bool = False


@dataclass(frozen=True)
class CaptureOp:
    """After the pass holding its item: copy the live image of slot `src_slot` into retained slot (`slot_tier`,
    `slot`) when `slot` is not None, and the sequence's page `src_page` (its partial page at `pos`) into `copy_page`
    when not None. ticket_id: the cache manager's handle for commit / abort. pos: tokens covered. kind: "prefix" |
    "checkpoint"."""

    ticket_id: str
    seq_id: str
    pos: int
    kind: str
    slot_tier: str | None
    slot: int | None
    src_slot: int | None
    src_page: int | None
    copy_page: int | None


@dataclass(frozen=True)
class PlanItem:
    """One forward slice of one sequence: `token_ids` at positions [start, start + len).

    seq_id: the request's engine id. page_ids: the sequence's KV pages in position order (covering at least
    start + len tokens). slot: its live state slot (None when the model and format keep no per-sequence state).
    phase: "prefill" | "decode". logits: "last" | "all" (prompt_logprobs) | "none". sample: draw the next token from
    the last row with `sampling` (a per-request generator keyed by seq_id). prompt_logprobs: K of the request's
    prompt_logprobs (None: off); targets: for logits "all", the prompt token each row predicts (positions
    start+1 … start+len, at most the prompt's end). captures: the CaptureOps to run after this item's pass (at most one
    on a hybrid, at the item's end; on an attention-only model in an exact format any capture point the item covers).
    force: the token this item's sample must be (the request's next forced token, sampling.forced_token_ids), or None.
    generated: the tokens the sequence generated before this sample, when its sampling is penalized (else empty).
    """

    seq_id: str
    start: int
    token_ids: tuple[int, ...]
    page_ids: tuple[int, ...]
    slot: int | None
    phase: str
    logits: str
    sample: bool
    sampling: SamplingParams
    prompt_logprobs: int | None = None
    targets: tuple[int, ...] = ()
    captures: tuple[CaptureOp, ...] = ()
    force: int | None = None
    generated: tuple[int, ...] = ()


@dataclass(frozen=True)
class RoundPlan:
    """What one round runs: `moves` first (the transfer step), then `restores`, then `items` in order (decode lanes
    first, then prefill chunks)."""

    items: tuple[PlanItem, ...]
    restores: tuple[RestoreOp, ...] = ()
    moves: tuple[TierMove, ...] = ()

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens this round prefills."""
        return sum(len(i.token_ids) for i in self.items if i.phase == PREFILL)

    @property
    def decode_tokens(self) -> int:
        """Decode lanes this round steps (one token each)."""
        return sum(1 for i in self.items if i.phase == DECODE)

    @property
    def empty(self) -> bool:
        """Nothing to run."""
        return not self.items and not self.restores and not self.moves


@dataclass
class RoundResult:
    """The runner's answer for a plan: one ItemResult per item; for each "to_bytes" move the state's bytes (pages
    layout, then its image) by state id; and per tier the bytes its restores copied and the seconds they took."""

    items: list
    snapshots: dict[str, bytes] = field(default_factory=dict)
    restored: dict[str, tuple[int, float]] = field(default_factory=dict)


@dataclass
class ItemResult:
    """The runner's answer for one PlanItem: the sampled token (when sample) with its logprob info, and for
    logits == "all" the prompt-logprob entries of the tokens this chunk predicts (dicts of DESIGN §5)."""

    token_id: int | None = None
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None
    prompt_logprobs: list | None = field(default=None)
