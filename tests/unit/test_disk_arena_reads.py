"""KV-disk reads into the KV-RAM arena (ignisd/disk_traffic.py, CacheManager.lend_extent): a file read back for a
restore lands in a free arena extent (memory allocated and touched at load: no page faults, even after a restart),
the restore from it is the file's exact bytes, and the extent is given back once no restore can read it; a corrupt
file gives it back at once and is never used; an arena with no free piece large enough sends the read to a buffer.
A real engine (fake model), KV pool, arena, cache manager and DiskStore, as in test_transfer.py."""
from __future__ import annotations

import asyncio

import pytest

from ignisd.cache.page_pool import IntegrityError
from ignisd.metrics import Metrics
from ignisd.request import Request, SamplingParams
from test_disk_buffers import disk_restores, settle
from test_transfer import drain, engine_world, request, run_engine


def hit_request(k: int) -> Request:
    """Restores s (no cut points, one token: it leaves nothing of its own behind)."""
    return Request(f"hit{k}", list(range(5000, 5128)) + [9] * 8, SamplingParams(max_tokens=1, temperature=0.0))


async def to_disk(e, s) -> None:
    """Push s from the device into the arena (a pool-sized request), then down to KV-disk (the tier policy's own
    move, as arena pressure would plan it; a small request's round runs it), and wait for the file."""
    await drain(e.submit(request("push", 10, 300)))
    assert s.tier == "ram"
    assert e.cache.tiers.move_down(e.cache, s)
    await drain(e.submit(request("tick", 4, 1)))
    await settle(e, s)
    assert e.cache.tiers.arena.used_bytes == 0


def arena_of(engine):
    return engine.disk.arena


def test_a_kv_disk_read_lands_in_a_free_arena_extent_and_gives_it_back(tmp_path):
    engine, s, want, _ = engine_world(tmp_path, arena_pages=3)
    seen = disk_restores(engine.runner)
    engine.disk.metrics = Metrics()

    async def body(e):
        await to_disk(e, s)
        for k in range(2):
            done = await drain(e.submit(hit_request(k)))
            assert done.cached_tokens == 128 and done.reuse.tier == "disk"
            assert len(e.cache._extent_loans) <= 1
            e.disk.poll()                                  # what the loop does next: the extent goes back
            assert e.cache.tiers.arena.used_bytes == 0 and not e.cache._extent_loans
            e.cache.check_integrity()

    run_engine(engine, body)
    assert [got for got, _ in seen] == [want, want]     # the file's bytes, bit for bit, both times
    for _, payload in seen:
        assert memoryview(payload).obj is arena_of(engine).obj    # read into the arena, not a new buffer
    assert "ignis_tier_disk_reads_arena_total 2.0" in engine.disk.metrics.render()
    engine.cache.check_integrity()


def test_a_corrupt_file_read_into_the_arena_frees_its_extent_and_is_never_used(tmp_path):
    engine, s, _, disk = engine_world(tmp_path, arena_pages=3)
    seen = disk_restores(engine.runner)

    async def body(e):
        await to_disk(e, s)
        path = disk.path(s.placement.disk_file)
        raw = bytearray(path.read_bytes())
        raw[-100] ^= 0xFF                                 # one payload byte: the checksum fails
        path.write_bytes(bytes(raw))
        errors = e.cache.tiers.counts["disk_errors"]
        done = await drain(e.submit(hit_request(0)))
        assert done.cached_tokens == 0                    # recomputed, not restored from the corrupt bytes
        assert e.cache.tiers.counts["disk_errors"] == errors + 1
        assert not path.exists()                          # deleted: never read twice
        assert e.cache.tiers.arena.used_bytes == 0 and not e.cache._extent_loans
        e.cache.check_integrity()

    run_engine(engine, body)
    assert seen == []


def test_an_arena_without_room_sends_the_read_to_a_buffer(tmp_path):
    engine, s, want, _ = engine_world(tmp_path, arena_pages=3)
    seen = disk_restores(engine.runner)
    cache = engine.cache

    async def body(e):
        await to_disk(e, s)
        taken = cache.lend_extent("someone-else", cache.tiers.arena.total_bytes - cache.tiers.arena.align)
        assert taken is not None and not cache.tiers.arena.fits(len(want))
        done = await drain(e.submit(hit_request(0)))
        assert done.cached_tokens == 128 and done.reuse.tier == "disk"
        e.disk.poll()
        assert list(cache._extent_loans) == [taken]       # only the test's own loan: the read took none
        cache.check_integrity()                           # the loan counts as held
        cache.return_extent(taken)

    run_engine(engine, body)
    ((got, payload),) = seen
    assert got == want
    assert memoryview(payload).obj is not arena_of(engine).obj
    cache.check_integrity()


def test_lent_extents_are_held_once_and_given_back_once(tmp_path):
    engine, _, _, _ = engine_world(tmp_path, arena_pages=3)
    cache, arena = engine.cache, engine.cache.tiers.arena
    assert cache.lend_extent("a", 0) is None
    off = cache.lend_extent("a", arena.align)
    assert off is not None and arena.used_bytes == arena.align
    cache.check_integrity()
    arena.free(off)                                       # freed behind the loan's back: the books disagree
    with pytest.raises(IntegrityError):
        cache.check_integrity()
    arena.alloc(arena.align)                              # (put the allocator back as it was)
    cache.return_extent(off)
    with pytest.raises(IntegrityError):
        cache.return_extent(off)                          # twice
    assert arena.used_bytes == 0
    cache.check_integrity()


def test_a_cancelled_read_gives_its_extent_back_only_when_the_io_ended(tmp_path):
    engine, s, _, disk = engine_world(tmp_path, arena_pages=3)
    cache = engine.cache

    async def body(e):
        await to_disk(e, s)
        real, gate = disk.read, asyncio.Event()

        async def slow_read(key, into=None):
            await gate.wait()                             # the I/O still "in flight" into the extent
            return await real(key, into)
        disk.read = slow_read
        task = asyncio.ensure_future(e.disk._read(s.id))
        await asyncio.sleep(0.05)
        assert len(cache._extent_loans) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(cache._extent_loans) == 1             # not reusable while the read may still write into it
        gate.set()
        for _ in range(100):
            if not cache._extent_loans:
                break
            await asyncio.sleep(0.01)
        assert not cache._extent_loans and cache.tiers.arena.used_bytes == 0
        disk.read = real

    run_engine(engine, body)
    cache.check_integrity()
