"""KV-disk file store (issue 9, DESIGN §4.5): format, verification, atomic writes, scan at start, ceiling, faults.

Everything runs on real files under tmp_path; faults are injected where root would ignore permissions, and a real
64 KiB tmpfs is mounted when this runs as root and mount is allowed."""
from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import zlib
from array import array
from pathlib import Path

import aiofiles.os
import pytest
import xxhash

from ignisd.cache import disk_direct, disk_format, disk_io, disk_store
from ignisd.cache.disk_format import DiskRecord, file_bytes
from ignisd.cache.disk_store import CorruptFile, DirectoryLocked, DiskFull, DiskStore

STAMP = ("struct-abc", "f16-v1", "none")
OTHER = ("struct-xyz", "f16-v1", "none")
DIGEST = hashlib.sha256(b"cat.png").hexdigest()
ROOT = Path(__file__).resolve().parents[2]


def rec(tokens=(1, 2, 3, 4, 5), stamp=STAMP, kind="checkpoint", n_pages=2, page_bytes=96, layout=None, **kw):
    layout = (("conv", "float32", (2, 4), 32), ("ssm", "float32", (3,), 12)) if layout is None else layout
    return DiskRecord(kind=kind, tokens=tuple(tokens), image_spans=kw.pop("spans", ((1, 3, DIGEST),)),
                      priority=kw.pop("priority", "interactive"), after_user=kw.pop("after_user", True),
                      structural_hash=stamp[0], kv_format=stamp[1], drafter=stamp[2], page_tokens=4,
                      page_bytes=page_bytes, n_pages=n_pages, image_layout=layout)


def payload(r: DiskRecord, seed: int = 0) -> tuple[bytes, bytes]:
    rnd = hashlib.shake_256(f"{r.key}{seed}".encode()).digest(r.payload_bytes)
    return rnd[:r.pages_bytes], rnd[r.pages_bytes:]


def listing(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name != disk_store.LOCK_NAME)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def store(tmp_path):
    s = DiskStore(tmp_path / "kv", 1 << 20)
    s.scan(STAMP)
    yield s
    s.close()


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(disk_io, "CHUNK_BYTES", 40)   # many chunks, boundaries inside pages and the image


# -- round trips ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("chunked", [False, True])
def test_round_trip_is_byte_identical(store, request, chunked, io_mode):
    if chunked:
        request.getfixturevalue("small_chunks")
    r = rec()
    pages, image = payload(r)
    size = run(store.write(r, pages, memoryview(image)))
    assert size == file_bytes(r) == store.path(r.key).stat().st_size == store.used_bytes == store.size_of(r.key)
    assert listing(store.directory) == [r.key + ".ignkv"]
    for got in (run(store.read(r.key)), store.read_sync(r.key)):
        assert got == (r, pages, image)
    assert store.path(r.key).stat().st_mode & 0o777 == 0o600
    assert store.directory.stat().st_mode & 0o777 == 0o700
    assert store.free_bytes == store.capacity_bytes - size and store.fits(store.free_bytes)
    assert not store.fits(store.free_bytes + 1)


def test_round_trip_without_image_and_from_typed_buffers(store):
    r = rec(layout=(), n_pages=3, page_bytes=16)
    pages = array("f", [float(i) for i in range(12)])           # 12 float32 = 48 bytes, len() would say 12
    run(store.write(r, pages, b""))
    got_r, got_pages, got_image = run(store.read(r.key))
    assert got_r == r and bytes(got_pages) == pages.tobytes() and got_image == b""


def test_read_into_caller_buffers(store, small_chunks, io_mode):
    r = rec()
    pages, image = payload(r)
    run(store.write(r, pages, image))
    arena = bytearray(1000)
    dst = (memoryview(arena)[100:100 + len(pages)], memoryview(arena)[500:500 + len(image)])
    got_r, got_p, got_i = run(store.read(r.key, into=dst))
    assert got_r == r and bytes(got_p) == pages and bytes(got_i) == image
    assert arena[100:100 + len(pages)] == pages and arena[500:500 + len(image)] == image and arena[:100] == bytes(100)
    other = bytearray(len(pages) + len(image))
    store.read_sync(r.key, into=(memoryview(other)[:len(pages)], memoryview(other)[len(pages):]))
    assert other == pages + image
    for bad in [(bytearray(len(pages) - 1), bytearray(len(image))), (bytes(len(pages)), bytearray(len(image)))]:
        with pytest.raises(ValueError):
            run(store.read(r.key, into=bad))
    assert r.key in store and store.read_sync(r.key)[1] == pages       # a caller error keeps the file


