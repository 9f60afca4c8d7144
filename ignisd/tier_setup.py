"""Building the KV-RAM and KV-disk tiers at load, and indexing KV-disk files again after a restart (DESIGN §4.5).

The arena is allocated whole (and mlock'ed) here; the KV-disk directory is scanned for files of this model and
format (stamp): those are indexed as retained states on the disk tier, a file that fails its checksum or is
truncated is deleted and counted, a file of another stamp is left alone. The restore floors come from a cost model
over what is measured here: the prefill rate of one page through the loaded model and the copy bandwidth of each
tier (cache/tiers.py `default_floor`), unless `reuse.restore_floor_ram` / `reuse.restore_floor_disk` set them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ignisd.cache import disk_io
from ignisd.cache.disk_store import DiskStore
from ignisd.cache.extents import ExtentAllocator
from ignisd.cache.host_arena import HostArena
from ignisd.cache.placement import Placement
from ignisd.cache.retained_state import RetainedState
from ignisd.cache.tiers import TierCost, Tiers, default_floor
from ignisd.log import get_logger
from ignisd.vocab import DISK, PAGE_TOKENS, RAM

log = get_logger("tier")


@dataclass
class TierSetup:
    """What `build_tiers` made: tiers (the policy and accounting), arena (HostArena or None), disk (DiskStore or
    None), info (fields for the vram_plan line)."""

    tiers: Tiers
    arena: HostArena | None
    disk: DiskStore | None
    info: dict = field(default_factory=dict)


def _ram_cost(arena: HostArena) -> TierCost:
    """Copy bandwidth of the arena: 8 MiB (or the arena) in and out once."""
    n = min(8 << 20, arena.nbytes // 2)
    if n <= 0:
        return TierCost(0.0, 1e10)
    src = torch.empty(n, dtype=torch.uint8)
    t0 = time.perf_counter()
    arena.view(0, n).copy_(src)
    src.copy_(arena.view(0, n))
    dt = max(time.perf_counter() - t0, 1e-6)
    return TierCost(0.0, 2 * n / dt)


def _disk_cost(directory: str) -> tuple[TierCost, str]:
    """(latency and bandwidth, I/O mode) of the KV-disk directory as its files move (cache/disk_io.probe: a 1-block
    file fsynced, then 8 MiB written, fsynced and read back, with O_DIRECT where the files use it). The mode is
    "direct" or "buffered"; on an OSError (a full or read-only disk) a guess (10 ms, 100 MB/s) and "unknown"."""
    try:
        lat, bw, direct = disk_io.probe(directory)
    except OSError:
        return TierCost(0.01, 1e8), "unknown"
    return TierCost(lat, bw), "direct" if direct else "buffered"


def build_tiers(cfg, page_bytes: int, bytes_per_token: int, image_layout: tuple, prefill_tok_s: float) -> TierSetup:
    """The KV-RAM arena (`reuse.kv_host_pool_bytes`; 0 = no KV-RAM tier), the KV-disk store (`kv.disk_bytes` under
    `kv.disk_dir`; 0 = off) and the Tiers policy with its restore floors. Raises OSError when the KV-disk directory
    cannot be made or is locked by another daemon."""
    rc = cfg.reuse
    arena = HostArena(rc.kv_host_pool_bytes) if rc.kv_host_pool_bytes else None
    disk = DiskStore(cfg.kv.disk_dir, cfg.kv.disk_bytes) if cfg.kv.disk_bytes else None
    floors, info = {}, {"kv_ram_bytes": rc.kv_host_pool_bytes, "kv_ram_locked": bool(arena and arena.locked),
                        "kv_disk_bytes": cfg.kv.disk_bytes}
    if arena is not None:
        floors[RAM] = rc.restore_floor_ram or default_floor(prefill_tok_s, bytes_per_token, _ram_cost(arena))
    if disk is not None:
        cost, info["kv_disk_io"] = _disk_cost(cfg.kv.disk_dir)
        floors[DISK] = rc.restore_floor_disk or default_floor(prefill_tok_s, bytes_per_token, cost)
        info["kv_disk_dir"] = cfg.kv.disk_dir
    info.update({f"restore_floor_{k}": v for k, v in floors.items()})
    tiers = Tiers(ExtentAllocator(arena.nbytes) if arena is not None else None, cfg.kv.disk_bytes, page_bytes,
                  image_layout, floors=floors, page_tokens=PAGE_TOKENS)
    return TierSetup(tiers, arena, disk, info)


def index_disk(setup: TierSetup, store, clock=time.monotonic) -> dict:
    """Index the KV-disk files of this model and format as retained states on the disk tier (after a restart).
    Returns the scan's counts (usable, corrupt, foreign, stale_tmp, live: files of evicted live sequences of an earlier
    process, removed; errors), for the log."""
    disk = setup.disk
    if disk is None:
        return {}
    # with reuse.prompt off nothing is restored, but the scan still removes what a killed process left (temporaries,
    # live sequences' files) and counts the other files against the ceiling (as foreign: no stamp matches)
    res = disk.scan(store.stamp if store is not None else ("", "", ""))
    now_wall, now = time.time(), clock()
    for key, rec, size in (res.usable if store is not None else ()):
        if rec.page_bytes != setup.tiers.page_bytes or tuple(rec.image_layout) != setup.tiers.image_layout:
            continue                                   # same stamp, other geometry: never restored
        try:
            age = max(0.0, now_wall - disk.path(key).stat().st_mtime)
        except OSError:
            continue
        st = RetainedState(f"disk-{key[:16]}", rec.kind, tuple(rec.tokens), tuple(rec.image_spans),
                           Placement(DISK, disk_file=key, disk_bytes=size), rec.priority, now - age, now - age,
                           store.stamp, after_user=rec.after_user)
        if st.id in store:
            continue
        store.add(st)
        setup.tiers.disk_used += size
    setup.tiers.disk_foreign = res.foreign_bytes
    counts = {"usable": len(res.usable), "corrupt": res.corrupt, "foreign": res.foreign,
              "stale_tmp": res.stale_tmp, "live": res.live, "errors": res.errors}
    log.info("kv_disk_index", **counts)
    return counts


def measure_prefill(runner, kv, states) -> float:
    """Prefill tokens/s of one page through the loaded model, on pool page 0 and live slot 0 while nothing holds them
    (both are written over by whoever takes them next): the best of two forwards after a warm-up one (the first
    forward pays one-time costs: lazily unpacked quantized weights, allocator growth, kernel selection, ~100x a
    warm one). 1,000 when it cannot run."""
    from ignisd.model.batch import ForwardBatch, SeqChunk
    try:
        chunk = SeqChunk(token_ids=[0] * PAGE_TOKENS, start=0, page_ids=[0], logits="last",
                         state_slot=0 if states is not None else None)
        with torch.inference_mode():
            best = float("inf")
            for i in range(3):
                if states is not None:
                    states.zero(0)
                t0 = time.perf_counter()
                runner.model.forward(ForwardBatch.build([chunk], kv.page_tokens), kv, states)
                if i:
                    best = min(best, time.perf_counter() - t0)
            if states is not None:
                states.zero(0)
        return PAGE_TOKENS / max(best, 1e-6)
    except Exception:  # a warm-up that cannot run must not stop the start
        return 1000.0

