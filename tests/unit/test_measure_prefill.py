"""The prefill rate measured at load (status.model.prefill_tokens_per_s, the restore floors, `ignis lint`'s seconds)
is a warm forward's, not the first forward's, whose one-time costs made it ~100x too low."""
from __future__ import annotations

import time

from ignisd.tier_setup import measure_prefill
from ignisd.vocab import PAGE_TOKENS


class SlowFirst:
    """A model whose first forward takes 0.5 s and every later one 5 ms (sleeps: wall time is what is measured)."""

    def __init__(self):
        self.calls = 0

    def forward(self, batch, kv, states=None):
        self.calls += 1
        time.sleep(0.5 if self.calls == 1 else 0.005)


class KV:
    page_tokens = PAGE_TOKENS


def test_the_first_forward_is_a_warm_up_and_not_timed():
    runner = type("R", (), {"model": SlowFirst()})()
    rate = measure_prefill(runner, KV(), None)
    assert runner.model.calls == 3
    # 64 tokens in ~5 ms (scheduler jitter allowed): far above the 128 tok/s the 0.5 s first forward would give
    assert 64 / 0.05 < rate <= 64 / 0.005