def test_lengths_that_do_not_match_the_record_are_refused(store):
    r = rec()
    pages, image = payload(r)
    with pytest.raises(ValueError):
        run(store.write(r, pages[:-1], image))
    with pytest.raises(ValueError):
        run(store.write(r, pages, image + b"x"))
    assert listing(store.directory) == [] and store.used_bytes == 0


def test_overwrite_of_a_key_keeps_one_file_counted_once(store):
    r1, r2 = rec(priority="agent"), rec(priority="interactive", after_user=False)
    assert r1.key == r2.key
    run(store.write(r1, *payload(r1, 1)))
    size = run(store.write(r2, *payload(r2, 2)))
    assert listing(store.directory) == [r2.key + ".ignkv"] and store.used_bytes == size
    assert run(store.read(r2.key)) == (r2, *payload(r2, 2))


def test_restart_indexes_the_files_again(tmp_path):
    d = tmp_path / "kv"
    with DiskStore(d, 1 << 20) as s:
        s.scan(STAMP)
        recs = [rec(tokens=range(i, i + 9)) for i in range(3)]
        sizes = [run(s.write(r, *payload(r))) for r in recs]
    with DiskStore(d, 1 << 20) as s:
        res = s.scan(STAMP)
        assert sorted(res.usable) == sorted((r.key, r, n) for r, n in zip(recs, sizes))
        assert (res.corrupt, res.foreign, res.stale_tmp, res.errors) == (0, 0, 0, 0)
        assert s.used_bytes == sum(sizes) and len(s) == 3
        assert all(s.read_sync(r.key) == (r, *payload(r)) for r in recs)


# -- the format ---------------------------------------------------------------------------------------------------

FIXED = DiskRecord(kind="prefix", tokens=(7, 8), image_spans=((0, 1, "ab" * 32),), priority="agent",
                   after_user=False, structural_hash="h", kv_format="kv1", drafter="none", page_tokens=64,
                   page_bytes=4, n_pages=1, image_layout=(("s", "float32", (1,), 4),))
FIXED_HEADER = (b'{"key":"%s","kind":"prefix","tokens":[7,8],"image_spans":[[0,1,"' + b"ab" * 32 + b'"]],'
                b'"priority":"agent","after_user":false,"structural_hash":"h","kv_format":"kv1","drafter":"none",'
                b'"page_tokens":64,"page_bytes":4,"n_pages":1,"image_layout":[["s","float32",[1],4]]}')


def _hand_key(r: DiskRecord) -> str:
    """The key as the spec words it, built without the module's struct formats."""
    b = b"ignis-kv-key\x00\x01"
    for s in (r.structural_hash, r.kv_format, r.drafter, r.kind):
        b += len(s).to_bytes(4, "little") + s.encode()
    b += len(r.tokens).to_bytes(8, "little") + b"".join(t.to_bytes(8, "little", signed=True) for t in r.tokens)
    b += len(r.image_spans).to_bytes(4, "little")
    for start, end, d in r.image_spans:
        b += start.to_bytes(8, "little") + end.to_bytes(8, "little") + len(d).to_bytes(4, "little") + d.encode()
    return hashlib.sha256(b).hexdigest()


def test_file_bytes_match_the_hand_computed_layout(store, io_mode):
    key = _hand_key(FIXED)
    assert FIXED.key == key == "346d281023ab3dfe1105ad8dc531cda9d39d526f3b2a590a7e9bf9135131e9e0"   # frozen: key v1
    header = FIXED_HEADER % key.encode()
    pages, image = b"\x01\x02\x03\x04", b"\x00\x00\x80\x3f"
    head = (b"IGNISKV\x00" + (3).to_bytes(4, "little") + len(header).to_bytes(4, "little") + header
            + zlib.crc32(header).to_bytes(4, "little") + (8).to_bytes(8, "little")
            + xxhash.xxh3_128(pages + image).digest())
    assert len(head) == 44 + len(header) < 4096
    expect = head + bytes(4096 - len(head)) + pages + image       # zero padding to the 4096-aligned payload
    assert run(store.write(FIXED, pages, image)) == len(expect) == 4096 + 8
    assert store.path(key).read_bytes() == expect


