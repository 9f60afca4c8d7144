"""The payload checksum pipelines of KV-disk I/O (DESIGN §4.5, issue 9): the helper threads, ``PipelinedHash``
(hash one slice on a helper while the caller moves the next) and ``two_way`` (two threads move alternate slices and
hash them in order). †: imports no torch. Why the bytes move this way, with measurements: ``cache/disk_io.py``.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

from ignisd.cache.disk_format import FormatError, payload_hasher

INLINE_HASH_BYTES = 1 << 20              # smaller slices are hashed on the calling thread (a handoff costs more)
_helpers: dict[str, ThreadPoolExecutor] = {}
_helper_lock = threading.Lock()


def helper(name: str) -> ThreadPoolExecutor:
    """The one-thread executor `name` ("hash": PipelinedHash's hashes; "read": two_way's other side), made on first
    use and kept for the process."""
    with _helper_lock:
        if name not in _helpers:
            _helpers[name] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"ignis-kv-{name}")
        return _helpers[name]


def hash_thread() -> ThreadPoolExecutor:
    """The helper that hashes slices beside the thread moving the next one."""
    return helper("hash")


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
            self._pending = hash_thread().submit(self._h.update, view)

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


def two_way(digest: bytes, count: int, step, after=None) -> None:
    """Run ``step(i, side)`` for i in range(count) on two threads, side 0 (this thread) taking the even i and side
    1 (the "read" helper) the odd ones; ``step`` returns the byte view to hash, which is hashed right after view
    i - 1 (one XXH3 state, in order); then ``after(i, side)`` runs (a copy out). Returns only once both threads
    stopped (also on an error). Raises the first error, FormatError("payload checksum") on a mismatch."""
    h = payload_hasher()
    hashed = [threading.Event() for _ in range(count)]
    stop = threading.Event()

    def side(first: int) -> None:
        try:
            for i in range(first, count, 2):
                if stop.is_set():
                    return
                view = step(i, first)
                if i:
                    hashed[i - 1].wait()
                if stop.is_set():
                    return
                h.update(view)
                hashed[i].set()
                if after is not None:
                    after(i, first)
        except BaseException:
            stop.set()                       # the other side stops at its next step instead of waiting for this one
            for e in hashed:
                e.set()
            raise

    other = helper("read").submit(side, 1) if count > 1 else None
    try:
        side(0)
    finally:
        err = other.exception() if other is not None else None   # waits: no thread touches a buffer after this
    if err is not None:
        raise err
    if h.digest() != digest:
        raise FormatError("payload checksum")
