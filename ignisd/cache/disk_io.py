"""The payload I/O of one KV-disk file: blocking writes and reads with the XXH3-128 checksum computed alongside
(DESIGN §4.5, issue 9). †: imports no torch; bytes in, bytes out. The layout and the header checks are
``cache/disk_format.py``'s; the atomic naming, the ceiling and the async face are ``cache/disk_store.py``'s.

How the bytes move, and why:

- ``cache/disk_store.py`` runs ``write_file`` and ``read_file`` as one executor job each (``read_sync`` and
  ``scan`` call them directly), not as one awaited step per chunk: every step costs a GIL handoff between the event
  loop and an executor thread, and while another thread runs Python (the loop serving requests, the forward
  worker's glue) a handoff waits out the interpreter's switch interval (5 ms). Measured on a 370 MB state in the
  daemon: 790 ms for the write as 44 awaited chunks, against ~230 ms for the same bytes written in one job.
- Within a job the payload moves in ``CHUNK_BYTES`` slices. A write hashes slice i on a helper thread while slice
  i + 1 is written (xxhash drops the GIL on large buffers). A read into the caller's memory goes two ways: this
  thread and a "read" helper each pread every other slice and hash it as soon as the slice before it is hashed
  (in order: one XXH3 state), so the page-cache copy, which bounds a read, runs on two cores and each hash reads
  a slice still in the CPU cache (SmolLM2 8K state, 369 MB hot: ~13 GB/s as copy-then-pipelined-hash, ~15 GB/s
  this way, against ~16 GB/s for a plain read into a touched buffer of that size without any checksum).
- A read fills the caller's buffers (``into``: the engine passes a buffer it reuses, ignisd/disk_traffic.py), or
  fresh ones: memory not touched lately costs its page faults, which on these VMs are several times the read.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from ignisd.cache.disk_format import FormatError, DiskRecord, byte_view, payload_hasher, read_head

CHUNK_BYTES = 8 << 20                    # one read, write or hash step: 8 MiB (fits the L3 it is hashed from)
INLINE_HASH_BYTES = 1 << 20              # smaller slices are hashed on the calling thread (a handoff costs more)
_helpers: dict[str, ThreadPoolExecutor] = {}
_helper_lock = threading.Lock()


def _helper(name: str) -> ThreadPoolExecutor:
    with _helper_lock:
        if name not in _helpers:
            _helpers[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ignis-kv-{name}")
        return _helpers[name]


def _hash_thread() -> ThreadPoolExecutor:
    return _helper("hash")


class PipelinedHash:
    """The payload checksum (``disk_format.payload_hasher``) of byte views fed in order; each large view is hashed
    on the helper thread while the caller moves the next one. The caller must not change a fed view until the next
    ``feed``, ``digest`` or ``close`` returns. Use ``close`` (or ``with``) so that no hash still runs on a buffer
    after an error."""

    def __init__(self):
        self._h = payload_hasher()
        self._pending: Future | None = None

    def feed(self, view: memoryview) -> None:
        """Add `view` (a byte memoryview) after everything fed before."""
        self._wait()
        if view.nbytes < INLINE_HASH_BYTES:
            self._h.update(view)
        else:
            self._pending = _hash_thread().submit(self._h.update, view)

    def digest(self) -> bytes:
        """The 16-byte digest of everything fed."""
        self._wait()
        return self._h.digest()

    def close(self) -> None:
        """Wait for the hash in flight (its errors are dropped: the caller is already failing)."""
        try:
            self._wait()
        except Exception:      # noqa: BLE001 - only reached while another error propagates
            pass

    def __enter__(self) -> PipelinedHash:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()


def chunks(*views: memoryview):
    """The byte views in order, cut into slices of at most CHUNK_BYTES."""
    for mv in views:
        for off in range(0, mv.nbytes, CHUNK_BYTES):
            yield mv[off:off + CHUNK_BYTES]


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
    ``digest``. Raises FormatError("truncated") on a short read, FormatError("payload checksum") on a mismatch."""
    if views is not None and sum(v.nbytes for v in views) > CHUNK_BYTES:
        _read_two_way(f, digest, views)
        return
    if views is None:
        bufs = [memoryview(bytearray(min(CHUNK_BYTES, total))) for _ in range(2 if total > CHUNK_BYTES else 1)]
        parts = (bufs[i % len(bufs)][:min(CHUNK_BYTES, total - off)]
                 for i, off in enumerate(range(0, total, CHUNK_BYTES)))
    else:
        parts = chunks(*views)
    with PipelinedHash() as h:
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
    fd, base = f.fileno(), f.tell()
    parts, pos = [], base
    for c in chunks(*views):
        parts.append((c, pos))
        pos += c.nbytes
    h = payload_hasher()
    hashed = [threading.Event() for _ in parts]
    stop = threading.Event()

    def side(first: int) -> None:
        try:
            for i in range(first, len(parts), 2):
                if stop.is_set():
                    return
                chunk, off = parts[i]
                _pread_full(fd, chunk, off)
                if i:
                    hashed[i - 1].wait()
                if stop.is_set():
                    return
                h.update(chunk)
                hashed[i].set()
        except BaseException:
            stop.set()                       # the other side stops at its next step instead of waiting for this one
            for e in hashed:
                e.set()
            raise

    other = _helper("read").submit(side, 1)
    try:
        side(0)
    finally:
        err = other.exception()              # waits: no thread writes into `views` after this returns
    if err is not None:
        raise err
    if h.digest() != digest:
        raise FormatError("payload checksum")


def read_file(path, key: str, into=None) -> tuple[DiskRecord, memoryview, memoryview]:
    """(record, pages, image) of the file at `path` named for `key`, every check of the spec passed; pages and
    image as ``payload_targets`` gives them. Raises FormatError (the caller deletes the file), FileNotFoundError,
    ValueError on ``into`` of the wrong size, any OSError of the disk."""
    with open(path, "rb") as f:
        record, digest = read_head(f, key)
        pages, image = payload_targets(record, into)
        read_payload(f, digest, (pages, image))
    return record, pages, image


def _open(path) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)


def _write_all(fd: int, view) -> None:
    view = memoryview(view)
    while view.nbytes:
        view = view[os.write(fd, view):]


def _fsync(fd: int) -> None:
    os.fsync(fd)


def write_file(path, prefix: bytes, views, digest_at: int) -> None:
    """Create `path` (mode 0600; it must not exist), write `prefix` (``disk_format.file_prefix`` with a zero digest)
    and the byte `views` in order, write their XXH3-128 at offset `digest_at`, fsync. Raises FileExistsError, any
    OSError of the disk (the caller removes the file)."""
    fd = _open(path)
    try:
        _write_all(fd, prefix)
        with PipelinedHash() as h:
            for chunk in chunks(*views):
                _write_all(fd, chunk)
                h.feed(chunk)
            digest = h.digest()
        os.lseek(fd, digest_at, os.SEEK_SET)
        _write_all(fd, digest)
        _fsync(fd)
    finally:
        os.close(fd)