def test_the_key_binds_stamp_kind_tokens_and_images_only():
    base = rec()
    assert base.key == _hand_key(base) and len(base.key) == 64
    differ = [rec(stamp=OTHER), rec(stamp=("struct-abc", "q8-v1", "none")), rec(stamp=("struct-abc", "f16-v1", "d")),
              rec(kind="prefix"), rec(tokens=(1, 2, 3, 4, 6)), rec(tokens=(1, 2, 3, 4)), rec(spans=()),
              rec(spans=((1, 3, "0" * 64),)), rec(spans=((0, 3, DIGEST),))]
    assert len({base.key, *(r.key for r in differ)}) == 1 + len(differ)
    same = [rec(priority="agent"), rec(after_user=False), rec(n_pages=1, page_bytes=8, layout=())]
    assert {r.key for r in same} == {base.key}


@pytest.mark.parametrize("bad", [dict(kind="live"), dict(priority="batch"), dict(spans=((2, 9, DIGEST),)),
                                 dict(spans=((3, 1, DIGEST),)), dict(spans=((0, 1, "AB" * 32),)),
                                 dict(tokens=(1, -2)), dict(after_user=1), dict(n_pages=-1),
                                 dict(layout=(("x", "f32", (1,), -4),))])
def test_a_malformed_record_is_refused(bad):
    with pytest.raises(ValueError):
        rec(**bad)


def test_lists_become_tuples():
    r = DiskRecord(kind="prefix", tokens=[1, 2], image_spans=[[0, 1, DIGEST]], priority="agent", after_user=False,
                   structural_hash="a", kv_format="b", drafter="none", page_tokens=64, page_bytes=0, n_pages=0,
                   image_layout=[["s", "float32", [2, 3], 24]])
    assert r.tokens == (1, 2) and r.image_spans == ((0, 1, DIGEST),)
    assert r.image_layout == (("s", "float32", (2, 3), 24),)
    again = DiskRecord(**{k: getattr(r, k) for k in disk_format._FIELDS})
    assert r == again and hash(r) == hash(again) and r.key == again.key


# -- corruption ---------------------------------------------------------------------------------------------------

def _flip(b: bytearray, i: int):
    b[i] ^= 0x40


def _rewrite_header(b: bytearray, hl: int, edit) -> bytearray:
    """A file whose header was edited and whose crc was fixed up (only the key or schema checks can catch it)."""
    header = edit(bytes(b[16:16 + hl]))
    out = bytearray(b[:8]) + struct.pack("<II", 3, len(header)) + header + struct.pack("<I", zlib.crc32(header))
    return out + b[16 + hl + 4:]


