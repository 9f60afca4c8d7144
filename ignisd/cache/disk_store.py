"""KV-disk: one verified file per retained state under one directory, within a byte ceiling (DESIGN §4.5, issue 9).

†: imports no torch; bytes in, bytes out. The file format (version 3: magic, version, header length, orjson header,
header crc32, payload length, payload XXH3-128, zero padding, then pages and image from a 4096-aligned offset) is
specified in ``cache/disk_format.py``; files are named ``<DiskRecord.key>.ignkv``. The payload bypasses the page
cache (O_DIRECT) where the filesystem allows it; ``IGNIS_KV_DISK_DIRECT=0`` forces buffered I/O (the reasons are
in ``cache/disk_direct.py``).

Rules of the store:

- Serving I/O is async, so the round loop never waits on the disk: ``write`` and ``read`` run the payload I/O of
  ``cache/disk_io.py`` as one job in the default executor (aiofiles' wrap), the rename and directory fsync as two
  more. ``read_sync``, ``scan`` and ``delete`` are synchronous, for start-up, shutdown or a
  worker thread. One event loop drives a store (its accounting is not locked).
- ``write`` is atomic: ``<key>.ignkv.tmp-<pid>-<n>`` is written (the payload hashed while it is written), flushed,
  fsynced, renamed to ``<key>.ignkv`` and the directory fsynced. When it raises, no file of that write is left
  (the temporary is removed; a rename already done is undone, which also removes an older file of the same key)
  and the accounting is as before. Cancelling a write lets the I/O step in flight finish, then undoes it the same
  way and re-raises the CancelledError. Two writes of one key in flight at once: the last rename wins.
- ``read`` verifies everything the spec lists before returning bytes; a file that fails is deleted and
  ``CorruptFile`` raised, so it is never used twice. The key binds the stamp: a file read under the key the caller
  computed from its own record has the caller's stamp.
- Ceiling: ``used_bytes`` = this stamp's usable files (found by ``scan`` or written since) + the files ``scan`` kept
  without using them (another stamp, or unreadable: they occupy the same disk, so they count) + the bytes reserved
  by writes in flight. A write that would pass ``capacity_bytes`` is refused (``DiskFull``) before any byte moves;
  an overwrite of a key counts both files until its rename.
- One store per directory: the constructor takes an exclusive ``flock`` on ``<dir>/.lock`` (``DirectoryLocked``),
  which is what lets ``scan`` remove every temporary file not its own as the remains of a killed writer.
- Every fault is an OSError: DiskFull (ENOSPC), CorruptFile (EBADMSG), DirectoryLocked (EBUSY), FileNotFoundError
  (a file removed underneath) and whatever the OS raises (ENOSPC on a full filesystem, EROFS, EACCES, EIO). The
  caller counts it and drops the state. A caller error (bytes that do not match the record, a malformed key) is a
  ValueError.
"""
from __future__ import annotations

import asyncio
import errno
import fcntl
import itertools
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiofiles.os

from ignisd.cache.disk_format import (
    DIGEST_BYTES,
    SUFFIX,
    DiskRecord,
    FormatError,
    VersionError,
    byte_view,
    digest_offset,
    encode_header,
    expected_size,
    file_prefix,
    read_head,
    stamp_of,
)
from ignisd.cache.disk_io import read_file, read_payload, write_file
from ignisd.vocab import LIVE

LOCK_NAME = ".lock"
TMP_MARK = SUFFIX + ".tmp-"
_KEY = re.compile(r"[0-9a-f]{64}")
_write_file = aiofiles.os.wrap(write_file)
_read_file = aiofiles.os.wrap(read_file)


class DiskFull(OSError):
    """The ceiling refused a write: ``need`` bytes with ``used`` of ``capacity`` taken (bytes). errno ENOSPC."""

    def __init__(self, need: int, used: int, capacity: int):
        super().__init__(errno.ENOSPC, f"kv-disk ceiling: {need} bytes needed, {used} of {capacity} used")
        self.need, self.used, self.capacity = need, used, capacity


class CorruptFile(OSError):
    """A file failed verification and was deleted. path: the file; reason: the check that failed ("magic",
    "version N", "truncated", "header crc", "header schema: ...", "key", "name", "payload length",
    "trailing bytes", "padding", "payload checksum"). errno EBADMSG."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(errno.EBADMSG, f"corrupt kv-disk file ({reason})", str(path))
        self.path, self.reason = Path(path), reason


class DirectoryLocked(OSError):
    """Another store (this process or another) holds the directory's lock. errno EBUSY."""

    def __init__(self, directory: Path):
        super().__init__(errno.EBUSY, "kv-disk directory in use by another store", str(directory))


@dataclass
class ScanResult:
    """The answer of ``scan``. usable: [(key, record, file bytes)] of this stamp, sorted by key. foreign: files of
    another stamp (kept, never returned), foreign_bytes their bytes plus those of unreadable files. corrupt: files
    deleted for failing verification. stale_tmp: temporary files of a killed writer removed. live: files of evicted
    live sequences (kind "live", of an earlier process: any stamp) removed. errors: files that
    could not be read or removed (an OSError; kept). reasons: (file name, reason) of each corrupt or error file."""

    usable: list[tuple[str, DiskRecord, int]] = field(default_factory=list)
    foreign: int = 0
    foreign_bytes: int = 0
    corrupt: int = 0
    stale_tmp: int = 0
    live: int = 0
    errors: int = 0
    reasons: list[tuple[str, str]] = field(default_factory=list)


