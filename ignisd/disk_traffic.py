"""KV-disk traffic off the round path (DESIGN §2, §4.5): the engine's writes, reads and deletes of state files.

†: imports no torch. The round that runs a "to_bytes" move hands the state's bytes to `DiskTraffic.written_out`;
the file is written by a task on the event loop (aiofiles through cache/disk_store.py: temporary name, fsync,
rename; the payload with O_DIRECT where the filesystem allows it, cache/disk_io.py) while the next rounds run,
and until it is in place a restore uses the bytes in memory. A waiting request whose best match is on KV-disk gets
the file read back and verified by `poll` before it is admitted. A fault (no
space, an I/O error, a file removed underneath, a corrupt file) drops that state, counts the error, logs one
warning, and serving goes on. The "live" files of evicted live sequences (cache/live_eviction.py) travel the same
way, named by their sequence id; a fault there makes the scheduler recompute that sequence.
"""
from __future__ import annotations

import asyncio
import time

from ignisd.log import get_logger
from ignisd.vocab import LIVE

log = get_logger("tier")


class DiskTraffic:
    """The KV-disk I/O of one engine.

    cache: the CacheManager. disk: the DiskStore (None: KV-disk off; every method is then a no-op). wake: called when
    a read or write finished (the engine's loop wakes to admit or to run). metrics: ignisd.metrics.Metrics or None.
    arena: a writable byte memoryview of the whole KV-RAM arena (``HostArena.memory()``), or None: a read goes into
    a free extent of it when one is large enough (``CacheManager.lend_extent``), else into a reused or new buffer.
    """

    def __init__(self, cache, disk, wake, metrics=None, arena: memoryview | None = None):
        self.cache = cache
        self.disk = disk
        self.wake = wake
        self.metrics = metrics
        self.arena = arena
        self._tasks: dict[str, asyncio.Task] = {}     # state id -> its latest write or read in flight
        self._running: set[asyncio.Task] = set()      # every one in flight (a live sequence evicted again can have an
                                                      # older file's write still landing)
        # read buffers: a fresh one costs its page faults (on these VMs memory not touched lately fills at ~1-2 GB/s,
        # a warm buffer at ~15 GB/s), so the largest buffer that no restore can read any more (that of a finished
        # restore, or the bytes of a written file) is kept for the next read
        # the best read target is an arena extent: allocated and touched (mlock'ed) at load, so even the first read
        # after a restart pays no page faults; it is lent only while a restore can read it
        self._lent: dict[str, tuple[object, memoryview]] = {}   # state id -> (buffer, the payload view of it)
        self._loans: dict[int, tuple[str, memoryview]] = {}     # arena offset -> (state id, the payload view of it)
        self._spare = None

    @property
    def busy(self) -> bool:
        """A read or write is in flight."""
        return self.in_flight > 0

    @property
    def in_flight(self) -> int:
        """KV-disk file reads and writes started and not yet settled (the `status` disk row's ``in_flight``)."""
        return sum(1 for t in self._running if not t.done())

    def written_out(self, snapshots: dict[str, bytes]) -> None:
        """A round produced these states' bytes: keep them for restores and start writing their files."""
        for sid, payload in snapshots.items():
            if self.cache.bytes_ready(sid, payload) and self.disk is not None:
                self._start(sid, self._write(sid, payload))

    def poll(self) -> None:
        """Start reading the files that waiting requests need, and remove the files of dropped states."""
        if self.disk is None:
            return
        self._reclaim()                     # arena extents no restore needs any more go back at once
        for key in self.cache.take_disk_deletes():
            try:
                self.disk.delete(key)
            except OSError as e:
                self._fault("delete", key, e)
        for sid in self.cache.loads_wanted():
            if sid not in self._tasks or self._tasks[sid].done():
                self._start(sid, self._read(sid))

    def _read_buffer(self, nbytes: int):
        """A buffer of at least `nbytes` for a KV-disk read: the spare one when it is large enough, else a new one.
        First takes back the buffers that no restore can read any more."""
        self._reclaim()
        if self._spare is not None and memoryview(self._spare).nbytes >= nbytes:
            buf, self._spare = self._spare, None
            return buf
        return bytearray(nbytes)

    def _read_target(self, sid: str, nbytes: int) -> tuple[memoryview, int | None, object]:
        """Where a read of `nbytes` for `sid` lands: (a byte view of exactly `nbytes`, the arena offset lent for it
        or None, the buffer under the view when not the arena). An arena extent when one is free, else
        ``_read_buffer``."""
        self._reclaim()
        if self.arena is not None:
            off = self.cache.lend_extent(sid, nbytes)
            if off is not None:
                return self.arena[off:off + nbytes], off, None
        buf = self._read_buffer(nbytes)
        return memoryview(buf)[:nbytes], None, buf

    def _reclaim(self) -> None:
        """Give back the lent arena extents and keep the largest of the lent buffers that no restore can read any
        more (``CacheManager.payload_free``), the buffer as the spare; let the other buffers go."""
        for off, (sid, view) in list(self._loans.items()):
            if self.cache.payload_free(sid, view):
                del self._loans[off]
                self.cache.return_extent(off)
        for sid, (buf, view) in list(self._lent.items()):
            if self.cache.payload_free(sid, view):
                del self._lent[sid]
                if self._spare is None or memoryview(buf).nbytes > memoryview(self._spare).nbytes:
                    self._spare = buf

    def _start(self, sid: str, coro) -> None:
        task = self._tasks[sid] = asyncio.ensure_future(coro)
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _settled(self, sid: str) -> None:
        """The current task of `sid` ends: forget it (unless a newer one of `sid` replaced it), wake the engine."""
        if self._tasks.get(sid) is asyncio.current_task():
            del self._tasks[sid]
        self.wake()

    async def _write(self, sid: str, payload: bytes) -> None:
        record = self.cache.disk_record(sid)
        if record is None:
            return
        n = record.pages_bytes
        t0 = time.perf_counter()
        try:
            size = await self.disk.write(record, memoryview(payload)[:n], memoryview(payload)[n:])
        except OSError as e:
            self._fault("write", sid, e)
            self.cache.disk_failed(sid, record.key)
        else:
            if not self.cache.disk_written(sid, size, record.key):      # dropped (or restored) while written
                self._delete_quietly(record.key)
            else:
                self._retire(sid, record, payload)
                if self.metrics is not None:
                    self.metrics.tier_disk_writes.inc()
                    self.metrics.tier_disk_write_bytes.inc(size)
                    self.metrics.tier_disk_write_seconds.inc(time.perf_counter() - t0)
        finally:
            self._settled(sid)

    async def _read(self, sid: str) -> None:
        key = self.cache.disk_file(sid)
        if key is None:
            return
        t0 = time.perf_counter()
        off = None
        try:
            want = self.cache.disk_record(sid)
            if want is None:
                return
            total = want.pages_bytes + want.image_bytes
            view, off, buf = self._read_target(sid, total)           # one buffer: pages, then the image
            job = asyncio.ensure_future(self.disk.read(key, into=(view[:want.pages_bytes], view[want.pages_bytes:])))
            try:
                record, _, _ = await asyncio.shield(job)
            except asyncio.CancelledError:
                if off is not None:          # the read may still be writing into the extent: give it back after
                    job.add_done_callback(lambda _j, o=off: self.cache.return_extent(o))
                    off = None
                raise
            if record != want:
                raise OSError(f"KV-disk file {key} holds another state than the index says")
        except OSError as e:
            self._fault("read", sid, e)
            self.cache.disk_failed(sid, key)
        else:
            if self.metrics is not None and off is not None:
                self.metrics.tier_disk_reads_arena.inc()
            if self.cache.bytes_ready(sid, view):
                if off is not None:
                    self._loans[off], off = (sid, view), None
                else:
                    self._lent[sid] = (buf, view)
            if self.metrics is not None:
                self.metrics.tier_disk_reads.inc()
                self.metrics.tier_disk_read_bytes.inc(total)
                self.metrics.tier_disk_read_seconds.inc(time.perf_counter() - t0)
        finally:
            if off is not None:              # not handed to a restore (a fault, or the state went): back at once
                self.cache.return_extent(off)
            self._settled(sid)

    def _retire(self, sid: str, record, payload) -> None:
        """A file of `sid` landed from `payload`: its buffer becomes a read buffer once no restore can read it
        (a live sequence's bytes are left to its own restore)."""
        view = memoryview(payload)
        if record.kind != LIVE and not view.readonly and view.c_contiguous:
            self._reclaim()
            self._lent[sid] = (view if view.format == "B" and view.ndim == 1 else view.cast("B"), payload)

    def _delete_quietly(self, key: str) -> None:
        try:
            self.disk.delete(key)
        except OSError as e:
            self._fault("delete", key, e)

    def _fault(self, op: str, what: str, e: OSError) -> None:
        log.warning("kv_disk_error", op=op, state=what, error=f"{type(e).__name__}: {e}")
        if self.metrics is not None:
            self.metrics.tier_disk_errors.inc()

    async def flush(self, snapshots: dict[str, bytes], deadline: float) -> int:
        """Write the files of a shutdown flush (the bytes of ``CacheManager.plan_flush``'s moves), in order, until
        `deadline` (loop time); the bytes of an evicted live sequence among them are skipped. Returns how many were
        written."""
        loop = asyncio.get_running_loop()
        done = 0
        for sid, payload in snapshots.items():
            record = self.cache.disk_record(sid, any_tier=True)
            if record is None or record.kind == LIVE or loop.time() >= deadline:
                continue                   # a live sequence's file would not outlive the process anyway
            n = record.pages_bytes
            try:
                await asyncio.wait_for(self.disk.write(record, memoryview(payload)[:n], memoryview(payload)[n:]),
                                       max(0.01, deadline - loop.time()))
                done += 1
            except (OSError, asyncio.TimeoutError) as e:
                self._fault("flush", sid, e if isinstance(e, OSError) else OSError("shutdown grace ran out"))
        return done

    async def drain(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the reads and writes in flight (shutdown)."""
        pending = [t for t in self._running if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
