"""The payload I/O of one KV-disk file: blocking writes and reads with the XXH3-128 checksum computed alongside
(DESIGN §4.5, issue 9). †: imports no torch; bytes in, bytes out. The layout and the header checks are
``cache/disk_format.py``'s; the atomic naming, the ceiling and the async face are ``cache/disk_store.py``'s.

How the bytes move, and why:

- ``cache/disk_store.py`` runs ``write_file`` and ``read_file`` as one executor job each (``read_sync`` and
  ``scan`` call them directly), not as one awaited step per chunk: every step costs a GIL handoff between the event
  loop and an executor thread, and while another thread runs Python (the loop serving requests, the forward
  worker's glue) a handoff waits out the interpreter's switch interval (5 ms). Measured on a 370 MB state in the
  daemon: 790 ms for the write as 44 awaited chunks, against ~230 ms for the same bytes written in one job.
- Within a job the payload moves in ``CHUNK_BYTES`` slices (the helper threads and the two checksum pipelines are
  ``cache/disk_hash.py``'s). A write hashes slice i on a helper thread while slice
  i + 1 is written (xxhash drops the GIL on large buffers). A read into the caller's memory goes two ways: this
  thread and a "read" helper each pread every other slice and hash it as soon as the slice before it is hashed
  (in order: one XXH3 state), so the page-cache copy, which bounds a read, runs on two cores and each hash reads
  a slice still in the CPU cache (SmolLM2 8K state, 369 MB hot: ~13 GB/s as copy-then-pipelined-hash, ~15 GB/s
  this way, against ~16 GB/s for a plain read into a touched buffer of that size without any checksum).
- A read fills the caller's buffers (``into``: the engine passes a buffer it reuses, ignisd/disk_traffic.py), or
  fresh ones: memory not touched lately costs its page faults, which on these VMs are several times the read.

Direct I/O (format version 3 aligns the payload for it):

- Why the payload bypasses the page cache (O_DIRECT), how it is switched on and off, and the alignment helpers:
  ``cache/disk_direct.py``.
- O_DIRECT needs the memory address, the length and the file offset of each transfer aligned (4096 here,
  ``disk_format.PAYLOAD_ALIGN``); the caller's buffers (arena extents, bytearrays) are not. So the payload moves
  through two page-aligned bounce buffers of CHUNK_BYTES (anonymous mmap, from a small pool: not one per file). A
  write copies slice i into one and hashes it on the helper thread while this thread pwrites slice i - 1 from the
  other (the copy holds the GIL, the pwrite does not); a slice that is one piece of the caller's memory with an
  aligned address and a whole number of blocks is written from there, without the copy (the runner allocates the
  bytes of a "to_bytes" move page-aligned for this: the copy competes with the write for the VM's memory bandwidth
  and CPUs; 368 MB alternated with a plain O_DIRECT write on this VM, noisy: 0.7-0.9x with the copy, ~0.95x
  without); the last slice is zero-padded to a 4096 multiple and the file then cut to its exact size with ftruncate;
  the prefix (a 4096 multiple) is written first with a zero digest and its block holding the digest written again at
  the end, before the fsync. A read preads each slice (its length rounded up to 4096: the last one ends short,
  exactly at the payload end) into the bounce buffer of its thread, hashes it after its predecessor and copies it
  out to the caller's views.
"""
from __future__ import annotations

import mmap
import os
import time
from concurrent.futures import Future

from ignisd.cache import disk_direct, disk_hash
from ignisd.cache.disk_format import (
    PAYLOAD_ALIGN,
    DiskRecord,
    FormatError,
    byte_view,
    payload_hasher,
    read_head,
    round_up,
)

CHUNK_BYTES = 8 << 20                    # one read, write or hash step: 8 MiB (fits the L3 it is hashed from)



def _direct_chunk() -> int:
    """The payload slice of a direct transfer: CHUNK_BYTES rounded up to the alignment."""
    return max(PAYLOAD_ALIGN, round_up(CHUNK_BYTES))


