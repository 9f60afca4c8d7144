"""Byte layouts of tier moves (ignisd/cache/transfer.py, DESIGN §4.5) on real stores: pages of a KVStore (fp32 and
bf16) and images of a StateStore (mixed fp32 / bf16 buffers) go out and come back bit for bit, into other page ids
and slots, from a prefix of the layout, and from sources at odd byte offsets; plus the runner's transfer step
(device → KV-RAM arena → bytes → restore) end to end. Buffers are filled with random *bit patterns* (NaNs, infs,
-0.0 and subnormals included), so every comparison is of raw bits (integer views), never of float values."""
from __future__ import annotations

import warnings

import pytest
import torch

from ignisd.buffers import BufferSpec
from ignisd.cache import transfer
from ignisd.cache.host_arena import HostArena
from ignisd.cache.kv_format import KVGeometry, get_kv_format
from ignisd.cache.kv_store import KVStore
from ignisd.cache.state_store import StateStore
from ignisd.plan import RestoreOp, TierMove

GEOM = KVGeometry(n_attention_layers=3, num_kv_heads=2, head_dim=4)
PT = 8
INT_OF = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def bits(t: torch.Tensor) -> torch.Tensor:
    """`t`'s raw bits as an integer tensor of the same shape (NaN payloads and -0.0 compare exactly)."""
    return t.contiguous().view(INT_OF[t.dtype])


def randomize(t: torch.Tensor, gen: torch.Generator) -> None:
    """Fill `t` with random bit patterns."""
    iv = t.view(INT_OF[t.dtype])
    lo, hi = (-(1 << 31), 1 << 31) if iv.dtype == torch.int32 else (-(1 << 15), 1 << 15)
    iv.copy_(torch.randint(lo, hi, iv.shape, generator=gen, dtype=torch.int64).to(iv.dtype))


def kv_store(fmt: str, pages: int = 8, seed: int | None = 0) -> KVStore:
    kv = KVStore(get_kv_format(fmt), GEOM, pages, page_tokens=PT)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        for name in kv.buffer_names:
            randomize(kv.buffer(name), g)
    return kv


def page_of(kv: KVStore, name: str, page: int) -> torch.Tensor:
    """Page `page` of buffer `name` of every layer: [layers, PT, Hkv, d]."""
    return kv.buffer(name)[:, page * PT:(page + 1) * PT]


def expected_layout(kv: KVStore, pages: list[int]) -> bytes:
    """The pages layout written out by hand from the module docstring: page-major; per page, per buffer in the
    format's order, that page's [layers, PT × per-token elements] in C order."""
    out = b""
    for p in pages:
        for name in kv.buffer_names:
            out += page_of(kv, name, p).contiguous().view(torch.uint8).numpy().tobytes()
    return out


@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
def test_pages_layout_is_page_major_and_round_trips_into_other_pages(fmt):
    src = kv_store(fmt, seed=1)
    pages = [5, 2, 7]
    n = transfer.pages_nbytes(src, len(pages))
    elem = 4 if fmt == "fp32" else 2
    assert src.page_bytes == 2 * GEOM.n_attention_layers * PT * GEOM.num_kv_heads * GEOM.head_dim * elem
    assert n == 3 * src.page_bytes
    out = torch.full((n + 16,), 0xAB, dtype=torch.uint8)
    transfer.read_pages(src, pages, out)
    assert out[:n].numpy().tobytes() == expected_layout(src, pages)
    assert bool((out[n:] == 0xAB).all())                 # nothing written past the layout
    dst = kv_store(fmt, seed=None)                       # zeros
    transfer.write_pages(dst, [0, 3, 1], out)
    for s, d in zip(pages, [0, 3, 1]):
        for name in src.buffer_names:
            assert torch.equal(bits(page_of(dst, name, d)), bits(page_of(src, name, s))), (name, s, d)
    for untouched in (2, 4, 5, 6, 7):
        for name in dst.buffer_names:
            assert not bits(page_of(dst, name, untouched)).any()
    # and within one store: pages copied onto other pages of the same pool, the sources left as they were
    orig = {name: src.buffer(name).clone() for name in src.buffer_names}
    transfer.write_pages(src, [6, 0, 4], out)
    for s, d in zip(pages, [6, 0, 4]):
        for name in src.buffer_names:
            assert torch.equal(bits(page_of(src, name, d)), bits(orig[name][:, s * PT:(s + 1) * PT]))
            assert torch.equal(bits(page_of(src, name, s)), bits(orig[name][:, s * PT:(s + 1) * PT]))


