"""The one vocabulary of the daemon: page size, reuse kinds, tiers, priorities, retained-slot pools (DESIGN §4, §5).

†: imports no torch. The wire literals (kinds, tiers, priorities, reuse reasons) are the protocol's own, defined once
in ``ignis_client.wire`` (DESIGN §5: "these tier and kind literals are used everywhere: replies, status, the done log
line, metric labels"); this module names them for the daemon's modules and adds what only the daemon uses.
"""
from __future__ import annotations

from ignis_client.wire import KINDS, PRIORITIES, REUSE_REASONS, TIERS

PAGE_TOKENS = 64
"""Tokens per KV page (DESIGN §4.1)."""

SLOT_TIERS = ("device", "host")
"""The retained state-image slot pools reserved at load (DESIGN §4.4: ``reuse.device_slots`` on the device,
``reuse.host_slots_per_lane`` in one pinned host block)."""

LIVE = "live"
"""The KV-disk record kind of an evicted live sequence (DESIGN §4.5): never matched by a lookup, never a wire kind,
and removed by the scan at start (a live sequence does not outlive the process)."""

PREFIX, CHECKPOINT = KINDS
DEVICE, RAM, DISK = TIERS
INTERACTIVE, AGENT = PRIORITIES

__all__ = ["PAGE_TOKENS", "KINDS", "TIERS", "SLOT_TIERS", "PRIORITIES", "REUSE_REASONS", "PREFIX", "CHECKPOINT",
           "DEVICE", "RAM", "DISK", "INTERACTIVE", "AGENT", "LIVE"]
