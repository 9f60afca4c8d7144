"""The chunk plan of a prefill: traversals between cut points, capture points and chunk boundaries (DESIGN §4.3).

†: imports no torch. Prefill runs ``[resume, publish)`` → capture a retained prefix, ``[publish, opener)`` → capture a
prompt checkpoint, ``[opener, end)`` → decode. Chunks restart at every cut point: chunk k of traversal [a, b) is
[a + kC, min(b, a + (k+1)C)), so a cold run and a resumed run split the shared prefix identically. Positions are
token indices. Used by the scheduler (the cut points themselves come from ``text/segments.py`` at the edge).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ignisd.vocab import CHECKPOINT, PAGE_TOKENS, PREFIX

SKIP_NONE = "none"                    # no such point (publish 0, opener None)
SKIP_RESUMED_PAST = "resumed_past"    # the request resumed at or past it
SKIP_TOO_CLOSE = "too_close"          # less than min_gap past the previous capture or the resume point
SKIP_AT_END = "at_end"                # at or past the end of the prompt


@dataclass(frozen=True)
class Capture:
    """Capture a retained state of ``kind`` after the prefill of tokens [0, pos)."""

    pos: int
    kind: str


@dataclass(frozen=True)
class Skipped:
    """A cut point that is not captured, and why (one of the SKIP_* strings)."""

    pos: int | None
    kind: str
    why: str


@dataclass(frozen=True)
class TraversalPlan:
    """How a prompt of ``end`` tokens resumed at ``resume`` is prefilled (DESIGN §4.3).

    traversals: consecutive [a, b) ranges covering [resume, end), split at each capture. captures: in position
    order. skipped: cut points not captured. chunk_tokens: C; chunk k of [a, b) is [a + kC, min(b, a + (k+1)C)).
    """

    resume: int
    end: int
    chunk_tokens: int
    captures: tuple[Capture, ...]
    skipped: tuple[Skipped, ...]
    traversals: tuple[tuple[int, int], ...] = field(default=())

    def chunks(self) -> list[tuple[int, int]]:
        """Every prefill chunk [a, b) in order."""
        c = self.chunk_tokens
        return [(x, min(b, x + c)) for a, b in self.traversals for x in range(a, b, c)]

    def chunk_end(self, pos: int) -> int:
        """End of the chunk that starts at token ``pos`` (``pos`` must be a chunk start). Raises ValueError."""
        for a, b in self.traversals:
            if a <= pos < b:
                if (pos - a) % self.chunk_tokens:
                    raise ValueError(f"{pos} is not a chunk start of traversal [{a}, {b})")
                return min(b, pos + self.chunk_tokens)
        raise ValueError(f"{pos} is outside [{self.resume}, {self.end})")

    def captures_in(self, start: int, end: int) -> list[Capture]:
        """The captures taken by the chunk [start, end): those whose position p has start < p <= end. With split
        traversals that is at most the capture at ``end``."""
        return [c for c in self.captures if start < c.pos <= end]

    def capture_at(self, pos: int) -> Capture | None:
        """The capture taken once tokens [0, pos) are prefilled, or None."""
        return next((c for c in self.captures if c.pos == pos), None)


def plan_traversals(resume: int, publish: int | None, opener: int | None, n: int, *, chunk_tokens: int,
                    page_tokens: int = PAGE_TOKENS, min_gap: int | None = None, split: bool = True) -> TraversalPlan:
    """Capture points and prefill traversals of a prompt of ``n`` tokens resumed at ``resume`` (0 = cold).

    publish (→ a retained "prefix") and opener (→ a "checkpoint") are the cut points (0/None: none). A point is
    skipped when the request resumed at or past it, when it is less than ``min_gap`` (default one page) past the
    previous capture or the resume point, or when it is at or past ``n`` (the last traversal must hold the tokens
    whose logits are sampled). Raises ValueError unless 0 <= resume < n and chunk_tokens >= 1.

    split=False is the attention-only rule in an exact format (DESIGN §4.3): a capture needs no traversal of its
    own, so [resume, n) is one traversal whatever the captures, and a point is kept whenever it lies past the
    previous one (min_gap 1 unless given): every opener leaves its checkpoint. A point under one page is skipped
    in both modes (too_close).
    """
    if not 0 <= resume < n:
        raise ValueError(f"resume {resume} outside [0, {n})")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    gap = (page_tokens if split else 1) if min_gap is None else min_gap
    captures: list[Capture] = []
    skipped: list[Skipped] = []
    prev = resume
    for pos, kind in ((publish, PREFIX), (opener, CHECKPOINT)):
        if pos is None or pos <= 0:
            skipped.append(Skipped(pos, kind, SKIP_NONE))
        elif pos <= resume:
            skipped.append(Skipped(pos, kind, SKIP_RESUMED_PAST))
        elif pos >= n:
            skipped.append(Skipped(pos, kind, SKIP_AT_END))
        elif pos - prev < gap or pos < page_tokens:
            skipped.append(Skipped(pos, kind, SKIP_TOO_CLOSE))
        else:
            captures.append(Capture(pos, kind))
            prev = pos
    cuts = [resume] + ([c.pos for c in captures] if split else []) + [n]
    traversals = tuple((cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1))
    return TraversalPlan(resume, n, chunk_tokens, tuple(captures), tuple(skipped), traversals)
