"""The records of the retained-state store (DESIGN §4.4): what a retained state is and the answers the store gives.

†: imports no torch. ``Stamp`` (what a state was computed by), ``RetainedState`` (one retained prefix or prompt
checkpoint), and the answers of ``RetainedStore``: ``CaptureTicket`` (``reserve_capture``), ``CommitResult``
(``commit``) and ``LookupResult`` (``lookup``); with the kind / tier / priority vocabularies and the refusal and
miss reasons. The store itself, its ranking and the ownership rules are in ``cache/retained.py``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ignisd.cache.placement import Placement
from ignisd.cache.prefix_index import Candidate, ImageSpan
from ignisd.vocab import PRIORITIES

DEFAULT_INTERACTIVE_TTL = 300.0

# ReserveResult.refused / LookupResult.reason values
REFUSED_NO_SLOT = "no_slot"
REFUSED_DUPLICATE = "duplicate"
REASON_MISS = "miss"
REASON_STAMP = "stamp_mismatch"


def _priority(p) -> str:
    p = getattr(p, "value", p)          # ignisd.request.Priority is a str enum
    if p not in PRIORITIES:
        raise ValueError(f"priority {p!r} not one of {PRIORITIES}")
    return p


@dataclass(frozen=True)
class Stamp:
    """What a retained state was computed by: the model's structural hash, the KV format, the drafter ("none")."""

    structural_hash: str
    kv_format: str
    drafter: str = "none"


@dataclass
class RetainedState:
    """One retained prefix or prompt checkpoint.

    id: the store's key ("ret-N"). kind: "prefix" | "checkpoint". tokens: the token ids it covers (its position is
    len(tokens)). image_spans: [(start, end, sha256 hex)] of the images in them. placement: where its bytes are
    (tier, device pages in position order — pages_for(len(tokens)) of them while on the device, never written —
    and its retained image slot, None on an all-attention model). priority: "interactive" | "agent". created,
    last_use: clock seconds. stamp: see Stamp. after_user: a checkpoint taken right after a real user message.
    superseded: a newer checkpoint of the same conversation replaced it as one of the two it keeps ranked high; it
    stays (a fork, an edit or a regeneration still resumes at it) but ranks below every state that is not
    superseded (DESIGN §4.4). pins: lookups restoring from it (a pinned state is never dropped). doomed: dropped
    while pinned: out of the index, freed at the last unpin. whole: a finished request's whole sequence (attention-only,
    exact format, DESIGN §4.3): superseded from the start, and dropped rather than moved down a tier.
    """

    id: str
    kind: str
    tokens: tuple[int, ...]
    image_spans: tuple[ImageSpan, ...]
    placement: Placement
    priority: str
    created: float
    last_use: float
    stamp: Stamp
    after_user: bool = False
    superseded: bool = False
    pins: int = 0
    doomed: bool = False
    whole: bool = False

    @property
    def n_tokens(self) -> int:
        """Its position: the number of tokens it covers."""
        return len(self.tokens)

    @property
    def image_digests(self) -> tuple[str, ...]:
        """The SHA-256 digests of its images, in position order."""
        return tuple(d for _, _, d in self.image_spans)

    @property
    def tier(self) -> str:
        """Where its KV bytes are: placement.tier."""
        return self.placement.tier

    @property
    def pages(self) -> list[int]:
        """Its device pages (placement.pages)."""
        return self.placement.pages

    @property
    def slot(self) -> int | None:
        """Its retained image slot id (placement.slot)."""
        return self.placement.slot

    @property
    def slot_tier(self) -> str | None:
        """The retained-slot pool of its image, "device" | "host" (placement.slot_tier)."""
        return self.placement.slot_tier


@dataclass
class CaptureTicket:
    """The answer of ``reserve_capture``. refused: None, "no_slot" or "duplicate" (then nothing is held and the
    ticket needs neither commit nor abort). slot / slot_tier: the retained slot the runner copies the image into.
    dropped: ids of the states dropped to free that slot. whole: a finished request's whole sequence (committed
    superseded: ranked lowest, supersedes nothing)."""

    id: str
    kind: str
    tokens: tuple[int, ...]
    image_spans: tuple[ImageSpan, ...]
    priority: str
    after_user: bool
    stamp: Stamp
    slot: int | None = None
    slot_tier: str | None = None
    refused: str | None = None
    dropped: list[str] = field(default_factory=list)
    whole: bool = False

    @property
    def ok(self) -> bool:
        return self.refused is None


@dataclass
class CommitResult:
    """The answer of ``commit``: the state now retained (an older identical one when ``duplicate``), and the ids of
    the older checkpoints of its conversation that the conversation rule marked superseded (kept, ranked lowest)."""

    state: RetainedState
    duplicate: bool = False
    superseded: list[str] = field(default_factory=list)


@dataclass
class LookupResult:
    """The answer of ``lookup``.

    state: the matched state (pinned when the lookup pinned) or None. matched_tokens: its length (0 on a miss).
    reason: None on a hit, else "miss" or "stamp_mismatch" (the only matches had another stamp; none was touched).
    candidate: the state sharing the longest common prefix with the prompt without being a prefix of it — on a miss
    whatever it shares (0 tokens included), on a hit only when it shares more than the match — else None
    (``ignis.reuse.best_candidate`` / ``diverged_at``). candidate_state: its RetainedState.
    """

    state: RetainedState | None
    matched_tokens: int
    reason: str | None
    candidate: Candidate | None = None
    candidate_state: RetainedState | None = None
