"""The traversal plan of a prefill (ignisd/traversal.py, DESIGN §4.3): captures, skips and chunk boundaries on
hand-computed cases."""
from __future__ import annotations

import pytest

from ignisd.traversal import Capture, Skipped, plan_traversals


def test_cold_prompt_three_traversals():
    plan = plan_traversals(0, 128, 300, 303, chunk_tokens=64)
    assert plan.captures == (Capture(128, "prefix"), Capture(300, "checkpoint"))
    assert plan.skipped == ()
    assert plan.traversals == ((0, 128), (128, 300), (300, 303))
    assert plan.chunks() == [(0, 64), (64, 128), (128, 192), (192, 256), (256, 300), (300, 303)]
    assert plan.chunk_end(192) == 256 and plan.chunk_end(256) == 300 and plan.chunk_end(300) == 303
    assert plan.capture_at(128) == Capture(128, "prefix") and plan.capture_at(64) is None
    with pytest.raises(ValueError):
        plan.chunk_end(100)
    with pytest.raises(ValueError):
        plan.chunk_end(303)


def test_chunks_restart_at_every_cut():
    plan = plan_traversals(0, 192, 500, 510, chunk_tokens=100)
    assert plan.chunks() == [(0, 100), (100, 192), (192, 292), (292, 392), (392, 492), (492, 500), (500, 510)]
    # a run resumed at the retained prefix splits the shared part [192, 510) exactly as the cold run did
    resumed = plan_traversals(192, 192, 500, 510, chunk_tokens=100)
    assert resumed.captures == (Capture(500, "checkpoint"),)
    assert resumed.skipped == (Skipped(192, "prefix", "resumed_past"),)
    assert resumed.chunks() == [c for c in plan.chunks() if c[0] >= 192]


def test_resumed_past_and_too_close_points_are_skipped():
    # turn 2 resumes at turn 1's checkpoint (300): the publish point is behind it, the new opener 197 tokens on
    plan = plan_traversals(300, 128, 497, 500, chunk_tokens=256)
    assert plan.captures == (Capture(497, "checkpoint"),)
    assert plan.skipped == (Skipped(128, "prefix", "resumed_past"),)
    assert plan.traversals == ((300, 497), (497, 500))
    # less than a page past the resume point
    plan = plan_traversals(128, 128, 150, 153, chunk_tokens=64)
    assert plan.captures == ()
    assert plan.skipped == (Skipped(128, "prefix", "resumed_past"), Skipped(150, "checkpoint", "too_close"))
    assert plan.traversals == ((128, 153),)
    # exactly one page past is enough
    assert plan_traversals(128, 128, 192, 195, chunk_tokens=64).captures == (Capture(192, "checkpoint"),)
    # less than a page past the previous capture
    plan = plan_traversals(0, 64, 100, 103, chunk_tokens=64)
    assert plan.captures == (Capture(64, "prefix"),)
    assert plan.skipped == (Skipped(100, "checkpoint", "too_close"),)
    # a short cold prompt: the opener is less than a page past position 0
    assert plan_traversals(0, 0, 40, 43, chunk_tokens=64).skipped == (
        Skipped(0, "prefix", "none"), Skipped(40, "checkpoint", "too_close"))


def test_missing_and_end_points():
    plan = plan_traversals(0, 0, None, 90, chunk_tokens=32)
    assert plan.captures == () and plan.traversals == ((0, 90),)
    assert plan.chunks() == [(0, 32), (32, 64), (64, 90)]
    assert [s.why for s in plan.skipped] == ["none", "none"]
    plan = plan_traversals(0, 64, 200, 200, chunk_tokens=64)
    assert plan.captures == (Capture(64, "prefix"),)
    assert plan.skipped == (Skipped(200, "checkpoint", "at_end"),)
    with pytest.raises(ValueError):
        plan_traversals(200, 64, 100, 200, chunk_tokens=64)
    with pytest.raises(ValueError):
        plan_traversals(0, 64, 100, 200, chunk_tokens=0)
    # min_gap is a parameter
    assert plan_traversals(0, 64, 100, 103, chunk_tokens=64, min_gap=16).captures == (
        Capture(64, "prefix"), Capture(100, "checkpoint"))