@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
def test_a_prefix_of_the_layout_restores_a_prefix_of_the_pages(fmt):
    src = kv_store(fmt, seed=2)
    out = torch.empty(transfer.pages_nbytes(src, 4), dtype=torch.uint8)
    transfer.read_pages(src, [1, 2, 3, 4], out)
    dst = kv_store(fmt, seed=None)
    transfer.write_pages(dst, [6, 7], out)               # the first two pages only (a shorter match)
    for s, d in ((1, 6), (2, 7)):
        for name in src.buffer_names:
            assert torch.equal(bits(page_of(dst, name, d)), bits(page_of(src, name, s)))
    transfer.write_pages(dst, [0], out[:src.page_bytes])  # exactly one page's bytes
    for name in src.buffer_names:
        assert torch.equal(bits(page_of(dst, name, 0)), bits(page_of(src, name, 1)))
    for name in dst.buffer_names:
        assert not bits(dst.buffer(name)[:, 1 * PT:6 * PT]).any()
    transfer.read_pages(src, [], out)                    # no pages: nothing happens
    transfer.write_pages(dst, [], out)


@pytest.mark.parametrize("fmt", ["fp32", "bf16"])
@pytest.mark.parametrize("shift", [1, 2, 3])
def test_misaligned_sources_and_destinations(fmt, shift):
    src = kv_store(fmt, seed=3)
    n = transfer.pages_nbytes(src, 2)
    big = torch.zeros(n + 8, dtype=torch.uint8)
    transfer.read_pages(src, [3, 0], big[shift:shift + n])        # into an odd offset
    assert big[shift:shift + n].numpy().tobytes() == expected_layout(src, [3, 0])
    dst = kv_store(fmt, seed=None)
    transfer.write_pages(dst, [5, 6], big[shift:shift + n])       # from an odd offset
    for s, d in ((3, 5), (0, 6)):
        for name in src.buffer_names:
            assert torch.equal(bits(page_of(dst, name, d)), bits(page_of(src, name, s)))
    # and from a read-only bytes object (a KV-disk payload), through frombuffer as the runner does
    payload = b"\0" * shift + big[shift:shift + n].numpy().tobytes()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        view = torch.frombuffer(payload, dtype=torch.uint8)[shift:]
    dst2 = kv_store(fmt, seed=None)
    transfer.write_pages(dst2, [1, 2], view)
    for s, d in ((3, 1), (0, 2)):
        for name in src.buffer_names:
            assert torch.equal(bits(page_of(dst2, name, d)), bits(page_of(src, name, s)))


# ------------------------------------------------------------------ images

MIXED = [BufferSpec("conv", (3, 5), "bfloat16"),           # 30 bytes: the next buffer starts 2 bytes off a float
         BufferSpec("recurrent", (2, 3, 4), "float32"),
         BufferSpec("extra", (7,), "bfloat16"),
         BufferSpec("gate", (5,), "float32")]


def state_store(slots=4, seed: int | None = 0) -> StateStore:
    st = StateStore(MIXED, slots)
    if seed is not None:
        g = torch.Generator().manual_seed(seed)
        for b in MIXED:
            randomize(st.buffer(b.name), g)
    return st


def test_image_layout_is_the_buffers_in_order():
    st = state_store(seed=4)
    assert st.slot_bytes == 30 + 96 + 14 + 20
    assert transfer.image_layout(st) == (("conv", "bfloat16", (3, 5), 30), ("recurrent", "float32", (2, 3, 4), 96),
                                         ("extra", "bfloat16", (7,), 14), ("gate", "float32", (5,), 20))
    out = torch.empty(st.slot_bytes, dtype=torch.uint8)
    transfer.read_image(st, 2, out)
    want = b"".join(st.buffer(b.name)[2].contiguous().view(torch.uint8).numpy().tobytes() for b in MIXED)
    assert out.numpy().tobytes() == want


@pytest.mark.parametrize("shift", [0, 1, 2, 3])
def test_image_round_trip_is_bit_exact_into_another_slot_and_store(shift):
    src = state_store(seed=5)
    big = torch.zeros(src.slot_bytes + 8, dtype=torch.uint8)
    transfer.read_image(src, 1, big[shift:shift + src.slot_bytes])
    dst = state_store(seed=None)
    transfer.write_image(dst, 3, big[shift:shift + src.slot_bytes])
    for b in MIXED:
        assert torch.equal(bits(dst.buffer(b.name)[3]), bits(src.buffer(b.name)[1])), b.name
        assert not bits(dst.buffer(b.name)[:3]).any()
    # the image API agrees: restore(image(...)) gives the same bits
    dst.restore(0, src.image(1))
    for b in MIXED:
        assert torch.equal(bits(dst.buffer(b.name)[0]), bits(dst.buffer(b.name)[3]))


