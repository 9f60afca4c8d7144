"""KV-disk payload I/O (cache/disk_io.py): the pipelined checksum equals
a one-shot XXH3-128 of the same bytes, a file written by ``write_file`` has the spec's layout byte for byte, and a
read fills fresh or caller buffers with exactly those bytes, whatever the chunk size."""
from __future__ import annotations

import hashlib

import pytest
import xxhash

from ignisd.cache import disk_io
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
    monkeypatch.setattr(disk_io, "INLINE_HASH_BYTES", min(request.param, disk_io.INLINE_HASH_BYTES))
    return request.param


def test_pipelined_hash_equals_one_shot_xxh3(chunk):
    data = hashlib.shake_256(b"hash me").digest(3 * chunk + 17)
    views = list(disk_io.chunks(memoryview(data)))
    assert b"".join(views) == data and all(v.nbytes <= chunk for v in views)
    with disk_io.PipelinedHash() as h:
        for v in views:
            h.feed(v)
        got = h.digest()
    assert got == xxhash.xxh3_128(data).digest()


def test_written_file_is_the_spec_layout_and_reads_back(tmp_path, chunk):
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


def test_a_flipped_payload_byte_or_a_short_file_fails_its_check(tmp_path, chunk):
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


def test_a_read_into_views_two_ways_equals_the_file_and_stops_both_threads_on_a_short_file(tmp_path, chunk):
    """The two-thread read (``_read_two_way``, views larger than one chunk) lands every byte in order and checks
    the one XXH3 of them; a file that ends early raises "truncated" whichever thread meets the end, and only once
    both threads stopped."""
    data = hashlib.shake_256(b"two ways").digest(5 * chunk + 33)
    path = tmp_path / "f"
    path.write_bytes(b"HEAD" + data)
    dst = bytearray(len(data))
    with open(path, "rb") as f:
        f.read(4)
        disk_io.read_payload(f, xxhash.xxh3_128(data).digest(), (memoryview(dst)[:7], memoryview(dst)[7:]))
    assert dst == data
    with open(path, "rb") as f:
        f.read(4)
        with pytest.raises(FormatError, match="payload checksum"):
            disk_io.read_payload(f, bytes(16), (memoryview(dst),))
    for cut in (len(data) - 1, chunk + 1, 1):             # the end met by either thread
        path.write_bytes(b"HEAD" + data[:cut])
        with open(path, "rb") as f:
            f.read(4)
            with pytest.raises(FormatError, match="truncated"):
                disk_io.read_payload(f, xxhash.xxh3_128(data).digest(), (memoryview(bytearray(len(data))),))
    assert disk_io._helper("read").submit(lambda: 1).result() == 1     # the helper is free again
