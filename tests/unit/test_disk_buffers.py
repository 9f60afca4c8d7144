"""KV-disk read buffers (ignisd/disk_traffic.py): the bytes a round produced for a file are, once the file landed and
no restore can read them, the buffer the next KV-disk read fills (a fresh one costs its page faults), and the
restore from that read is still the file's exact bytes; a buffer a planned restore still holds is never handed out.
A real engine (fake model), KV pool, arena, cache manager and DiskStore, as in test_transfer.py."""
from __future__ import annotations

import asyncio

import torch

from ignisd.cache import transfer
from ignisd.request import Request, SamplingParams
from test_transfer import drain, engine_world, request, run_engine


def disk_restores(runner) -> list[tuple[bytes, object]]:
    """Wrap `runner`'s execute; returns the list that then gets, for each KV-disk restore of a round, (the bytes of
    its destination pages read right after the round, the payload it read)."""
    seen, real = [], runner.execute

    def execute(plan):
        res = real(plan)
        for rs in plan.restores:
            if rs.tier == "disk":
                got = torch.empty(len(rs.dst_pages) * runner.kv.page_bytes, dtype=torch.uint8)
                transfer.read_pages(runner.kv, list(rs.dst_pages), got)
                seen.append((got.numpy().tobytes(), rs.payload))
        return res
    runner.execute = execute
    return seen


async def settle(e, s) -> None:
    """Until retained state `s` is on KV-disk with its file written and nothing in flight."""
    for _ in range(300):
        if not e.disk.busy and s.placement.payload is None and s.tier == "disk":
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the state never settled on KV-disk")


def test_kv_disk_restores_are_bit_exact_and_reuse_one_read_buffer(tmp_path):
    """A KV-disk state hit twice (pushed back to KV-disk between the hits) restores the file's exact bytes into the
    live pages both times, and the second read fills the buffer the first restore gave back (a fresh buffer costs
    its page faults), not a new one."""
    engine, s, want, disk = engine_world(tmp_path, arena_pages=0)
    seen = disk_restores(engine.runner)

    async def body(e):
        await drain(e.submit(request("push0", 10, 300)))  # no arena: s goes to KV-disk
        await settle(e, s)
        for k in range(2):
            # no cut points and one token: it restores and leaves nothing of its own behind
            hit = Request(f"hit{k}", list(range(5000, 5128)) + [9] * 8, SamplingParams(max_tokens=1, temperature=0.0))
            done = await drain(e.submit(hit))
            assert done.cached_tokens == 128 and done.reuse.tier == "disk"
            await drain(e.submit(request(f"push{k + 1}", 10, 300)))
            await settle(e, s)

    run_engine(engine, body)
    assert [got for got, _ in seen] == [want, want]
    (_, p0), (_, p1) = seen
    assert p0.obj is p1.obj                     # the same read buffer under both payload views
    engine.cache.check_integrity()


def test_the_written_bytes_become_the_next_read_buffer_and_restore_exactly(tmp_path):
    engine, s, want, disk = engine_world(tmp_path, arena_pages=0)
    restored = disk_restores(engine.runner)
    written, real = [], engine.runner.execute

    def execute(plan):
        res = real(plan)
        written.extend(res.snapshots.values())             # the "to_bytes" move's bytes, handed to the file write
        return res
    engine.runner.execute = execute

    async def body(e):
        await drain(e.submit(request("push", 10, 300)))     # no arena: s goes to KV-disk
        await settle(e, s)
        hit = Request("hit", list(range(5000, 5128)) + [9] * 8, SamplingParams(max_tokens=1, temperature=0.0))
        done = await drain(e.submit(hit))
        assert done.cached_tokens == 128 and done.reuse.tier == "disk"

    run_engine(engine, body)
    (payload,) = written
    ((got, read_view),) = restored
    assert got == want                                       # the pages a cold run wrote, bit for bit
    assert memoryview(read_view).obj is memoryview(payload).obj   # filled in the written bytes' buffer
    engine.cache.check_integrity()


def test_a_payload_is_not_free_while_a_restore_can_read_it(tmp_path):
    engine, s, _, _ = engine_world(tmp_path, arena_pages=0)
    cache = engine.cache
    other = memoryview(bytearray(8))
    assert cache.payload_free(s.id, other)                   # not its payload, nobody holds s
    cache.retained.pin(s.id)
    assert not cache.payload_free(s.id, other)               # a lookup holds s: a planned restore may read it
    cache.retained.unpin(s.id)
    assert cache.payload_free("no-such-state", other)