def test_fp32_state_is_never_rounded_on_the_way():
    """A recurrent state with values bf16 cannot hold (SGLang #33515): the round trip keeps every fp32 bit."""
    st = StateStore([BufferSpec("recurrent", (64,), "float32")], 2)
    vals = torch.linspace(-3, 3, 64, dtype=torch.float64).to(torch.float32) + 1e-7
    st.buffer("recurrent")[0].copy_(vals)
    assert not torch.equal(vals.to(torch.bfloat16).to(torch.float32), vals)   # the test would see a rounding
    out = torch.empty(st.slot_bytes, dtype=torch.uint8)
    transfer.read_image(st, 0, out)
    transfer.write_image(st, 1, bytes_view(out.numpy().tobytes()))
    assert torch.equal(bits(st.buffer("recurrent")[1]), bits(vals))


def bytes_view(b: bytes) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(b, dtype=torch.uint8)


# ------------------------------------------------------------------ the runner's transfer step, end to end


def test_runner_moves_device_to_arena_to_bytes_and_restores_bit_exact():
    from ignisd.runner import Runner
    kv = kv_store("bf16", pages=8, seed=6)
    live = state_store(slots=2, seed=None)
    host = state_store(slots=2, seed=7)                 # retained image slots: slot 1 holds the state's image
    arena = HostArena(4 * kv.page_bytes + 4096, lock=False)
    r = Runner(None, kv, live, {"host": host}, arena)
    orig = {name: kv.buffer(name).clone() for name in kv.buffer_names}
    img = {b.name: host.buffer(b.name)[1].clone() for b in MIXED}
    # device pages [4, 1, 6] → the arena at 4096 (a to_ram move), then arena → bytes with its image (to_bytes)
    snaps: dict[str, bytes] = {}
    r._move(TierMove("to_ram", "s", pages=(4, 1, 6), dst_offset=4096), snaps)
    assert snaps == {}
    assert arena.view(4096, 3 * kv.page_bytes).numpy().tobytes() == expected_layout(kv, [4, 1, 6])
    r._move(TierMove("to_bytes", "s", src_offset=4096, nbytes=3 * kv.page_bytes, image_slot=("host", 1)), snaps)
    payload = snaps["s"]
    assert len(payload) == 3 * kv.page_bytes + host.slot_bytes
    # the pool is overwritten (the pages were handed to others), then the state is restored into other pages
    for name in kv.buffer_names:
        kv.buffer(name).zero_()
    r._restore(RestoreOp("seq", "s", None, None, None, None, 0, tier="disk", dst_pages=(0, 2, 7), payload=payload,
                         image_after_pages=True))
    for s, d in ((4, 0), (1, 2), (6, 7)):
        for name in kv.buffer_names:
            assert torch.equal(bits(page_of(kv, name, d)), bits(orig[name][:, s * PT:(s + 1) * PT]))
    for b in MIXED:
        assert torch.equal(bits(live.buffer(b.name)[0]), bits(img[b.name]))
    # from the arena (a KV-RAM restore): pages from the arena, image from the retained slot
    for name in kv.buffer_names:
        kv.buffer(name).zero_()
    live.zero(1)
    r._restore(RestoreOp("seq2", "s", None, None, "host", 1, 1, tier="ram", dst_pages=(3, 5), src_offset=4096))
    for s, d in ((4, 3), (1, 5)):                         # a 2-page prefix of the 3 in the arena
        for name in kv.buffer_names:
            assert torch.equal(bits(page_of(kv, name, d)), bits(orig[name][:, s * PT:(s + 1) * PT]))
    for b in MIXED:
        assert torch.equal(bits(live.buffer(b.name)[1]), bits(img[b.name]))
    # device pages straight to bytes (no arena) with the image of a live slot
    snaps = {}
    r._move(TierMove("to_bytes", "t", pages=(3,), image_slot=("live", 1)), snaps)
    assert snaps["t"][:kv.page_bytes] == expected_layout(kv, [3])
    assert snaps["t"][kv.page_bytes:] == b"".join(img[b.name].contiguous().view(torch.uint8).numpy().tobytes()
                                                 for b in MIXED)


# ------------------------------------------------------------------ through the engine: KV-disk files of real bytes


class ZeroModel:
    """Stands in for the decoder: zero logits (greedy token 0) for every row the batch asks for."""

    def forward(self, batch, kv, states=None):
        return torch.zeros(len(batch.logits_index), 16)


