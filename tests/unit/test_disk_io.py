"""KV-disk payload I/O (cache/disk_io.py): the pipelined checksum equals
a one-shot XXH3-128 of the same bytes, a file written by ``write_file`` has the spec's layout byte for byte, and a
read fills fresh or caller buffers with exactly those bytes, whatever the chunk size, with O_DIRECT (on tmp_path's
filesystem: ext4 here) and buffered (``IGNIS_KV_DISK_DIRECT=0``, or a filesystem that refuses O_DIRECT)."""
from __future__ import annotations

import errno
import hashlib
import os

import pytest
import xxhash

from ignisd.cache import disk_direct, disk_hash, disk_io
from ignisd.cache.disk_format import DiskRecord, FormatError, digest_offset, encode_header, file_prefix

STAMP = ("struct-abc", "f16-v1", "none")


def rec(n_pages=3, page_bytes=4096, layout=(("ssm", "float32", (25,), 100),)) -> DiskRecord:
    return DiskRecord(kind="checkpoint", tokens=(1, 2, 3), image_spans=(), priority="agent", after_user=False,
                      structural_hash=STAMP[0], kv_format=STAMP[1], drafter=STAMP[2], page_tokens=4,
                      page_bytes=page_bytes, n_pages=n_pages, image_layout=layout)


def payload(r: DiskRecord) -> tuple[bytes, bytes]:
    rnd = hashlib.shake_256(r.key.encode()).digest(r.payload_bytes)
    return rnd[:r.pages_bytes], rnd[r.pages_bytes:]


def write(path, r: DiskRecord, pages: bytes, image: bytes) -> None:
    header = encode_header(r)
    disk_io.write_file(path, file_prefix(header, r.payload_bytes, bytes(16)), (memoryview(pages), memoryview(image)),
                       digest_offset(len(header)))


@pytest.fixture(params=[40, 1 << 20, 8 << 20], ids=["40B", "1MiB", "8MiB"])
def chunk(request, monkeypatch):
    monkeypatch.setattr(disk_io, "CHUNK_BYTES", request.param)
    monkeypatch.setattr(disk_hash, "INLINE_HASH_BYTES", min(request.param, disk_hash.INLINE_HASH_BYTES))
    return request.param


def test_pipelined_hash_equals_one_shot_xxh3(chunk):
    data = hashlib.shake_256(b"hash me").digest(3 * chunk + 17)
    views = list(disk_io.chunks(memoryview(data)))
    assert b"".join(views) == data and all(v.nbytes <= chunk for v in views)
    with disk_hash.PipelinedHash() as h:
        for v in views:
            h.feed(v)
        got = h.digest()
    assert got == xxhash.xxh3_128(data).digest()


