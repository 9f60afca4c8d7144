"""Evicted live sequences on KV-disk, the cache side (DESIGN §4.5, issue 9): the tier policy on plain ints
(test_tier_policy's world: page P = 1,000 bytes, header reserve H = 100; every offset and byte count worked out by
hand), the "live" record of the file format, and the scan at start that removes live files."""
from __future__ import annotations

import asyncio

import pytest

from test_tier_policy import PT as TPT, World, toks as ttoks

from ignisd.cache.disk_format import DiskRecord, decode_header, encode_header
from ignisd.cache.disk_store import DiskStore
from ignisd.cache.retained import RetainedStore
from ignisd.cache.retained_state import Stamp
from ignisd.cache.state_slots import StateSlots
from ignisd.cache.tiers import Tiers
from ignisd.plan import RoundPlan

PT = 64


# ------------------------------------------------------------------ the policy on plain ints (test_tier_policy)


def test_retained_state_leaves_the_arena_first_and_an_evicted_live_sequence_is_never_pushed_down():
    """Page P = 1,000 bytes, header reserve H = 100, arena 6 pages. A retained state in KV-RAM moves to KV-disk to let
    live x (5 pages) into the arena; live y (3 pages) then finds the arena full of live work and goes to KV-disk
    itself, x staying put; y waits for its bytes, is restored from them, and its share of KV-disk and its file go."""
    w = World(pages=16, arena_pages=6, disk_bytes=100_000)
    r = w.retain(ttoks(1, 128))
    w.cache.evict_for_pages(16)                                   # r: device -> arena [0, 2000)
    assert w.tier(r) == "ram"
    w.cache.plan_moves()
    x, y = (w.cache.admit(sid, ttoks(k, 5), n * TPT, reuse=False) for sid, k, n in (("x", 2, 5), ("y", 3, 3)))
    assert w.cache.begin_eviction("x", 5 * TPT)
    assert w.tier(r) == "disk" and w.tiers.disk_used == 2000 + 100
    assert w.cache.begin_eviction("y", 3 * TPT)                   # the arena holds x: y goes to KV-disk
    assert w.tiers.disk_used == 2100 + 3000 + 100
    while not w.cache.eviction_step("x", 2):
        pass
    assert not w.cache.eviction_step("y", 2) and w.cache.eviction_step("y", 2)
    moves = w.cache.plan_moves()
    assert [(m.op, m.state_id, m.pages, m.dst_offset, m.nbytes) for m in moves] == [
        ("to_bytes", r.id, (), None, 2000), ("to_ram", "x", tuple(x.pages[:2]), 0, 0),
        ("to_ram", "x", tuple(x.pages[2:4]), 2000, 0), ("to_ram", "x", tuple(x.pages[4:5]), 4000, 0),
        ("to_stage", "y", tuple(y.pages[:2]), 0, 3000), ("to_stage", "y", tuple(y.pages[2:3]), 2000, 3000)]
    w.check()
    assert w.cache.admit_evicted("y", 3 * TPT).wait_for == "y"    # its bytes are not in memory yet
    assert w.cache.bytes_ready("y", b"\1" * 3000)                 # the round produced them
    key = w.cache.disk_file("y")
    assert w.cache.disk_written("y", 3300, key) and w.cache.payload_of("y") is None
    assert w.tiers.disk_used == 2100 + 3300
    assert w.cache.admit_evicted("y", 3 * TPT).wait_for == "y" and w.cache.loads_wanted() == ["y"]
    assert w.cache.bytes_ready("y", b"\2" * 3000)                 # read back and verified
    adm = w.cache.admit_evicted("y", 3 * TPT)
    assert adm.restore.tier == "disk" and adm.restore.payload == b"\2" * 3000 and len(adm.restore.dst_pages) == 3
    w.cache.finish_round(RoundPlan((), (adm.restore,)))
    assert w.tiers.disk_used == 2100 and w.cache.take_disk_deletes()[-1] == key
    assert w.cache.is_evicted("x") and w.tiers.arena.used_bytes == 5000
    w.check()
    for sid in ("x", "y"):
        w.cache.release(sid)
    assert w.tiers.arena.used_bytes == 0
    w.check()


def test_kv_disk_full_of_live_work_refuses_without_moving_anything():
    w = World(pages=16, arena_pages=0, disk_bytes=5000)
    r = w.retain(ttoks(1, 128))
    w.cache.evict_for_pages(16)                                   # no arena: r goes to KV-disk (2,100 bytes)
    w.cache.plan_moves()
    for sid, k in (("x", 2), ("y", 3)):
        w.cache.admit(sid, ttoks(k, 5), 3 * TPT, reuse=False)
    w.cache.disk_written(r.id, 2100)
    assert w.cache.begin_eviction("x", 3 * TPT)                   # 3,100: r is dropped to make room
    assert r.id not in w.store and w.tiers.disk_used == 3100
    assert not w.cache.begin_eviction("y", 3 * TPT)               # x's file leaves no room: y stays where it is
    assert w.tiers.disk_used == 3100 and "y" not in w.cache._evicted and w.cache.plan_moves() == []
    while not w.cache.eviction_step("x", 2):
        pass
    assert w.cache.bytes_ready("x", b"\0" * 3000)
    w.cache.disk_failed("x", w.cache.disk_file("x"))              # x's write fails: its bytes are lost
    assert w.tiers.disk_used == 0 and w.cache.take_lost("x") and w.tiers.counts["disk_errors"] == 1
    for sid in ("x", "y"):
        w.cache.release(sid)
    w.check()


