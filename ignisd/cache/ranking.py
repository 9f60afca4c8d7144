"""The ranking of retained states (DESIGN §4.4): which one goes first when a tier needs room. †: imports no torch.

Higher keeps longer: (current, class, last_use). current is 0 for a superseded checkpoint (a newer checkpoint of
its conversation exists), 1 otherwise; class is 1 for interactive, 0 for agent, and an interactive checkpoint idle
in KV-RAM for longer than the interactive TTL counts as agent; ties go to the least recently used. So superseded
checkpoints go first, then agent work, and a conversation's newest checkpoint is the last of it to go.
"""
from __future__ import annotations

from collections.abc import Iterable

from ignisd.cache.retained_state import RetainedState
from ignisd.vocab import RAM


def rank(state: RetainedState, now: float, interactive_ttl: float) -> tuple[int, int, float]:
    """(current, class, last_use) of `state` at `now` (seconds, the store's clock); interactive_ttl in seconds."""
    cls = 1 if state.priority == "interactive" else 0
    if cls and state.kind == "checkpoint" and state.tier == RAM and now - state.last_use > interactive_ttl:
        cls = 0
    return 0 if state.superseded else 1, cls, state.last_use


def lowest(states: Iterable[RetainedState], now: float, interactive_ttl: float, *, below: tuple | None = None,
           with_slot: bool = False, tier: str | None = None) -> RetainedState | None:
    """The lowest-ranked of `states` that can be dropped or moved down: unpinned, not doomed, not in flight to disk,
    holding a slot when ``with_slot``, in ``tier`` when given, and ranking strictly below ``below`` when given (the
    oldest first among equals). None when there is none."""
    pool = [s for s in states
            if not s.pins and not s.doomed and not s.placement.in_flight
            and (not with_slot or s.slot is not None) and (tier is None or s.tier == tier)]
    if not pool:
        return None
    v = min(pool, key=lambda s: (rank(s, now, interactive_ttl), s.created))
    if below is not None and not rank(v, now, interactive_ttl) < below:
        return None
    return v