def test_written_file_is_the_spec_layout_and_reads_back(tmp_path, chunk, io_mode):
    r = rec(n_pages=max(2, 3 * chunk // 4096))
    pages, image = payload(r)
    path = tmp_path / (r.key + ".ignkv")
    write(path, r, pages, image)
    header = encode_header(r)
    want = file_prefix(header, r.payload_bytes, xxhash.xxh3_128(pages + image).digest()) + pages + image
    assert path.read_bytes() == want
    assert path.stat().st_mode & 0o777 == 0o600
    got_r, got_p, got_i = disk_io.read_file(path, r.key)
    assert got_r == r and got_p == pages and got_i == image
    arena = bytearray(r.payload_bytes + 10)
    into = (memoryview(arena)[5:5 + r.pages_bytes], memoryview(arena)[5 + r.pages_bytes:5 + r.payload_bytes])
    disk_io.read_file(path, r.key, into=into)
    assert arena == bytes(5) + pages + image + bytes(5)
    with open(path, "rb") as f:                              # the scan's way: through its own chunk buffers
        f.seek(len(want) - r.payload_bytes)
        disk_io.read_payload(f, xxhash.xxh3_128(pages + image).digest(), total=r.payload_bytes)


def test_write_refuses_an_existing_file(tmp_path):
    r = rec()
    path = tmp_path / "x"
    path.write_bytes(b"old")
    with pytest.raises(FileExistsError):
        write(path, r, *payload(r))
    assert path.read_bytes() == b"old"


def test_a_flipped_payload_byte_or_a_short_file_fails_its_check(tmp_path, chunk, io_mode):
    r = rec()
    pages, image = payload(r)
    path = tmp_path / (r.key + ".ignkv")
    write(path, r, pages, image)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="payload checksum"):
        disk_io.read_file(path, r.key)
    path.write_bytes(bytes(raw[:-3]))
    with pytest.raises(FormatError, match="truncated"):
        disk_io.read_file(path, r.key)
    with open(path, "rb") as f:
        f.seek(len(raw) - r.payload_bytes)
        with pytest.raises(FormatError, match="truncated"):
            disk_io.read_payload(f, bytes(16), total=r.payload_bytes)


def test_into_of_the_wrong_size_or_read_only_is_refused(tmp_path):
    r = rec()
    path = tmp_path / (r.key + ".ignkv")
    write(path, r, *payload(r))
    for bad in [(bytearray(r.pages_bytes - 1), bytearray(r.image_bytes)), (bytes(r.pages_bytes),
                                                                          bytearray(r.image_bytes))]:
        with pytest.raises(ValueError, match="into"):
            disk_io.read_file(path, r.key, into=bad)


@pytest.mark.parametrize("head", [4, 4096], ids=["unaligned", "aligned"])
def test_a_read_into_views_two_ways_equals_the_file_and_stops_both_threads_on_a_short_file(tmp_path, chunk, io_mode,
                                                                                            head):
    """The two-thread read (``_read_two_way``, views larger than one chunk, or ``_read_direct`` for a payload at an
    aligned offset with O_DIRECT) lands every byte in order and checks the one XXH3 of them; a file that ends early
    raises "truncated" whichever thread meets the end (mid block or on a block boundary), and only once both threads
    stopped."""
    data = hashlib.shake_256(b"two ways").digest(5 * chunk + 33)
    path = tmp_path / "f"
    path.write_bytes(b"H" * head + data)
    dst = bytearray(len(data))
    with open(path, "rb") as f:
        f.read(head)
        disk_io.read_payload(f, xxhash.xxh3_128(data).digest(), (memoryview(dst)[:7], memoryview(dst)[7:]))
    assert dst == data
    with open(path, "rb") as f:
        f.read(head)
        with pytest.raises(FormatError, match="payload checksum"):
            disk_io.read_payload(f, bytes(16), (memoryview(dst),))
    for cut in sorted({len(data) - 1, chunk + 1, 1, 4096, 2 * max(chunk, 4096)} - {len(data)}):
        if cut > len(data):
            continue
        path.write_bytes(b"H" * head + data[:cut])       # the end met by either thread
        with open(path, "rb") as f:
            f.read(head)
            with pytest.raises(FormatError, match="truncated"):
                disk_io.read_payload(f, xxhash.xxh3_128(data).digest(), (memoryview(bytearray(len(data))),))
        with open(path, "rb") as f:                      # the scan's way
            f.read(head)
            with pytest.raises(FormatError, match="truncated"):
                disk_io.read_payload(f, xxhash.xxh3_128(data).digest(), total=len(data))
    assert disk_hash.helper("read").submit(lambda: 1).result() == 1     # the helper is free again


@pytest.fixture
def used(monkeypatch) -> list[str]:
    """The payload paths taken, in order: "write direct", "read direct" (else the buffered code ran)."""
    calls = []
    for name in ("_write_direct", "_read_direct"):
        real = getattr(disk_io, name)

        def spy(*a, _real=real, _name=name, **k):
            calls.append(_name[1:].replace("_", " "))
            return _real(*a, **k)
        monkeypatch.setattr(disk_io, name, spy)
    return calls


@pytest.mark.parametrize("n_pages,page_bytes,layout", [
    (5, 5000, (("ssm", "float32", (25,), 100),)),        # 25,100 B: 4 slices of 8 KiB, the last 508 B
    (4, 4096, ()),                                       # exactly 2 slices, no image: no padding, no ftruncate
    (1, 10, (("conv", "uint8", (3,), 3),)),              # 13 B: one block, mostly padding
    (0, 64, ()),                                         # an empty payload
], ids=["odd-multi-chunk", "aligned", "tiny", "empty"])
def test_each_mode_round_trips_payloads_of_any_size_at_an_aligned_offset(tmp_path, monkeypatch, io_mode, used,
                                                                         n_pages, page_bytes, layout):
    monkeypatch.setattr(disk_io, "CHUNK_BYTES", 8192)
    monkeypatch.setattr(disk_hash, "INLINE_HASH_BYTES", 4096)     # full slices go through the hash helper
    r = rec(n_pages=n_pages, page_bytes=page_bytes, layout=layout)
    pages, image = payload(r)
    path = tmp_path / (r.key + ".ignkv")
    write(path, r, pages, image)
    header = encode_header(r)
    offset = -(-(44 + len(header)) // 4096) * 4096             # the spec's payload offset, computed here
    raw = path.read_bytes()
    assert offset % 4096 == 0 and len(raw) == offset + r.payload_bytes == path.stat().st_size
    assert raw[offset:] == pages + image and raw[44 + len(header):offset] == bytes(offset - 44 - len(header))
    assert raw[28 + len(header):44 + len(header)] == xxhash.xxh3_128(pages + image).digest()
    assert disk_io.read_file(path, r.key) == (r, pages, image)
    arena = bytearray(r.payload_bytes + 11)                    # unaligned views spanning pages and image
    into = (memoryview(arena)[3:3 + r.pages_bytes], memoryview(arena)[3 + r.pages_bytes:3 + r.payload_bytes])
    disk_io.read_file(path, r.key, into=into)
    assert arena == bytes(3) + pages + image + bytes(8)
    with open(path, "rb") as f:
        f.seek(offset)
        disk_io.read_payload(f, xxhash.xxh3_128(pages + image).digest(), total=r.payload_bytes)
    assert used == (["write direct"] + ["read direct"] * 3 if io_mode == "direct" else [])
    bad = bytearray(raw)
    if r.payload_bytes:
        bad[offset + r.payload_bytes // 2] ^= 1
        path.write_bytes(bytes(bad))
        with pytest.raises(FormatError, match="payload checksum"):
            disk_io.read_file(path, r.key)
    path.write_bytes(raw[:-1])
    with pytest.raises(FormatError, match="truncated"):
        disk_io.read_file(path, r.key)


def test_a_filesystem_that_refuses_o_direct_gets_the_buffered_path(tmp_path, monkeypatch, used):
    """EINVAL from turning O_DIRECT on (tmpfs before Linux 6.6, some FUSE and overlay filesystems) falls back to
    buffered I/O with the same bytes on disk; another error of it is the disk's error."""
    monkeypatch.setattr(disk_io, "CHUNK_BYTES", 8192)
    r = rec(n_pages=5, page_bytes=5000)
    pages, image = payload(r)
    write(tmp_path / "direct", r, pages, image)
    if not used:
        pytest.skip(f"the filesystem of {tmp_path} refuses O_DIRECT: the fallback is the only path here")

    def refuse(fd):
        raise OSError(errno.EINVAL, "Invalid argument")
    monkeypatch.setattr(disk_direct, "set_direct", refuse)
    used.clear()
    path = tmp_path / (r.key + ".ignkv")
    write(path, r, pages, image)
    assert path.read_bytes() == (tmp_path / "direct").read_bytes()
    assert disk_io.read_file(path, r.key) == (r, pages, image) and used == []
    monkeypatch.setattr(disk_direct, "set_direct", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "injected")))
    with pytest.raises(OSError, match="injected"):
        write(tmp_path / "other", r, pages, image)
    monkeypatch.setenv(disk_direct.DIRECT_ENV, "0")               # the switch: never tried
    write(tmp_path / "buffered", r, pages, image)
    assert (tmp_path / "buffered").read_bytes() == path.read_bytes() and used == []


def test_write_refuses_a_prefix_that_would_leave_the_payload_unaligned(tmp_path):
    with pytest.raises(ValueError, match="multiple of 4096"):
        disk_io.write_file(tmp_path / "x", bytes(100), (memoryview(b"abc"),), 0)
    assert not (tmp_path / "x").exists()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("shift", [0, 64], ids=["aligned", "unaligned"])
def test_an_aligned_source_is_written_without_the_bounce_copy(tmp_path, monkeypatch, io_mode, shift):
    """Whole aligned slices of page-aligned memory (an mmap, as the runner's "to_bytes" buffers) go to the disk
    straight from it; the same bytes at an unaligned address go through the bounce buffers; the files are equal."""
    import mmap
    monkeypatch.setattr(disk_io, "CHUNK_BYTES", 8192)
    r = rec(n_pages=5, page_bytes=4096, layout=(("ssm", "float32", (25,), 100),))
    pages, image = payload(r)
    mem = mmap.mmap(-1, 4096 + r.pages_bytes)
    mem[shift:shift + r.pages_bytes] = pages
    seen = []
    real = disk_direct.aligned
    monkeypatch.setattr(disk_direct, "aligned", lambda v: seen.append(real(v)) or seen[-1])
    path = tmp_path / (r.key + ".ignkv")
    header = encode_header(r)
    src = memoryview(mem)[shift:shift + r.pages_bytes]
    disk_io.write_file(path, file_prefix(header, r.payload_bytes, bytes(16)), (src, memoryview(image)),
                       digest_offset(len(header)))
    del src
    assert disk_io.read_file(path, r.key) == (r, pages, image)
    if io_mode == "direct":       # slices: 8 KiB, 8 KiB, then 4 KiB of pages + the image (two pieces: copied)
        assert seen == ([True, True] if shift == 0 else [False, False])
    else:
        assert seen == []


def test_probe_moves_its_bytes_in_the_files_mode_and_leaves_nothing(tmp_path, monkeypatch, io_mode):
    """disk_io.probe (the restore floor's disk cost): it writes and reads through the mode the files use (O_DIRECT
    set on both descriptors in direct mode, never in buffered mode), removes its file, and fails on a missing
    directory with the OSError."""
    modes = []
    real = disk_direct.set_direct

    def spy(fd):
        modes.append("direct")
        return real(fd)

    monkeypatch.setattr(disk_direct, "set_direct", spy)
    lat, bw, direct = disk_io.probe(tmp_path, nbytes=3 * 4096 + 5)  # rounded up to 4 blocks
    assert 0 <= lat < 5 and 0 < bw < float("inf") and direct == (io_mode == "direct")
    assert modes == (["direct", "direct"] if io_mode == "direct" else [])
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileNotFoundError):
        disk_io.probe(tmp_path / "missing")


def test_probe_on_a_full_disk_raises_the_oserror_and_leaves_nothing(tmp_path, monkeypatch):
    """A full disk (ENOSPC on the first write) gives the OSError itself — not a BufferError from closing the
    buffer the failed write still referenced — so tier_setup falls back to its guess; the file is gone."""
    def full(fd, view, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(disk_io, "_write_all", full)
    with pytest.raises(OSError) as e:
        disk_io.probe(tmp_path)
    assert e.value.errno == errno.ENOSPC and list(tmp_path.iterdir()) == []
    from ignisd.tier_setup import _disk_cost
    cost, mode = _disk_cost(str(tmp_path))
    assert mode == "unknown" and (cost.latency_s, cost.bandwidth) == (0.01, 1e8)