def _corruptions(hl: int, size: int):
    """name -> (edit of the file's bytes, expected reason). hl: header length; size: file bytes."""
    p0 = -(-(44 + hl) // 4096) * 4096                    # the payload offset: the prefix rounded up to 4096
    cuts = {"empty": 0, "mid magic": 7, "mid lead": 15, "after lead": 16, "mid header": 16 + hl // 2,
            "after header": 16 + hl, "mid trailer": 16 + hl + 10, "after trailer": 44 + hl,
            "mid padding": (44 + hl + p0) // 2, "at payload": p0, "payload + 1": p0 + 1,
            "mid payload": p0 + (size - p0) // 2, "last byte": size - 1}
    trunc = {f"truncated {k}": (lambda b, n=n: b[:n], "truncated") for k, n in cuts.items()}
    return {
        **trunc,
        "payload first byte": (lambda b: _flip(b, p0) or b, "payload checksum"),
        "payload middle byte": (lambda b: _flip(b, p0 + (size - p0) // 2) or b, "payload checksum"),
        "image last byte": (lambda b: _flip(b, size - 1) or b, "payload checksum"),
        "digest byte": (lambda b: _flip(b, 28 + hl + 5) or b, "payload checksum"),
        "magic": (lambda b: b"IGNISKW\x00" + b[8:], "magic"),
        "header length": (lambda b: b[:12] + struct.pack("<I", 1 << 30) + b[16:], "header length 1073741824"),
        "header byte": (lambda b: _flip(b, 16 + hl // 2) or b, "header crc"),
        "header crc byte": (lambda b: _flip(b, 16 + hl) or b, "header crc"),
        "payload length": (lambda b: b[:20 + hl] + struct.pack("<Q", size - p0 + 1) + b[28 + hl:], "payload length"),
        "trailing bytes": (lambda b: b + b"\x00", "trailing bytes"),
        "padding byte": (lambda b: _flip(b, p0 - 1) or b, "padding"),
        "tokens edited, crc fixed": (lambda b: _rewrite_header(b, hl, lambda h: h.replace(b"[1,2,3", b"[1,9,3")),
                                     "key"),
        "not json, crc fixed": (lambda b: _rewrite_header(b, hl, lambda h: b"[" + h[1:]), "header schema"),
        "field dropped, crc fixed": (lambda b: _rewrite_header(b, hl, lambda h: h.replace(b',"after_user":true', b"")),
                                     "header schema"),
    }


def _written(tmp_path):
    s = DiskStore(tmp_path / "kv", 1 << 20)
    s.scan(STAMP)
    r = rec()
    size = run(s.write(r, *payload(r)))
    return s, r, size, len(disk_format.encode_header(r))


_CASES = list(_corruptions(600, 800))      # names only; the offsets are computed per file below


@pytest.mark.parametrize("how", ["read", "read_sync", "scan"])
@pytest.mark.parametrize("case", _CASES)
def test_every_corruption_is_detected_and_the_file_deleted(tmp_path, case, how, io_mode):
    s, r, size, hl = _written(tmp_path)
    edit, reason = _corruptions(hl, size)[case]
    path = s.path(r.key)
    path.write_bytes(bytes(edit(bytearray(path.read_bytes()))))
    if how == "scan":
        res = s.scan(STAMP)
        assert (res.usable, res.corrupt, res.foreign) == ([], 1, 0)
        assert res.reasons[0][0] == path.name and res.reasons[0][1].startswith(reason)
    else:
        with pytest.raises(CorruptFile) as ei:
            run(s.read(r.key)) if how == "read" else s.read_sync(r.key)
        assert ei.value.reason.startswith(reason) and ei.value.path == path
        assert isinstance(ei.value, OSError) and ei.value.errno == errno.EBADMSG
    assert not path.exists() and listing(s.directory) == [] and s.used_bytes == 0 and r.key not in s
    s.close()


def test_a_renamed_file_no_longer_matches_its_key(store):
    a, b = rec(tokens=(1, 2, 3)), rec(tokens=(4, 5, 6))
    run(store.write(a, *payload(a)))
    os.rename(store.path(a.key), store.path(b.key))
    with pytest.raises(CorruptFile, match="name"):
        run(store.read(b.key))
    assert listing(store.directory) == []
    run(store.write(a, *payload(a)))
    os.rename(store.path(a.key), store.directory / "notakey.ignkv")
    res = store.scan(STAMP)
    assert (res.corrupt, res.usable, listing(store.directory)) == (1, [], [])


def test_a_file_removed_underneath_raises_file_not_found(store):
    r = rec()
    run(store.write(r, *payload(r)))
    store.path(r.key).unlink()
    with pytest.raises(FileNotFoundError):
        run(store.read(r.key))
    assert store.used_bytes == 0 and r.key not in store
    run(store.write(r, *payload(r)))
    store.path(r.key).unlink()
    with pytest.raises(FileNotFoundError):
        store.read_sync(r.key)
    store.delete(r.key)                       # already gone: no error
    with pytest.raises(ValueError):
        run(store.read("../../etc/passwd"))


def test_delete_removes_and_stops_counting(store):
    r = rec()
    run(store.write(r, *payload(r)))
    store.delete(r.key)
    assert listing(store.directory) == [] and store.used_bytes == 0


# -- scan ---------------------------------------------------------------------------------------------------------

def test_scan_removes_stale_temporaries_but_not_other_names(store):
    d = store.directory
    (d / f"{'0' * 64}.ignkv.tmp-123-0").write_bytes(b"IGNISKV\0partial")
    (d / "README").write_text("keep me")
    res = store.scan(STAMP)
    assert res.stale_tmp == 1 and listing(d) == ["README"]


def hold_fsync(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """Make the payload job of a write block at its fsync: (reached, release) events."""
    reached, release = threading.Event(), threading.Event()

    def blocking_fsync(fd):
        reached.set()
        release.wait(10)
        os.fsync(fd)
    monkeypatch.setattr(disk_io, "_fsync", blocking_fsync)
    return reached, release


async def until(event: threading.Event) -> None:
    while not event.is_set():
        await asyncio.sleep(0.001)


def test_scan_keeps_the_temporary_of_its_own_write_in_flight(store, monkeypatch):
    r = rec()

    async def go():
        reached, release = hold_fsync(monkeypatch)
        t = asyncio.ensure_future(store.write(r, *payload(r)))
        await until(reached)
        res = store.scan(STAMP)
        assert res.stale_tmp == 0 and len([n for n in listing(store.directory) if ".tmp-" in n]) == 1
        release.set()
        return await t

    assert run(go()) == store.used_bytes and listing(store.directory) == [r.key + ".ignkv"]


def test_kill_9_mid_write_leaves_a_temporary_that_the_next_scan_removes(tmp_path):
    d = tmp_path / "kv"
    code = textwrap.dedent(f"""
        import asyncio, sys, time
        sys.path.insert(0, {str(ROOT / "tests" / "unit")!r})
        from ignisd.cache import disk_io, disk_store
        from test_disk_store import rec, payload, STAMP
        s = disk_store.DiskStore({str(d)!r}, 1 << 20)
        s.scan(STAMP)
        keep, dying = rec(tokens=(9, 9, 9, 9)), rec()
        asyncio.run(s.write(keep, *payload(keep)))
        def hang(fd):
            print("in fsync", flush=True)
            time.sleep(60)
        disk_io._fsync = hang
        asyncio.run(s.write(dying, *payload(dying)))
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert p.stdout.readline().strip() == "in fsync"
        tmps = [n for n in os.listdir(d) if ".tmp-" in n]
        assert len(tmps) == 1 and os.path.getsize(d / tmps[0]) == file_bytes(rec())
    finally:
        p.kill()
        p.wait(30)
    with DiskStore(d, 1 << 20) as s:      # the dead writer's lock is gone with it
        res = s.scan(STAMP)
        assert res.stale_tmp == 1 and [k for k, _, _ in res.usable] == [rec(tokens=(9, 9, 9, 9)).key]
        assert listing(d) == [rec(tokens=(9, 9, 9, 9)).key + ".ignkv"]


def test_foreign_stamps_are_left_alone_never_returned_and_counted_against_the_ceiling(store):
    mine, theirs, broken = rec(), rec(stamp=OTHER), rec(stamp=OTHER, tokens=(5, 6, 7))
    sizes = [run(store.write(r, *payload(r))) for r in (mine, theirs, broken)]
    p = store.path(broken.key)
    b = bytearray(p.read_bytes())
    b[-1] ^= 1                                # a foreign payload is never read: its damage is not ours to judge
    p.write_bytes(bytes(b))
    res = store.scan(STAMP)
    assert [k for k, _, _ in res.usable] == [mine.key]
    assert (res.foreign, res.foreign_bytes, res.corrupt) == (2, sizes[1] + sizes[2], 0)
    assert store.used_bytes == sum(sizes) and mine.key in store and theirs.key not in store
    assert store.path(theirs.key).exists() and p.exists()
    res = store.scan(OTHER)                   # the other model sees its own
    assert sorted(k for k, _, _ in res.usable) == [theirs.key] and res.corrupt == 1 and not p.exists()


def test_a_foreign_file_with_a_broken_header_is_deleted(store):
    theirs = rec(stamp=OTHER)
    run(store.write(theirs, *payload(theirs)))
    p = store.path(theirs.key)
    b = bytearray(p.read_bytes())
    b[20] ^= 1
    p.write_bytes(bytes(b))
    res = store.scan(STAMP)
    assert (res.foreign, res.corrupt, listing(store.directory)) == (0, 1, [])


def test_scan_can_skip_the_payload_check_and_read_still_catches_it(store):
    r = rec()
    run(store.write(r, *payload(r)))
    p = store.path(r.key)
    b = bytearray(p.read_bytes())
    b[-1] ^= 1
    p.write_bytes(bytes(b))
    assert [k for k, _, _ in store.scan(STAMP, verify_payload=False).usable] == [r.key]
    with pytest.raises(CorruptFile, match="payload checksum"):
        run(store.read(r.key))


# -- ceiling, faults, concurrency ---------------------------------------------------------------------------------

def test_the_ceiling_refuses_before_writing_anything(tmp_path):
    r = rec()
    need = file_bytes(r)
    with DiskStore(tmp_path / "a", need - 1) as s:
        assert not s.fits(need)
        with pytest.raises(DiskFull) as ei:
            run(s.write(r, *payload(r)))
        assert isinstance(ei.value, OSError) and ei.value.errno == errno.ENOSPC and ei.value.need == need
        assert listing(s.directory) == [] and s.used_bytes == 0
    with DiskStore(tmp_path / "b", need) as s:            # exactly full is allowed
        assert run(s.write(r, *payload(r))) == need and s.free_bytes == 0


class _Injected:
    """Patches one step of a write to raise OSError(EIO)."""

    def __init__(self, monkeypatch, step):
        self.step = step
        if step == "open":
            monkeypatch.setattr(disk_io, "_open", self._raise)
        elif step == "write":
            real, calls = disk_io._write_all, []

            def write_all(fd, view, offset):
                calls.append(1)
                if len(calls) == 3:
                    raise OSError(errno.EIO, "injected")
                real(fd, view, offset)
            monkeypatch.setattr(disk_io, "_write_all", write_all)
        elif step == "fsync":
            monkeypatch.setattr(disk_io, "_fsync", self._raise)
        elif step == "rename":
            monkeypatch.setattr(aiofiles.os, "rename", self._araise)
        elif step == "dir fsync":
            monkeypatch.setattr(disk_store, "_afsync_dir", self._araise)

    def _raise(self, *a, **k):
        raise OSError(errno.EIO, f"injected at {self.step}")

    async def _araise(self, *a, **k):
        self._raise()


@pytest.mark.parametrize("step", ["open", "write", "fsync", "rename", "dir fsync"])
def test_an_io_error_during_write_leaves_nothing_and_raises(store, monkeypatch, small_chunks, step, io_mode):
    keep = rec(tokens=(3, 3, 3))
    keep_size = run(store.write(keep, *payload(keep)))
    r = rec()
    _Injected(monkeypatch, step)
    with pytest.raises(OSError) as ei:
        run(store.write(r, *payload(r)))
    assert ei.value.errno == errno.EIO
    assert listing(store.directory) == [keep.key + ".ignkv"] and store.used_bytes == keep_size
    monkeypatch.undo()
    if io_mode == "buffered":
        monkeypatch.setenv(disk_direct.DIRECT_ENV, "0")
    run(store.write(r, *payload(r)))                     # serving goes on
    assert store.read_sync(r.key)[0] == r


@pytest.mark.parametrize("where", ["fsync in the payload job", "directory fsync"])
def test_a_cancelled_write_leaves_nothing(store, monkeypatch, where):
    r = rec()
    reached, release = threading.Event(), threading.Event()

    async def slow(*a):
        reached.set()
        await until(release)

    async def go():
        nonlocal reached, release
        if where == "directory fsync":
            monkeypatch.setattr(disk_store, "_afsync_dir", slow)
        else:                                           # inside the executor job that writes the payload
            reached, release = hold_fsync(monkeypatch)
        t = asyncio.ensure_future(store.write(r, *payload(r)))
        await until(reached)
        t.cancel()
        await asyncio.sleep(0.01)
        assert not t.done()                             # waits for the step in flight...
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await t                                     # ...then undoes it

    run(go())
    assert listing(store.directory) == [] and store.used_bytes == 0


def test_concurrent_writes_of_different_keys(store, small_chunks):
    recs = [rec(tokens=range(i, i + 20), n_pages=3) for i in range(8)]

    async def go():
        return await asyncio.gather(*(store.write(r, *payload(r)) for r in recs))

    sizes = run(go())
    assert store.used_bytes == sum(sizes) and len(listing(store.directory)) == 8

    async def back():
        return await asyncio.gather(*(store.read(r.key) for r in recs))

    assert run(back()) == [(r, *payload(r)) for r in recs]


def test_concurrent_writes_never_overshoot_the_ceiling(tmp_path, small_chunks):
    recs = [rec(tokens=range(i, i + 20)) for i in range(8)]
    cap = sum(file_bytes(r) for r in recs[:5])

    async def go(s):
        return await asyncio.gather(*(s.write(r, *payload(r)) for r in recs), return_exceptions=True)

    with DiskStore(tmp_path / "kv", cap) as s:
        out = run(go(s))
        assert [type(o) for o in out] == [int] * 5 + [DiskFull] * 3
        assert s.used_bytes == cap and len(listing(s.directory)) == 5


def test_one_store_per_directory(tmp_path):
    a = DiskStore(tmp_path / "kv", 1)
    with pytest.raises(DirectoryLocked) as ei:
        DiskStore(tmp_path / "kv", 1)
    assert ei.value.errno == errno.EBUSY
    a.close()
    DiskStore(tmp_path / "kv", 1).close()


# -- a real filesystem that fills up, and one made read-only ------------------------------------------------------

@pytest.fixture
def tiny_fs(tmp_path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("a tmpfs mount needs root (the injected faults above cover the rest)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mount refused: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


@pytest.mark.parametrize("direct", ["direct", "buffered"])
def test_a_tmpfs_that_fills_up_raises_and_leaves_no_temporary(tiny_fs, monkeypatch, direct):
    """On a 64 KiB tmpfs, with O_DIRECT (this kernel's tmpfs takes it; an older one refuses it, EINVAL, and the
    buffered fallback serves) or buffered."""
    if direct == "buffered":
        monkeypatch.setenv(disk_direct.DIRECT_ENV, "0")
    with DiskStore(tiny_fs / "kv", 1 << 30) as s:        # the ceiling is far above the 64 KiB filesystem
        s.scan(STAMP)
        done, err = [], None
        for i in range(40):
            r = rec(tokens=(i,), spans=(), n_pages=4, page_bytes=2048)
            try:
                done.append((r, run(s.write(r, *payload(r)))))
            except OSError as e:
                err = e
                break
        assert err is not None and err.errno == errno.ENOSPC and not isinstance(err, DiskFull)
        assert done and listing(s.directory) == sorted(r.key + ".ignkv" for r, _ in done)
        assert s.used_bytes == sum(n for _, n in done)
        assert all(s.read_sync(r.key)[0] == r for r, _ in done)
        s.delete(done[0][0].key)                          # room again: serving goes on
        r = rec(tokens=(999,), spans=(), n_pages=1, page_bytes=2048)
        run(s.write(r, *payload(r)))
        assert run(s.read(r.key))[0] == r
        subprocess.run(["mount", "-o", "remount,ro", str(tiny_fs)], check=True)
        ro = rec(tokens=(1000,), spans=())
        with pytest.raises(OSError) as ei:
            run(s.write(ro, *payload(ro)))
        assert ei.value.errno == errno.EROFS and ro.key not in s
        assert run(s.read(r.key))[0] == r                  # reads still served from a read-only disk


def test_a_read_only_directory_raises_for_a_non_root_user(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions; covered by the injected faults and the ro tmpfs")
    with DiskStore(tmp_path / "kv", 1 << 20) as s:
        s.directory.chmod(0o500)
        try:
            r = rec()
            with pytest.raises(PermissionError):
                run(s.write(r, *payload(r)))
            assert listing(s.directory) == []
        finally:
            s.directory.chmod(0o700)


@pytest.mark.parametrize("version", [1, 2, 4])
def test_a_file_of_another_format_version_is_left_alone(store, version):
    """A version-1 file (SHA-256 payload digest), a version-2 file (the payload right after the trailer, no
    padding) or any other version: never restored, never deleted, counted foreign with its bytes against the
    ceiling."""
    r = rec()
    run(store.write(r, *payload(r)))
    path = store.path(r.key)
    b = bytearray(path.read_bytes())
    hl = len(disk_format.encode_header(r))
    if version == 2:                           # the version-2 layout: 44 + H + P bytes
        b = b[:44 + hl] + b[4096:]
    b[8:12] = struct.pack("<I", version)
    path.write_bytes(bytes(b))
    res = store.scan(STAMP)
    assert (res.usable, res.corrupt, res.foreign, res.foreign_bytes) == ([], 0, 1, len(b))
    assert res.reasons == [(path.name, f"version {version}")] and path.exists() and r.key not in store
    assert path.read_bytes() == b and store.used_bytes == len(b)
