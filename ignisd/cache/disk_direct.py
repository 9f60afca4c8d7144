"""O_DIRECT for KV-disk files (DESIGN §4.5, issue 9): whether it is used, switching a descriptor to it, and what
its transfers need (aligned sizes and memory, page-aligned bounce buffers, reads that end short only at the end of
the file). †: imports no torch. The payload moves through these in ``cache/disk_io.py``.

- The payload bypasses the page cache (O_DIRECT) when the filesystem allows it. The KV-RAM arena already is ignis's
  host-memory cache of these bytes, so a page-cache copy of a file only duplicates it (and on a workstation it
  evicts other programs' useful page cache for bytes ignis reads again only after they left the arena). A read
  with O_DIRECT verifies the checksum of what is really on the disk, not of a cached copy. And it is faster where
  the page cache is slow to fill: measured on this VM (ext4 on virtio), 368 MB written with fsync after a 5 s idle
  pause: ~300 MB/s buffered (the page cache fills guest memory the host backs lazily), ~2500 MB/s with O_DIRECT;
  read back from the disk with O_DIRECT ~2200 MB/s. (A hot page-cache read is memory bandwidth, ~15 GB/s, but a
  file is read back once, after its bytes left KV-RAM, and is then in the arena again.)
- O_DIRECT is set on the descriptor with ``fcntl(F_SETFL)`` once the file is open (a write creates it with
  O_EXCL as before; a read has already read the small header through the page cache): a filesystem that refuses
  it (EINVAL: some FUSE, overlay or older tmpfs) keeps the buffered descriptor, the path of format version 2, with
  nothing left to undo (an ``open(O_CREAT | O_EXCL | O_DIRECT)`` refused there may already have created the file).
  ``IGNIS_KV_DISK_DIRECT=0`` in the environment forces buffered I/O (read at each file).
"""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
import threading
from contextlib import contextmanager

from ignisd.cache.disk_format import PAYLOAD_ALIGN, FormatError, round_up

DIRECT_ENV = "IGNIS_KV_DISK_DIRECT"      # "0": buffered I/O even where O_DIRECT works
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_POOL_KEEP = 2                           # idle bounce-buffer pairs kept for the next file
_pool: list[tuple[int, tuple[mmap.mmap, mmap.mmap]]] = []
_pool_lock = threading.Lock()


def direct_enabled() -> bool:
    """Whether KV-disk I/O tries O_DIRECT: the platform has it and ``IGNIS_KV_DISK_DIRECT`` is not "0"."""
    return bool(_O_DIRECT) and os.environ.get(DIRECT_ENV, "1").strip() != "0"


def set_direct(fd: int) -> None:
    """Turn O_DIRECT on for `fd`. Raises OSError (EINVAL where the filesystem does not support it)."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | _O_DIRECT)


def try_direct(fd: int) -> bool:
    """Whether `fd` now does O_DIRECT I/O: allowed (``direct_enabled``) and accepted by the filesystem. Any other
    error than EINVAL (or EOPNOTSUPP) is raised."""
    if not direct_enabled():
        return False
    try:
        set_direct(fd)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return False
        raise
    return True


def aligned(view: memoryview) -> bool:
    """Whether O_DIRECT can write `view` as it is: its address and length are multiples of PAYLOAD_ALIGN (False
    without numpy, which tells the address: the control plane may run without it)."""
    if view.nbytes == 0 or view.nbytes % PAYLOAD_ALIGN:
        return False
    try:
        import numpy
    except ImportError:
        return False
    return numpy.frombuffer(view, dtype=numpy.uint8).ctypes.data % PAYLOAD_ALIGN == 0


@contextmanager
def bounce(size: int):
    """Two page-aligned bounce buffers (byte memoryviews of anonymous mmaps) of `size` bytes, from the pool
    (allocated when none of that size is free; up to _POOL_KEEP idle pairs are kept)."""
    with _pool_lock:
        found = next((i for i, (n, _) in enumerate(_pool) if n == size), None)
        maps = _pool.pop(found)[1] if found is not None else None
    if maps is None:
        maps = (mmap.mmap(-1, size), mmap.mmap(-1, size))
    views = tuple(memoryview(m) for m in maps)
    try:
        yield views
    finally:
        for v in views:
            v.release()
        with _pool_lock:
            if len(_pool) < _POOL_KEEP:
                _pool.append((size, maps))


def pread_direct(fd: int, buf: memoryview, need: int, offset: int) -> None:
    """Read `need` bytes at aligned `offset` of O_DIRECT `fd` into aligned `buf`, asking for `need` rounded up to
    the alignment: a last slice ends short, at the end of the file, which must not come before `need` bytes.
    Raises FormatError("truncated")."""
    want, got = round_up(need), 0
    while got < need:
        n = os.preadv(fd, [buf[got:want]], offset + got)
        got += n
        if n == 0 or (got < need and got % PAYLOAD_ALIGN):     # the end of the file (an aligned read ends only
            raise FormatError("truncated")                     # short there)