def _bounce():
    """``disk_direct.bounce`` of the payload slice (at least 2 blocks)."""
    return disk_direct.bounce(max(_direct_chunk(), 2 * PAYLOAD_ALIGN))


def chunks(*views: memoryview):
    """The byte views in order, cut into slices of at most CHUNK_BYTES."""
    for mv in views:
        for off in range(0, mv.nbytes, CHUNK_BYTES):
            yield mv[off:off + CHUNK_BYTES]


def _slices(views, size: int) -> list[list[memoryview]]:
    """The concatenation of the byte `views` cut into consecutive slices of `size` bytes (the last one shorter),
    each as the list of pieces of the views it covers (a slice may span the end of one view and the next)."""
    out, cur, room = [], [], size
    for mv in views:
        off = 0
        while off < mv.nbytes:
            n = min(room, mv.nbytes - off)
            cur.append(mv[off:off + n])
            off, room = off + n, room - n
            if room == 0:
                out.append(cur)
                cur, room = [], size
    if cur:
        out.append(cur)
    return out


def payload_targets(record: DiskRecord, into):
    """Where a read puts the payload: (pages, image) as byte memoryviews, either of fresh bytearrays of pages_bytes
    and image_bytes, or the caller's ``into`` = (pages, image) buffers. Raises ValueError unless those are writable,
    C-contiguous and exactly pages_bytes and image_bytes long."""
    if into is None:
        return memoryview(bytearray(record.pages_bytes)), memoryview(bytearray(record.image_bytes))
    views = tuple(byte_view(b) for b in into)
    if any(v.readonly for v in views) or [v.nbytes for v in views] != [record.pages_bytes, record.image_bytes]:
        raise ValueError(f"into: need writable buffers of {record.pages_bytes} and {record.image_bytes} bytes")
    return views


def read_payload(f, digest: bytes, views=None, total: int = 0) -> None:
    """Read the payload from blocking binary ``f`` (positioned at it) into ``views`` (byte memoryviews filled in
    order) or, when None, ``total`` bytes through two alternating chunk buffers, and check its XXH3-128 against
    ``digest``. With O_DIRECT (allowed, accepted by the filesystem, and ``f`` positioned at an aligned offset, as
    every version-3 payload is) the payload comes from the disk through the bounce buffers and ``f``'s descriptor
    is left in O_DIRECT mode (read nothing more through ``f`` itself); else through the page cache. Raises
    FormatError("truncated") on a short read, FormatError("payload checksum") on a mismatch."""
    base = f.tell()
    if base % PAYLOAD_ALIGN == 0 and disk_direct.try_direct(f.fileno()):
        _read_direct(f.fileno(), base, digest, views, total if views is None else sum(v.nbytes for v in views))
        return
    if views is not None and sum(v.nbytes for v in views) > CHUNK_BYTES:
        _read_two_way(f, digest, views)
        return
    if views is None:
        bufs = [memoryview(bytearray(min(CHUNK_BYTES, total))) for _ in range(2 if total > CHUNK_BYTES else 1)]
        parts = (bufs[i % len(bufs)][:min(CHUNK_BYTES, total - off)]
                 for i, off in enumerate(range(0, total, CHUNK_BYTES)))
    else:
        parts = chunks(*views)
    with disk_hash.PipelinedHash() as h:
        for chunk in parts:
            if f.readinto(chunk) != chunk.nbytes:
                raise FormatError("truncated")
            h.feed(chunk)
        if h.digest() != digest:
            raise FormatError("payload checksum")


def _pread_full(fd: int, view: memoryview, offset: int) -> None:
    """Fill `view` from byte `offset` of `fd`. Raises FormatError("truncated") at end of file."""
    while view.nbytes:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            raise FormatError("truncated")
        view, offset = view[n:], offset + n