class DiskStore:
    """The KV-disk directory. directory: created (mode 0700, parents as needed) if missing. capacity_bytes: the
    ceiling in bytes (>= 0). Raises ValueError on a negative capacity, DirectoryLocked when another store holds
    the directory, OSError when it cannot be created. Call ``close`` (or use ``with``) to release the lock."""

    def __init__(self, directory: str | Path, capacity_bytes: int):
        if type(capacity_bytes) is not int or capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be an int >= 0, got {capacity_bytes!r}")
        self.directory = Path(directory)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = os.fdopen(os.open(self.directory / LOCK_NAME, os.O_RDONLY | os.O_CREAT, 0o600), "rb")
        try:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            raise DirectoryLocked(self.directory) from None
        self._capacity = capacity_bytes
        self._files: dict[str, int] = {}      # key -> file bytes, this stamp's usable files
        self._kept = 0                        # bytes of files kept but not usable (foreign stamp, unreadable)
        self._reserved = 0                    # bytes of writes in flight
        self._live_tmp: set[str] = set()
        self._seq = itertools.count()
        self.stamp: tuple[str, str, str] | None = None   # set by scan

    # -- accounting ---------------------------------------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int:
        """The ceiling, bytes."""
        return self._capacity

    @property
    def used_bytes(self) -> int:
        """Bytes counted against the ceiling: usable files + kept foreign/unreadable files + writes in flight."""
        return sum(self._files.values()) + self._kept + self._reserved

    @property
    def free_bytes(self) -> int:
        """capacity_bytes - used_bytes, never below 0."""
        return max(0, self._capacity - self.used_bytes)

    def fits(self, nbytes: int) -> bool:
        """Whether a file of ``nbytes`` bytes (``disk_format.file_bytes(record)``) would pass the ceiling now."""
        return self.used_bytes + nbytes <= self._capacity

    def __contains__(self, key: str) -> bool:
        return key in self._files

    def __len__(self) -> int:
        return len(self._files)

    def size_of(self, key: str) -> int | None:
        """The file bytes of a usable key, or None."""
        return self._files.get(key)

    def path(self, key: str) -> Path:
        """The file of ``key``. Raises ValueError unless key is 64 lowercase hex (no path ever leaves the dir)."""
        if type(key) is not str or not _KEY.fullmatch(key):
            raise ValueError(f"not a kv-disk key: {key!r}")
        return self.directory / (key + SUFFIX)

    # -- write ----------------------------------------------------------------------------------------------------
    async def write(self, record: DiskRecord, pages, image) -> int:
        """Write ``record`` with its ``pages`` (n_pages * page_bytes bytes) and ``image`` (the image_layout bytes in
        order; b"" when none) as ``<key>.ignkv``; returns the file's bytes. Raises ValueError when the lengths do
        not match the record, DiskFull when the ceiling refuses it (nothing written), any OSError of the disk
        (nothing left). See the module rules for atomicity and cancellation."""
        job = asyncio.ensure_future(self._write(record, byte_view(pages), byte_view(image)))
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            while not job.done():
                try:
                    await asyncio.wait([job])
                except asyncio.CancelledError:
                    pass
            if not job.cancelled() and job.exception() is None:
                self._unlink(record.key)
            raise

    async def _write(self, record: DiskRecord, pages: memoryview, image: memoryview) -> int:
        if pages.nbytes != record.pages_bytes or image.nbytes != record.image_bytes:
            raise ValueError(f"pages {pages.nbytes} / image {image.nbytes} bytes, record says "
                             f"{record.pages_bytes} / {record.image_bytes}")
        key = record.key
        final = self.path(key)
        header = encode_header(record)
        size = expected_size(len(header), record)
        if not self.fits(size):
            raise DiskFull(size, self.used_bytes, self._capacity)
        tmp = self.directory / f"{key}{TMP_MARK}{os.getpid()}-{next(self._seq)}"
        self._reserved += size
        self._live_tmp.add(tmp.name)
        renamed = False
        try:
            await _write_file(tmp, file_prefix(header, record.payload_bytes, bytes(DIGEST_BYTES)), (pages, image),
                              digest_offset(len(header)))
            await aiofiles.os.rename(tmp, final)
            renamed = True
            self._files[key] = size
            await _afsync_dir(self.directory)
            return size
        except BaseException:
            if renamed:
                self._unlink(key)
            else:
                _remove(tmp)
            raise
        finally:
            self._reserved -= size
            self._live_tmp.discard(tmp.name)

    # -- read -----------------------------------------------------------------------------------------------------
    async def read(self, key: str, into=None) -> tuple[DiskRecord, memoryview, memoryview]:
        """(record, pages, image) of ``key``, every check of the spec passed. pages and image are byte memoryviews
        of fresh bytearrays (n_pages * page_bytes and image_bytes long), or, with ``into`` = (pages
        buffer, image buffer) (writable, C-contiguous, exactly those sizes: e.g. arena slices), of those buffers
        filled in place (on any error their contents are undefined). Raises CorruptFile (the file is deleted),
        FileNotFoundError (no such file, or removed underneath), ValueError on a malformed key or ``into`` of the
        wrong size (the file is kept), any OSError of the disk."""
        path = self.path(key)
        with self._verifying(key, path):
            return await _read_file(path, key, into)

    def read_sync(self, key: str, into=None) -> tuple[DiskRecord, memoryview, memoryview]:
        """``read`` without the event loop (start-up, a worker thread). Same arguments, answers and errors."""
        path = self.path(key)
        with self._verifying(key, path):
            return read_file(path, key, into)

    @contextmanager
    def _verifying(self, key: str, path: Path):
        """A failed check deletes the file and raises CorruptFile; a missing file is forgotten and re-raised."""
        try:
            yield
        except FormatError as e:
            self._unlink(key)
            raise CorruptFile(path, e.reason) from None
        except FileNotFoundError:
            self._files.pop(key, None)
            raise

    # -- delete, scan, close -----------------------------------------------------------------------------------
    def delete(self, key: str) -> None:
        """Remove ``key``'s file and stop counting it; no error when it is already gone. Raises ValueError on a
        malformed key, an OSError when the file exists but cannot be removed (it is then still counted)."""
        self.path(key)
        self._unlink(key, quiet=False)

    def scan(self, stamp, *, verify_payload: bool = True) -> ScanResult:
        """Index the directory for ``stamp`` (a Stamp-like object with structural_hash / kv_format / drafter, or a
        3-tuple of str) and rebuild the accounting from it; call it at start, before writes.

        Every ``*.ignkv`` header is checked (structure, crc, key, lengths: a file failing is deleted and counted
        corrupt, whatever its stamp); a file of another format version or another stamp is left alone, counted
        foreign, its bytes counted against the ceiling; a "live" file (an evicted live sequence of an earlier
        process, whatever its stamp) is removed and counted live; a file of this stamp has its whole payload
        checksum verified too (``verify_payload``, reading every byte; ``read`` verifies again before use either
        way). Every
        ``*.ignkv.tmp-*`` file that is not a write of this store in flight is removed (a killed writer's). Other
        names are ignored. Raises ValueError on a bad stamp, OSError when the directory cannot be listed."""
        want = stamp_of(stamp)
        res, files, kept = ScanResult(), {}, 0
        with os.scandir(self.directory) as it:
            entries = sorted((e for e in it if e.is_file(follow_symlinks=False)), key=lambda e: e.name)
        for e in entries:
            if TMP_MARK in e.name:
                try:
                    if e.name not in self._live_tmp:
                        os.unlink(e.path)
                        res.stale_tmp += 1
                except FileNotFoundError:
                    pass
                except OSError as err:
                    res.errors += 1
                    res.reasons.append((e.name, f"{type(err).__name__}: {err.strerror}"))
                continue
            if not e.name.endswith(SUFFIX):
                continue
            key = e.name[:-len(SUFFIX)]
            try:
                with open(e.path, "rb") as f:
                    record, digest = read_head(f, key)
                    size = os.fstat(f.fileno()).st_size
                    if record.kind == LIVE:
                        pass
                    elif record.stamp == want and verify_payload:
                        read_payload(f, digest, total=record.payload_bytes)
            except FileNotFoundError:
                continue
            except VersionError as err:             # another format version: left alone, never restored
                res.foreign += 1
                res.reasons.append((e.name, err.reason))
                size = _size(e.path)
                kept, res.foreign_bytes = kept + size, res.foreign_bytes + size
                continue
            except FormatError as err:
                res.corrupt += 1
                res.reasons.append((e.name, err.reason))
                _remove(Path(e.path))
                continue
            except OSError as err:
                res.errors += 1
                res.reasons.append((e.name, f"{type(err).__name__}: {err.strerror}"))
                size = _size(e.path)
                kept, res.foreign_bytes = kept + size, res.foreign_bytes + size
                continue
            if record.kind == LIVE:                 # a live sequence never outlives its process
                _remove(Path(e.path))
                res.live += 1
            elif record.stamp != want:
                res.foreign += 1
                res.foreign_bytes += size
                kept += size
            else:
                res.usable.append((key, record, size))
                files[key] = size
        self.stamp, self._files, self._kept = want, files, kept
        return res

    def close(self) -> None:
        """Release the directory lock. The files stay; the store must not be used after."""
        if not self._lock.closed:
            self._lock.close()

    def __enter__(self) -> DiskStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _unlink(self, key: str, quiet: bool = True) -> None:
        """Remove ``key``'s file (gone already is fine) and forget it. quiet: swallow other OSErrors too (the file
        is then forgotten anyway: the next scan sees it again)."""
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            pass
        except OSError:
            if not quiet:
                raise
        self._files.pop(key, None)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_afsync_dir = aiofiles.os.wrap(_fsync_dir)


def _remove(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _size(path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
