"""Placement: where one state's bytes are, per tier (DESIGN §4.5). †: imports no torch.

A retained state (and, once tiers arrive, an evicted live sequence) records its tier and, for that tier, where its
KV bytes lie: device pages of the KV pool, extents of the KV-RAM arena, or a KV-disk file; plus the retained slot
that holds its state image. Only the device tier exists today, so ``extents`` and ``disk_file`` stay empty; the
record has room for them so the tier code only fills them in. The cache manager owns the pools these ids refer to
and is the only object that takes or drops references on them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ignisd.vocab import DEVICE, SLOT_TIERS, TIERS


@dataclass
class Placement:
    """Where one state's bytes are.

    tier: "device" | "ram" | "disk". pages: KV-pool page ids in position order (tier "device"; the holder owns one
    reference on each). extents: [(offset, bytes)] in the KV-RAM arena (tier "ram"). disk_file: the key (file name
    stem) of its KV-disk file (tier "disk"). disk_bytes: that file's size (reserved before it is written). slot_tier
    / slot: the retained image slot ("device" | "host", id), or None when the state has no image in a slot (an
    all-attention model, or a state whose image travels with its bytes: on KV-disk, in its KV-RAM extent, or an
    evicted live sequence). image_in_extent: tier "ram" only: its image lies in its extent after the pages (a
    retained state that gave up its slot on the way down, cache/tiers.py). payload: the state's bytes in memory
    (pages layout, then the image) while its KV-disk file is being written or after it was read back for a
    restore. in_flight: its bytes are being copied out (the round that produces them has not run, or the file is
    not written yet): it can be restored from ``payload`` once that is set, but not moved again. Raises ValueError
    for an unknown tier or slot tier.
    """

    tier: str = DEVICE
    pages: list[int] = field(default_factory=list)
    extents: list[tuple[int, int]] = field(default_factory=list)
    disk_file: str | None = None
    disk_bytes: int = 0
    slot_tier: str | None = None
    slot: int | None = None
    payload: bytes | None = None
    in_flight: bool = False
    image_in_extent: bool = False

    def __post_init__(self) -> None:
        if self.tier not in TIERS:
            raise ValueError(f"tier {self.tier!r} not one of {TIERS}")
        if self.slot_tier is not None and self.slot_tier not in SLOT_TIERS:
            raise ValueError(f"slot tier {self.slot_tier!r} not one of {SLOT_TIERS}")

    @property
    def holds_nothing(self) -> bool:
        """No pages, extents, file or slot are held (what a state is after its bytes were released)."""
        return not self.pages and not self.extents and self.disk_file is None and self.slot is None