def _read_two_way(f, digest: bytes, views) -> None:
    """``read_payload`` into `views` by two threads (this one and the "read" helper), each reading every other
    CHUNK_BYTES slice with pread and then hashing it right after its predecessor was hashed, while it is still in
    the CPU cache: the copy out of the page cache and the checksum spread over two cores. Returns only once both
    threads stopped touching `views` (also on an error: the caller may reuse the memory at once)."""
    fd, pos = f.fileno(), f.tell()
    parts = []
    for c in chunks(*views):
        parts.append((c, pos))
        pos += c.nbytes

    def step(i: int, side: int) -> memoryview:
        chunk, off = parts[i]
        _pread_full(fd, chunk, off)
        return chunk

    disk_hash.two_way(digest, len(parts), step)


def _read_direct(fd: int, base: int, digest: bytes, views, total: int) -> None:
    """``read_payload`` from O_DIRECT `fd`, the payload at aligned `base`, `total` bytes: each thread (as in
    ``_read_two_way``) preads every other aligned slice into its own bounce buffer, hashes it in order, then copies
    it into `views` (any alignment; None: only checked). Returns only once both threads stopped."""
    size = _direct_chunk()
    count = -(-total // size)
    dest = _slices(views, size) if views is not None else None
    with _bounce() as bufs:
        def step(i: int, side: int) -> memoryview:
            need = min(size, total - i * size)
            disk_direct.pread_direct(fd, bufs[side], need, base + i * size)
            return bufs[side][:need]

        def copy_out(i: int, side: int) -> None:
            pos = 0
            for piece in dest[i]:
                piece[:] = bufs[side][pos:pos + piece.nbytes]
                pos += piece.nbytes

        disk_hash.two_way(digest, count, step, copy_out if dest is not None else None)


def read_file(path, key: str, into=None) -> tuple[DiskRecord, memoryview, memoryview]:
    """(record, pages, image) of the file at `path` named for `key`, every check of the spec passed; pages and
    image as ``payload_targets`` gives them. The header is read through the page cache, the payload with O_DIRECT
    where allowed (``read_payload``). Raises FormatError (the caller deletes the file), FileNotFoundError,
    ValueError on ``into`` of the wrong size, any OSError of the disk."""
    with open(path, "rb") as f:
        record, digest = read_head(f, key)
        pages, image = payload_targets(record, into)
        read_payload(f, digest, (pages, image))
    return record, pages, image


def _open(path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)


def _write_all(fd: int, view, offset: int) -> None:
    """pwrite all of `view` at `offset` of `fd`."""
    view = memoryview(view)
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _fsync(fd: int) -> None:
    os.fsync(fd)


def write_file(path, prefix: bytes, views, digest_at: int) -> None:
    """Create `path` (mode 0600; it must not exist), write `prefix` (``disk_format.file_prefix`` with a zero digest:
    a multiple of PAYLOAD_ALIGN bytes, so that the payload is aligned) and the byte `views` in order, write their
    XXH3-128 at offset `digest_at`, fsync. With O_DIRECT where allowed and accepted (see the module notes), else
    buffered. Raises FileExistsError, any OSError of the disk (the caller removes the file), ValueError on a
    prefix that is not a multiple of the alignment."""
    prefix = memoryview(prefix)
    if prefix.nbytes % PAYLOAD_ALIGN:
        raise ValueError(f"prefix of {prefix.nbytes} bytes, not a multiple of {PAYLOAD_ALIGN}")
    fd = _open(path)
    try:
        if disk_direct.try_direct(fd):
            _write_direct(fd, prefix, views, digest_at)
        else:
            _write_all(fd, prefix, 0)
            pos = prefix.nbytes
            with disk_hash.PipelinedHash() as h:
                for chunk in chunks(*views):
                    _write_all(fd, chunk, pos)
                    h.feed(chunk)
                    pos += chunk.nbytes
                digest = h.digest()
            _write_all(fd, digest, digest_at)
        _fsync(fd)
    finally:
        os.close(fd)


def _write_direct(fd: int, prefix: memoryview, views, digest_at: int) -> None:
    """``write_file``'s bytes through O_DIRECT `fd` and the bounce buffers; the caller fsyncs."""
    size = _direct_chunk()
    h = payload_hasher()
    parts = _slices(views, size)
    total = sum(v.nbytes for v in views)
    base = prefix.nbytes
    with _bounce() as bufs:
        for off in range(0, base, size):                 # the prefix, zero digest: whole aligned blocks
            n = min(size, base - off)
            bufs[0][:n] = prefix[off:off + n]
            _write_all(fd, bufs[0][:n], off)

        def fill(i: int) -> memoryview:
            """Slice i hashed, and the view to write for it: the source itself when it is one aligned piece of
            whole blocks, else its bounce buffer holding it zero-padded to the alignment."""
            if len(parts[i]) == 1 and disk_direct.aligned(parts[i][0]):
                h.update(parts[i][0])
                return parts[i][0]
            buf, pos = bufs[i % 2], 0
            for piece in parts[i]:
                buf[pos:pos + piece.nbytes] = piece
                pos += piece.nbytes
            h.update(buf[:pos])
            end = round_up(pos)
            buf[pos:end] = bytes(end - pos)
            return buf[:end]

        def start(i: int) -> Future | None:
            if i >= len(parts):
                return None
            if sum(p.nbytes for p in parts[i]) >= disk_hash.INLINE_HASH_BYTES:
                return disk_hash.hash_thread().submit(fill, i)
            done = Future()
            done.set_result(fill(i))
            return done

        pending = start(0)
        try:
            for i in range(len(parts)):
                view = pending.result()
                pending = start(i + 1)                   # fills the other buffer, whose write is done
                _write_all(fd, view, base + i * size)
        finally:
            if pending is not None:                      # no fill still runs on a bounce buffer after this
                pending.exception()
        if total % PAYLOAD_ALIGN:
            os.ftruncate(fd, base + total)               # the last slice was padded: cut to the exact size
        lo = digest_at // PAYLOAD_ALIGN * PAYLOAD_ALIGN  # the block(s) of the prefix that hold the digest, again
        hi = round_up(digest_at + 16)
        bufs[0][:hi - lo] = prefix[lo:hi]
        bufs[0][digest_at - lo:digest_at - lo + 16] = h.digest()
        _write_all(fd, bufs[0][:hi - lo], lo)


def probe(directory, nbytes: int = 8 << 20) -> tuple[float, float, bool]:
    """(latency s, bytes/s, direct) of KV-disk I/O in `directory` as the files move (the restore floors' disk cost,
    ignisd/tier_setup.py): a 1-block file written and fsynced (latency), then `nbytes` (rounded up to
    PAYLOAD_ALIGN) written with fsync and read back through a page-aligned buffer, with O_DIRECT where this
    module would use it (`direct`: whether it did; else buffered, and the read then comes from the page cache).
    Bandwidth: bytes moved both ways over the time of the write and the read. The probe file is removed. Raises
    any OSError of the disk (no space, a read-only or missing directory)."""
    n = max(PAYLOAD_ALIGN, round_up(nbytes))
    path = os.path.join(directory, f".probe-{os.getpid()}")
    buf = mmap.mmap(-1, n)              # page-aligned; freed with its last reference (an OSError's traceback may
    buf.write(os.urandom(n))            # still hold a view of it, so it is not closed by hand)
    created = False
    try:
        fd = _open(path)
        created = True
        try:
            t0 = time.perf_counter()
            direct = disk_direct.try_direct(fd)
            _write_all(fd, memoryview(buf)[:PAYLOAD_ALIGN], 0)
            _fsync(fd)
            t1 = time.perf_counter()
            _write_all(fd, buf, 0)
            _fsync(fd)
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            disk_direct.try_direct(fd)
            _pread_full(fd, memoryview(buf), 0)
        finally:
            os.close(fd)
        t2 = time.perf_counter()
    finally:
        if created:
            try:
                os.unlink(path)
            except OSError:
                pass
    return t1 - t0, 2 * n / max(t2 - t1, 1e-6), direct