def test_an_older_file_landing_after_the_sequence_was_evicted_again_touches_only_itself():
    """x goes to KV-disk, resumes from its bytes in memory before its file is written, and is evicted again (a new
    file, a new key) before the first write lands: that write and a failure of it answer for the old key only."""
    w = World(pages=16, arena_pages=0, disk_bytes=100_000)
    w.cache.admit("x", ttoks(2, 5), 3 * TPT, reuse=False)
    assert w.cache.begin_eviction("x", 2 * TPT) and w.cache.eviction_step("x", 4)
    assert w.cache.bytes_ready("x", b"\1" * 2000)
    old = w.cache.disk_file("x")
    adm = w.cache.admit_evicted("x", 3 * TPT)
    assert adm.restore.payload == b"\1" * 2000
    w.cache.finish_round(RoundPlan((), (adm.restore,)))
    assert w.cache.take_disk_deletes() == [old] and w.tiers.disk_used == 0
    assert w.cache.begin_eviction("x", 3 * TPT) and w.cache.eviction_step("x", 4)
    new = w.cache.disk_record("x").key
    assert new != old and w.tiers.disk_used == 3000 + 100
    assert not w.cache.disk_written("x", 2300, old)               # the caller removes the old file
    w.cache.disk_failed("x", old)
    assert w.cache._evicted["x"].in_flight and not w.cache.take_lost("x") and w.tiers.disk_used == 3100
    assert w.cache.bytes_ready("x", b"\2" * 3000) and w.cache.disk_written("x", 3300, new)
    assert w.tiers.disk_used == 3300 and w.cache.payload_of("x") is None
    w.cache.release("x")
    assert w.tiers.disk_used == 0 and w.cache.take_disk_deletes() == [new]
    w.check()


# ------------------------------------------------------------------ the "live" record


def live_record(owner="a2#1", **kw):
    args = dict(kind="live", tokens=(), image_spans=(), priority="agent", after_user=False, structural_hash="h",
                kv_format="fp32", drafter="none", page_tokens=64, page_bytes=8, n_pages=2,
                image_layout=(("recurrent", "float32", (2,), 8),), owner=owner)
    args.update(kw)
    return DiskRecord(**args)


def test_a_live_record_needs_an_owner_that_its_key_binds_and_others_have_none():
    a, b = live_record(), live_record(owner="a2#2")
    assert a.key != b.key and len(a.key) == 64
    assert live_record(priority="interactive", n_pages=3).key == a.key
    assert decode_header(encode_header(a)) == (a.key, a)
    assert encode_header(a).endswith(b',"owner":"a2#1"}')
    with pytest.raises(ValueError):
        live_record(owner="")
    with pytest.raises(ValueError):
        DiskRecord("prefix", (1,), (), "agent", False, "h", "fp32", "none", 64, 8, 1, owner="x")
    p = DiskRecord("prefix", (1,), (), "agent", False, "h", "fp32", "none", 64, 8, 1)
    assert b"owner" not in encode_header(p)                       # other kinds' headers are unchanged


def test_the_scan_at_start_removes_live_files_of_any_stamp(tmp_path):
    d = tmp_path / "kv"
    with DiskStore(d, 1 << 20) as s:
        for r in (live_record(), live_record(owner="b#1", structural_hash="other")):
            asyncio.run(s.write(r, bytes(r.pages_bytes), bytes(r.image_bytes)))
        kept = DiskRecord("prefix", (1, 2), (), "agent", False, "h", "fp32", "none", 64, 8, 1)
        asyncio.run(s.write(kept, bytes(8), b""))
    with DiskStore(d, 1 << 20) as s:
        res = s.scan(("h", "fp32", "none"))
        assert res.live == 2 and [k for k, _, _ in res.usable] == [kept.key]
        assert sorted(p.name for p in d.glob("*.ignkv")) == [kept.key + ".ignkv"]


@pytest.mark.parametrize("reuse", [True, False])
def test_index_disk_at_start_removes_live_files_with_reuse_on_or_off(tmp_path, reuse):
    from ignisd.tier_setup import TierSetup, index_disk
    d = tmp_path / "kv"
    kept = DiskRecord("prefix", (1, 2), (), "agent", False, "h", "fp32", "none", 64, 8, 1)
    with DiskStore(d, 1 << 20) as s:
        r = live_record()
        asyncio.run(s.write(r, bytes(r.pages_bytes), bytes(r.image_bytes)))
        size = asyncio.run(s.write(kept, bytes(8), b""))
    store = RetainedStore(Stamp("h", "fp32"), page_tokens=PT, device_slots=StateSlots(0), host_slots=StateSlots(0),
                          needs_slot=False) if reuse else None
    with DiskStore(d, 1 << 20) as disk:
        setup = TierSetup(Tiers(None, 1 << 20, 8, page_tokens=PT), None, disk)
        counts = index_disk(setup, store)
        assert counts["live"] == 1 and sorted(p.name for p in d.glob("*.ignkv")) == [kept.key + ".ignkv"]
        if reuse:                                  # the prefix is indexed as a KV-disk state
            assert counts["usable"] == 1 and [s.tier for s in store.states()] == ["disk"]
            assert setup.tiers.disk_used == size and setup.tiers.disk_foreign == 0
        else:                                      # nothing is restored; the file still takes its room
            assert counts["foreign"] == 1 and setup.tiers.disk_foreign == size and setup.tiers.disk_used == 0