def engine_world(tmp_path, pool_pages=6, arena_pages=2):
    """A real Runner (fake model), KVStore, HostArena, CacheManager with tiers and a DiskStore; one retained
    checkpoint `s` of 128 tokens (2 pages of random bits) on the device. Returns (engine, s, its pages' bytes)."""
    from ignisd.cache.disk_store import DiskStore
    from ignisd.cache.extents import ExtentAllocator
    from ignisd.cache.manager import CacheManager
    from ignisd.cache.page_pool import PagePool
    from ignisd.cache.retained import RetainedStore
    from ignisd.cache.retained_state import Stamp
    from ignisd.cache.state_slots import StateSlots
    from ignisd.cache.tiers import Tiers
    from ignisd.engine import Engine
    from ignisd.runner import Runner
    from ignisd.scheduler import Scheduler

    geom = KVGeometry(2, 1, 8)
    kv = KVStore(get_kv_format("fp32"), geom, pool_pages, page_tokens=64)
    g = torch.Generator().manual_seed(11)
    for name in kv.buffer_names:
        randomize(kv.buffer(name), g)
    arena = HostArena(arena_pages * kv.page_bytes, lock=False)
    arena.buf.fill_(0xEE)                              # what other states left there
    pool = PagePool(pool_pages, 64)
    store = RetainedStore(Stamp("h", "fp32"), page_tokens=64, device_slots=StateSlots(0), host_slots=StateSlots(0),
                          needs_slot=False)
    tiers = Tiers(ExtentAllocator(arena.nbytes, align=kv.page_bytes), 1 << 24, kv.page_bytes, (),
                  floors={"ram": 1, "disk": 1}, page_tokens=64)
    cache = CacheManager(pool, kv.page_bytes, retained=store, tiers=tiers)
    sched = Scheduler(cache, lanes=1, context_tokens=4096, prefill_chunk=64, round_prefill_tokens=256, max_queue=8)
    disk = DiskStore(tmp_path / "kv", 1 << 24)
    disk.scan(store.stamp)
    engine = Engine(sched, Runner(ZeroModel(), kv, None, {}, arena), disk=disk)
    t = store.reserve_capture("checkpoint", list(range(5000, 5128)), priority="interactive", after_user=True)
    pages = pool.alloc(2)
    s = store.commit(t, pages).state
    want = torch.empty(2 * kv.page_bytes, dtype=torch.uint8)
    transfer.read_pages(kv, pages, want)
    return engine, s, want.numpy().tobytes(), disk


def request(rid, n_prompt, max_tokens):
    """A request that only wants pages: cache_prompt off, so it leaves no retained state of its own beside `s`."""
    from ignisd.request import Request, SamplingParams
    return Request(rid, list(range(100, 100 + n_prompt)), SamplingParams(max_tokens=max_tokens, temperature=0.0),
                   cache_prompt=False)


async def drain(q):
    import asyncio
    from ignisd.request import DoneEvent, ErrorEvent
    while True:
        ev = await asyncio.wait_for(q.get(), 10)
        if isinstance(ev, (DoneEvent, ErrorEvent)):
            return ev


def run_engine(engine, body):
    import asyncio

    async def main():
        task = asyncio.create_task(engine.run())
        try:
            await body(engine)
        finally:
            engine.stop()
            await task
        return await engine.flush_to_disk(asyncio.get_running_loop().time() + 10)
    return asyncio.run(main())


def file_pages(disk, key) -> bytes:
    _, pages, _ = disk.read_sync(key)
    return bytes(pages)


def test_a_state_demoted_to_ram_by_a_round_is_flushed_at_shutdown_bit_exact(tmp_path):
    engine, s, want, disk = engine_world(tmp_path)

    async def body(e):
        await drain(e.submit(request("a", 10, 300)))    # 5 pages: s moves to the arena in a's first round

    written = run_engine(engine, body)
    assert s.tier == "ram" and written == 1
    key = engine.cache.disk_record(s.id, any_tier=True).key
    assert file_pages(disk, key) == want
    engine.cache.check_integrity()


def test_a_state_written_to_kv_disk_by_the_engine_reads_back_bit_exact(tmp_path):
    import asyncio
    engine, s, want, disk = engine_world(tmp_path, arena_pages=0)

    async def body(e):
        await drain(e.submit(request("a", 10, 300)))    # no arena: s goes to KV-disk
        for _ in range(200):
            if not e.disk.busy and s.placement.payload is None:
                break
            await asyncio.sleep(0.01)

    assert run_engine(engine, body) == 0                # already on disk: nothing to flush
    assert s.tier == "disk" and not s.placement.in_flight and s.placement.payload is None
    assert file_pages(disk, s.placement.disk_file) == want
    engine.cache.check_integrity()


def test_flush_never_writes_an_extent_whose_move_never_ran(tmp_path):
    engine, s, want, disk = engine_world(tmp_path)

    async def body(e):
        q = e.submit(request("a", 10, 300))             # admitted at once: s is planned into the arena …
        e.cancel("a")                                   # … and a ends before any round ran that move
        await drain(q)

    run_engine(engine, body)
    assert s.tier == "ram"
    rec = engine.cache.disk_record(s.id, any_tier=True)
    path = disk.path(rec.key)
    assert not path.exists() or file_pages(disk, rec.key) == want
