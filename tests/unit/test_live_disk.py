"""Evicted live sequences on KV-disk (DESIGN §4.5, issue 9): a running sequence that the KV-RAM arena cannot hold is
moved to a "live" KV-disk file, read back and verified, and resumes bit-exact; a failed write or read recomputes it;
when every tier is full of live work the waiting request waits; the runner's staging moves. (The cache side on plain
ints, the "live" record and the scan at start: test_live_disk_policy.py.)

The engine, scheduler, cache manager, KVStore, StateStore, HostArena and DiskStore are the real ones; the forward
pass is test_engine_loop's fake (token 500 + the position it predicts, so every token id is computed by hand), and
every item it runs writes a mark of (sequence, position) into the K/V of the positions it computes and (sequence,
end) into its live slot, after checking that every earlier position of its pages and its slot hold what that
sequence itself wrote there: a restore that is not bit-exact would show as a mismatch on the next item."""
from __future__ import annotations

import asyncio
import errno
import time

import pytest
import torch

from test_engine_loop import FakeRunner, drain, req, run

from ignisd.buffers import BufferSpec
from ignisd.cache import transfer
from ignisd.cache.disk_store import DiskStore
from ignisd.cache.extents import ExtentAllocator
from ignisd.cache.host_arena import HostArena
from ignisd.cache.kv_format import KVGeometry, get_kv_format
from ignisd.cache.kv_store import KVStore
from ignisd.cache.manager import CacheManager
from ignisd.cache.page_pool import PagePool
from ignisd.cache.retained import RetainedStore
from ignisd.cache.retained_state import Stamp
from ignisd.cache.state_slots import StateSlots
from ignisd.cache.state_store import StateStore
from ignisd.cache.tiers import Tiers
from ignisd.engine import Engine
from ignisd.request import FinishReason, Priority, TokenEvent
from ignisd.runner import Runner
from ignisd.scheduler import Scheduler

PT = 64
GEOM = KVGeometry(n_attention_layers=1, num_kv_heads=1, head_dim=2)


class MarkingRunner(FakeRunner):
    """FakeRunner whose tier moves and restores run on a real Runner (see the module docstring). mismatches: what the
    checks found wrong; moved / restored: per sequence, the bytes of its pages as its last move handed them over and
    right after its restore."""

    def __init__(self, kv: KVStore, states: StateStore, arena, cache: CacheManager):
        super().__init__()
        self.real = Runner(None, kv, states, {}, arena)
        self.kv, self.states, self.cache = kv, states, cache
        self.ids: dict[str, int] = {}
        self.mismatches: list[tuple] = []
        self.moved: dict[str, bytes] = {}
        self.restored: dict[str, bytes] = {}
        self.move_ops: list = []
        self.settle = True
        self.on_restore = None                 # called with each RestoreOp, in the worker thread

    def mark(self, seq: str, pos) -> torch.Tensor:
        return torch.as_tensor(pos, dtype=torch.float32) + self.ids.setdefault(seq, len(self.ids) + 1) * 100_000

    def _rows(self, pages, start: int, end: int) -> torch.Tensor:
        return torch.tensor([pages[p // PT] * PT + p % PT for p in range(start, end)], dtype=torch.long)

    def _settle(self) -> None:
        """Wait (this worker thread; the event loop runs the writes) until no live file is being written while its
        bytes are in memory: the restore then always reads the file back."""
        deadline = time.monotonic() + 10
        while any(ev.tier == "disk" and ev.in_flight and ev.payload is not None
                  for ev in list(self.cache._evicted.values())) and time.monotonic() < deadline:
            time.sleep(0.002)

    def execute(self, plan):
        if self.settle:
            self._settle()
        snaps: dict = {}
        for mv in plan.moves:
            self.real._move(mv, snaps)
            self.move_ops.append(mv)
        for sid, payload in snaps.items():     # a live sequence's bytes, complete: its pages, then its image
            self.moved[sid] = bytes(payload)[:len(payload) - self.states.slot_bytes]
        for rs in plan.restores:
            if self.on_restore is not None:
                self.on_restore(rs)
            self.real._restore(rs)
            got = torch.empty(len(rs.dst_pages) * self.kv.page_bytes, dtype=torch.uint8)
            transfer.read_pages(self.kv, list(rs.dst_pages), got)
            self.restored[rs.seq_id] = got.numpy().tobytes()
        slots = self.states.buffer("recurrent")
        for it in plan.items:
            end = it.start + len(it.token_ids)
            for name in self.kv.buffer_names:
                buf = self.kv.buffer(name)
                held = buf[0, self._rows(it.page_ids, 0, it.start), 0, 0]
                if not torch.equal(held, self.mark(it.seq_id, torch.arange(it.start))):
                    self.mismatches.append((len(self.plans), it.seq_id, name, "pages"))
                buf[0, self._rows(it.page_ids, it.start, end)] = \
                    self.mark(it.seq_id, torch.arange(it.start, end)).view(-1, 1, 1).expand(-1, 1, 2)
            want = torch.stack([self.mark(it.seq_id, 0), torch.tensor(float(it.start))])
            if it.start > 0 and not torch.equal(slots[it.slot], want):
                self.mismatches.append((len(self.plans), it.seq_id, "slot", slots[it.slot].tolist()))
            slots[it.slot] = torch.stack([self.mark(it.seq_id, 0), torch.tensor(float(end))])
        res = super().execute(plan)
        res.snapshots = snaps
        return res


def make_world(tmp_path, *, arena_pages=2, disk_bytes=1 << 24, lanes=2, pages=16, window=2):
    """A tiered engine whose arena (`arena_pages` pages) cannot hold an agent's 5 pages + image."""
    kv = KVStore(get_kv_format("fp32"), GEOM, pages, page_tokens=PT)
    states = StateStore([BufferSpec("recurrent", (2,), "float32")], lanes)
    arena = HostArena(arena_pages * kv.page_bytes, lock=False) if arena_pages else None
    tiers = Tiers(ExtentAllocator(arena.nbytes, align=kv.page_bytes) if arena else None, disk_bytes, kv.page_bytes,
                  transfer.image_layout(states), floors={"ram": 1, "disk": 1}, page_tokens=PT)
    store = RetainedStore(Stamp("h", "fp32"), page_tokens=PT, device_slots=StateSlots(0), host_slots=StateSlots(0),
                          needs_slot=True)
    cache = CacheManager(PagePool(pages, PT), kv.page_bytes, slots=StateSlots(lanes), state_bytes=states.slot_bytes,
                         retained=store, tiers=tiers)
    sched = Scheduler(cache, lanes=lanes, context_tokens=4096, prefill_chunk=64, round_prefill_tokens=256,
                      max_queue=16, evict_window_pages=window)
    disk = None
    if disk_bytes:
        disk = DiskStore(tmp_path / "kv", disk_bytes)
        disk.scan(store.stamp)
    runner = MarkingRunner(kv, states, arena, cache)
    return Engine(sched, runner, disk=disk), runner, disk


def agent(rid, base):
    return req(rid, list(range(base, base + 300)), max_tokens=40, priority=Priority.AGENT, cache_prompt=False)


def toks(events):
    return [ev.token_id for ev in events if isinstance(ev, TokenEvent)]


def agents_and_interactive(engine, runner, arrivals):
    """Two agents fill both lanes; `arrivals` {round: (rid, prompt length, max_tokens)} arrive interactive during
    those rounds. Returns {rid: events}."""
    async def body(e):
        loop = asyncio.get_running_loop()
        qs = {}
        for k, (rid, n, mt) in arrivals.items():
            def arrive(rid=rid, n=n, mt=mt):
                qs[rid] = e.submit(req(rid, list(range(7000, 7000 + n)), max_tokens=mt, cache_prompt=False))
            runner.hooks[k] = lambda f=arrive: loop.call_soon_threadsafe(f)
        qs["a1"] = e.submit(agent("a1", 2000))
        qs["a2"] = e.submit(agent("a2", 3000))
        out = {rid: await drain(qs[rid]) for rid in ("a1", "a2")}
        while len(qs) < 2 + len(arrivals):
            await asyncio.sleep(0.001)
        for rid in list(qs):
            if rid not in out:
                out[rid] = await drain(qs[rid])
        while e.disk.busy:                    # let a write that lands after its sequence's restore finish
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)             # and the loop remove what it left
        return out
    return run(engine, body)


def rounds_of(runner, rid):
    return [k for k, p in enumerate(runner.plans) if any(it.seq_id == rid for it in p.items)]


def assert_settled(engine, disk):
    cache = engine.cache
    cache.check_integrity()
    assert cache.tiers.disk_used == 0 and not cache._evicted and cache.live_pages() == 0
    assert disk.used_bytes == 0 and not list(disk.directory.glob("*.ignkv*"))


def test_an_agent_the_arena_cannot_hold_goes_to_kv_disk_and_resumes_bit_exact(tmp_path):
    engine, runner, disk = make_world(tmp_path)
    reads = []
    real_read = disk.read

    async def read(key, into=None):
        reads.append(key)
        return await real_read(key, into)
    disk.read = read

    out = agents_and_interactive(engine, runner, {12: ("i", 100, 3)})
    for rid in ("a1", "a2"):                      # exactly an uninterrupted run's tokens: none repeated or lost
        assert toks(out[rid]) == [800 + k for k in range(40)], rid
        assert out[rid][-1].finish_reason is FinishReason.LENGTH
    assert toks(out["i"]) == [600, 601, 602]
    assert runner.mismatches == []                # every item saw its own pages and slot, restored ones included
    mvs = [m for m in runner.move_ops if m.state_id == "a2"]     # a window of 2 pages a round into its staging
    pb = runner.kv.page_bytes
    assert [(m.op, len(m.pages), m.dst_offset, m.nbytes) for m in mvs] == [
        ("to_stage", 2, 0, 5 * pb + 8), ("to_stage", 2, 2 * pb, 5 * pb + 8), ("to_stage", 1, 4 * pb, 5 * pb + 8)]
    assert [m.image_slot for m in mvs[:2]] == [None, None] and mvs[2].image_slot[0] == "live"
    rounds = [k for k, p in enumerate(runner.plans) if any(m.state_id == "a2" for m in p.moves)]
    assert rounds == [rounds[0], rounds[0] + 1, rounds[0] + 2]
    assert all(any(it.seq_id == "a1" for it in runner.plans[k].items) for k in rounds)   # a1 decoded meanwhile
    n = 5
    (rs,) = [r for p in runner.plans for r in p.restores if r.seq_id == "a2"]
    assert rs.tier == "disk" and rs.image_after_pages and len(rs.dst_pages) == n
    assert runner.restored["a2"] == runner.moved["a2"]            # the pages' bytes, before and after
    at = rounds[0]
    computed = max(it.start + len(it.token_ids) for p in runner.plans[:at] for it in p.items if it.seq_id == "a2")
    held = torch.frombuffer(bytearray(runner.moved["a2"]), dtype=torch.float32).view(n, 2, PT, 2)
    flat = held.permute(1, 0, 2, 3).reshape(2, n * PT, 2)[:, :computed]      # K then V of every computed position
    assert torch.equal(flat, runner.mark("a2", torch.arange(computed)).view(1, -1, 1).expand(2, -1, 2))
    assert len(reads) == 1                        # its file was read back and verified before the restore
    s = engine.scheduler.evictions
    assert (s.evicted_total, s.recomputed_total) == (1, 0)
    assert engine.cache.tiers.counts["disk_errors"] == 0
    assert_settled(engine, disk)


def test_a_restore_from_the_bytes_in_memory_and_a_write_that_lands_after_it_leave_no_file(tmp_path):
    """The lane frees before the live file is written: the sequence resumes from the round's bytes still in memory,
    and the file, once written, is removed at once (nothing read back, nothing left)."""
    import threading
    engine, runner, disk = make_world(tmp_path)
    runner.settle = False
    restored = threading.Event()
    runner.on_restore = lambda rs: restored.set() if rs.seq_id == "a2" else None
    real_write, reads, landed = disk.write, [], []

    async def write(record, pages, image):
        while not restored.is_set():
            await asyncio.sleep(0.002)
        size = await real_write(record, pages, image)
        landed.append(record.key)
        return size
    disk.write = write
    disk.read = lambda *a, **kw: reads.append(a)

    out = agents_and_interactive(engine, runner, {12: ("i", 100, 3)})
    for rid in ("a1", "a2"):
        assert toks(out[rid]) == [800 + k for k in range(40)], rid
    assert runner.mismatches == [] and runner.restored["a2"] == runner.moved["a2"]
    (rs,) = [r for p in runner.plans for r in p.restores if r.seq_id == "a2"]
    assert rs.tier == "disk" and bytes(rs.payload)[:len(runner.moved["a2"])] == runner.moved["a2"]
    assert len(landed) == 1 and reads == []
    assert engine.scheduler.evictions.recomputed_total == 0
    assert_settled(engine, disk)


@pytest.mark.parametrize("fault", ["write", "read"])
def test_a_failed_kv_disk_write_or_read_recomputes_the_sequence_and_its_stream_stays_whole(tmp_path, fault):
    engine, runner, disk = make_world(tmp_path)

    async def failing(*a, **kw):
        raise OSError(errno.EIO if fault == "read" else errno.ENOSPC, f"injected {fault} fault")
    disk.__dict__[fault] = failing

    out = agents_and_interactive(engine, runner, {12: ("i", 100, 3)})
    for rid in ("a1", "a2"):
        assert toks(out[rid]) == [800 + k for k in range(40)], rid
        assert out[rid][-1].generated_tokens == 40
    assert toks(out["i"]) == [600, 601, 602]
    assert runner.mismatches == []
    assert not [r for p in runner.plans for r in p.restores if r.seq_id == "a2"]   # nothing restored: recomputed
    redo = [it for p in runner.plans for it in p.items if it.seq_id == "a2" and it.phase == "prefill"]
    assert redo[-1].start + len(redo[-1].token_ids) > 300 and not redo[-1].sample
    s = engine.scheduler.evictions
    assert (s.evicted_total, s.recomputed_total) == (1, 1)
    assert engine.cache.tiers.counts["disk_errors"] == 1
    assert_settled(engine, disk)


def test_when_every_tier_is_full_of_live_work_the_interactive_request_waits(tmp_path):
    """KV-disk holds one evicted agent, not two: the second interactive request finds no tier for the other agent,
    so it waits in the queue for a lane; no live sequence is discarded or recomputed."""
    engine, runner, disk = make_world(tmp_path, disk_bytes=5 * 1024 + 8 + (1 << 16) + 4096)
    out = agents_and_interactive(engine, runner, {12: ("i1", 100, 10), 15: ("i2", 120, 3)})
    for rid in ("a1", "a2"):
        assert toks(out[rid]) == [800 + k for k in range(40)], rid
    assert toks(out["i1"]) == [600 + k for k in range(10)]
    assert toks(out["i2"]) == [620, 621, 622]
    assert runner.mismatches == []
    assert {m.state_id for m in runner.move_ops} == {"a2"}       # a1 was never moved
    assert rounds_of(runner, "i2")[0] > rounds_of(runner, "i1")[-1]   # it waited for i1's lane
    a1 = rounds_of(runner, "a1")
    assert all(k in a1 for k in range(12, a1[-1] + 1))           # a1 kept decoding every round meanwhile
    s = engine.scheduler.evictions
    assert (s.evicted_total, s.recomputed_total) == (1, 0)
    assert_settled(engine, disk)


def test_staging_moves_hand_over_the_bytes_only_when_complete_and_forget_drops_a_partial_buffer():
    from ignisd.plan import TierMove
    kv = KVStore(get_kv_format("fp32"), GEOM, 8, page_tokens=PT)
    states = StateStore([BufferSpec("recurrent", (2,), "float32")], 2)
    g = torch.Generator().manual_seed(3)
    for name in kv.buffer_names:
        kv.buffer(name).copy_(torch.randn(kv.buffer(name).shape, generator=g))
    states.buffer("recurrent")[1] = torch.tensor([1.5, -2.25])
    r = Runner(None, kv, states, {}, None)
    pb, total = kv.page_bytes, 3 * kv.page_bytes + states.slot_bytes
    snaps: dict = {}
    r._move(TierMove("to_stage", "s", pages=(6, 1), dst_offset=0, nbytes=total), snaps)
    assert snaps == {}
    r._move(TierMove("to_stage", "s", pages=(4,), image_slot=("live", 1), dst_offset=2 * pb, nbytes=total), snaps)
    want = torch.empty(3 * pb, dtype=torch.uint8)
    transfer.read_pages(kv, [6, 1, 4], want)
    img = torch.empty(states.slot_bytes, dtype=torch.uint8)
    transfer.read_image(states, 1, img)
    assert bytes(snaps["s"]) == want.numpy().tobytes() + img.numpy().tobytes() and r._staging == {}
    r._move(TierMove("to_stage", "t", pages=(2,), dst_offset=0, nbytes=total), snaps)
    assert "t" in r._staging and "t" not in snaps
    r.forget("t")                                  # it ended while being moved: its buffer goes
    assert r._staging == {}
