"""The KV-disk file format, version 3 (DESIGN §4.5, issue 9): ``DiskRecord`` and the codec of one ``<key>.ignkv``.

†: imports no torch; bytes in, bytes out. Besides the record and the encoders, the checks a reader makes up to the
payload (``read_head``) live here; the payload I/O with its checksum is ``cache/disk_io.py``, and
the store that writes, reads and scans these files is ``cache/disk_store.py``.

Spec (format version 3)
=======================
One file per retained state (or per evicted live sequence: kind "live", below), named ``<key>.ignkv`` where ``key``
is ``DiskRecord.key`` (64 lowercase hex). All integers are little-endian, unsigned, packed without padding
(``struct`` ``"<"``)::

    offset     size  field
    0          8     magic            b"IGNISKV\\0"
    8          4     u32 version      2 (FORMAT_VERSION)
    12         4     u32 header_len   H, bytes of the header (1 <= H <= MAX_HEADER_BYTES)
    16         H     header           orjson (UTF-8 JSON object) of the record, see below
    16+H       4     u32 header_crc   zlib.crc32 of the H header bytes
    20+H       8     u64 payload_len  P = n_pages * page_bytes + sum(image_layout nbytes)
    28+H       16    payload_xxh3     XXH3-128 (xxhash's canonical big-endian digest, seed 0) of the P payload bytes
    44+H       Z     padding          Z zero bytes, Z = O - (44 + H)
    O          P     payload          the pages (n_pages * page_bytes, page order), then the image buffers in
                                      image_layout order, each exactly its nbytes
    where O = payload_offset = roundup(44 + H, 4096) (PAYLOAD_ALIGN); total: O + P bytes; nothing follows the
    payload (its end need not be aligned).

Version 3 aligned the payload at a 4096-byte file offset (version 2 had it right after the trailer, at 44 + H) so
that ``cache/disk_io.py`` can move it with O_DIRECT, whose transfers must start at block-aligned file offsets: the
prefix (lead, header, trailer, padding) is a whole number of 4096-byte blocks and every payload slice of
``disk_io.CHUNK_BYTES`` starts on a block boundary. The padding costs under 4 KiB a file (~370 MB for an 8K-token
SmolLM2 state) and is not covered by the checksum, but a reader requires it to be zeros ("padding").
Version 2 replaced version 1's SHA-256 payload digest (32 bytes) with XXH3-128: the checksum detects corruption
and truncation (the key, a SHA-256 of the content, names the state), and at ~28 GB/s against SHA-256's ~0.7 GB/s
on these CPUs it no longer bounds a KV-disk read (xxHash spec: https://github.com/Cyan4973/xxHash/blob/dev/doc/
xxhash_spec.md). A file of another version is left alone and never restored, like one of another stamp.

The header is one JSON object with exactly these keys, in this order (orjson output of ``encode_header``)::

    key              str   the file's key (must equal the key recomputed from the other fields and the file name)
    kind             str   "prefix" | "checkpoint" | "live"
    tokens           [int] the token ids the state covers
    image_spans      [[start, end, sha256 hex]] the images in those tokens, position order
    priority         str   "interactive" | "agent"
    after_user       bool  a checkpoint taken right after a real user message
    structural_hash  str   stamp: the model's structural hash
    kv_format        str   stamp: the KV format
    drafter          str   stamp: the drafter ("none")
    page_tokens      int   tokens per KV page
    page_bytes       int   bytes of one page (all layers, K and V)
    n_pages          int   pages in the payload
    image_layout     [[name, dtype, [shape...], nbytes]] the state image buffers, payload order ([] when none)
    owner            str   only when kind is "live", and then last: the evicted live sequence the file belongs to
                           (non-empty, unique within the process)

A "live" file holds the computed pages and live state image of a running sequence moved down to KV-disk (DESIGN
§4.5): its tokens and image_spans are empty, priority is the sequence's, after_user is false. It is never matched
by a lookup, and ``scan`` removes it whatever its stamp (a live sequence does not outlive its process). The
headers of "prefix" and "checkpoint" files (and so their keys and bytes) are exactly as without the live kind.

Key (content address, key version 1): the hex SHA-256 of ``b"ignis-kv-key\\0\\1"`` followed by, for each of
structural_hash, kv_format, drafter and kind, a u32 UTF-8 length and the UTF-8 bytes; then a u64 token count and
each token as i64; then a u32 span count and, per span, u64 start, u64 end, u32 length and the ASCII digest; then, for
kind "live" only, a u32 UTF-8 length and the UTF-8 bytes of owner. Priority, after_user and the payload geometry are
not part of it: the same content under the same stamp is the same state.

A reader checks, in order: magic, version, header_len bound, the file is at least 44 + H bytes, header crc, header
schema, recomputed key == header key == file name, payload_len == the header's geometry, file size == O + P, the
padding is zeros, then (for a state it will use) the payload XXH3-128. Any change to this layout bumps
FORMAT_VERSION. (The "live" kind did not: no byte of a "prefix" or "checkpoint" file changed, and a reader from
before it deletes a "live" file as corrupt, "header schema", which is what a live file of an earlier process is due
anyway.)
"""
from __future__ import annotations

import hashlib
import os
import re
import struct
import zlib
from dataclasses import asdict, dataclass, fields
from functools import cached_property

import orjson
import xxhash

from ignisd.vocab import KINDS, LIVE, PRIORITIES

MAGIC = b"IGNISKV\0"
FORMAT_VERSION = 3
SUFFIX = ".ignkv"
KEY_DOMAIN = b"ignis-kv-key\0\1"
LEAD = struct.Struct("<8sII")            # magic, version, header_len: 16 bytes
TRAILER = struct.Struct("<IQ16s")        # header crc32, payload_len, payload XXH3-128: 28 bytes
MAX_HEADER_BYTES = 1 << 28               # 256 MiB: refuses a corrupt length before allocating it
FIXED_BYTES = LEAD.size + TRAILER.size   # 44: lead + trailer; the payload starts at payload_offset(header_len)
PAYLOAD_ALIGN = 4096                     # the payload's file offset is a multiple of this (O_DIRECT's alignment)
DIGEST_BYTES = TRAILER.size - 12         # 16
_HEX64 = re.compile(r"[0-9a-f]{64}")
RECORD_KINDS = (*KINDS, LIVE)


class FormatError(ValueError):
    """A file's bytes do not follow the spec. reason: what failed (short, for logs and counts)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class VersionError(FormatError):
    """A KV-disk file of another format version (reason "version N"): not this reader's to judge or delete; a scan
    leaves it alone, like a file of another stamp."""


def _int(v, name: str, lo: int = 0) -> int:
    if type(v) is not int or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")
    return v


def _str(v, name: str) -> str:
    if type(v) is not str:
        raise ValueError(f"{name} must be a str, got {v!r}")
    return v


@dataclass(frozen=True)
class DiskRecord:
    """What one KV-disk file holds besides its bytes: the state's identity, rank inputs, stamp and payload geometry.

    kind: "prefix" | "checkpoint" | "live" (an evicted live sequence). tokens: the token ids covered. image_spans:
    ((start, end, sha256 hex), ...) in token positions. priority: "interactive" | "agent". after_user: see
    RetainedState. structural_hash, kv_format, drafter: the stamp (DESIGN §4.4). page_tokens: tokens per page.
    page_bytes: bytes of one page. n_pages: pages in the payload. image_layout: ((name, dtype, shape, nbytes), ...)
    of the state image buffers in payload order, nbytes in bytes (empty on an all-attention model). owner: the live
    sequence of a "live" record (non-empty then, "" for every other kind). Lists are accepted and stored as tuples.
    Raises ValueError on a field of the wrong type or out of range.
    """

    kind: str
    tokens: tuple[int, ...]
    image_spans: tuple[tuple[int, int, str], ...]
    priority: str
    after_user: bool
    structural_hash: str
    kv_format: str
    drafter: str
    page_tokens: int
    page_bytes: int
    n_pages: int
    image_layout: tuple[tuple[str, str, tuple[int, ...], int], ...] = ()
    owner: str = ""

    def __post_init__(self):
        if self.kind not in RECORD_KINDS:
            raise ValueError(f"kind {self.kind!r} not one of {RECORD_KINDS}")
        if (_str(self.owner, "owner") != "") != (self.kind == LIVE):
            raise ValueError(f"owner {self.owner!r}: a {self.kind} record " + ("needs one" if self.kind == LIVE
                                                                                else "has none"))
        if self.priority not in PRIORITIES:
            raise ValueError(f"priority {self.priority!r} not one of {PRIORITIES}")
        if type(self.after_user) is not bool:
            raise ValueError(f"after_user must be a bool, got {self.after_user!r}")
        for name in ("structural_hash", "kv_format", "drafter"):
            _str(getattr(self, name), name)
        _int(self.page_tokens, "page_tokens", 1)
        _int(self.page_bytes, "page_bytes")
        _int(self.n_pages, "n_pages")
        tokens = tuple(self.tokens)
        if not all(type(t) is int for t in tokens) or (tokens and not 0 <= min(tokens) <= max(tokens) < 1 << 63):
            raise ValueError("tokens must be ints in 0 .. 2**63 - 1")
        spans = []
        for span in self.image_spans:
            start, end, digest = span
            if _int(start, "span start") > _int(end, "span end") or end > len(tokens):
                raise ValueError(f"image span {span!r} outside 0..{len(tokens)}")
            if type(digest) is not str or not _HEX64.fullmatch(digest):
                raise ValueError(f"image digest {digest!r} is not 64 lowercase hex")
            spans.append((start, end, digest))
        layout = []
        for name, dtype, shape, nbytes in self.image_layout:
            shape = tuple(_int(d, "shape dim") for d in shape)
            layout.append((_str(name, "buffer name"), _str(dtype, "dtype"), shape, _int(nbytes, "nbytes")))
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "image_spans", tuple(spans))
        object.__setattr__(self, "image_layout", tuple(layout))

    @property
    def stamp(self) -> tuple[str, str, str]:
        """(structural_hash, kv_format, drafter)."""
        return (self.structural_hash, self.kv_format, self.drafter)

    @property
    def pages_bytes(self) -> int:
        """Bytes of the pages: n_pages * page_bytes."""
        return self.n_pages * self.page_bytes

    @property
    def image_bytes(self) -> int:
        """Bytes of the state image: the sum of image_layout nbytes."""
        return sum(b for *_, b in self.image_layout)

    @property
    def payload_bytes(self) -> int:
        """Bytes of the payload: pages then image."""
        return self.pages_bytes + self.image_bytes

    @cached_property
    def key(self) -> str:
        """The content address (64 lowercase hex, the file name without ``.ignkv``); see the module spec."""
        h = hashlib.sha256(KEY_DOMAIN)
        for s in (*self.stamp, self.kind):
            b = s.encode()
            h.update(struct.pack("<I", len(b)) + b)
        h.update(struct.pack(f"<Q{len(self.tokens)}q", len(self.tokens), *self.tokens))
        h.update(struct.pack("<I", len(self.image_spans)))
        for start, end, digest in self.image_spans:
            h.update(struct.pack("<QQI", start, end, len(digest)) + digest.encode("ascii"))
        if self.kind == LIVE:
            b = self.owner.encode()
            h.update(struct.pack("<I", len(b)) + b)
        return h.hexdigest()


_FIELDS = tuple(f.name for f in fields(DiskRecord) if f.name != "owner")


def encode_header(record: DiskRecord) -> bytes:
    """The header bytes of ``record``: orjson of {"key", then every field in declaration order}, owner only for a
    "live" record."""
    obj = {"key": record.key, **asdict(record)}
    if record.kind != LIVE:
        del obj["owner"]
    return orjson.dumps(obj)


def decode_header(raw: bytes) -> tuple[str, DiskRecord]:
    """(header key, record) from header bytes. Raises FormatError("header schema: ...") when they are not the
    spec's JSON object (the caller has already checked the crc, so this means a writer bug or a foreign tool)."""
    try:
        obj = orjson.loads(raw)
        if type(obj) is not dict or tuple(obj) not in (("key", *_FIELDS), ("key", *_FIELDS, "owner")):
            raise ValueError(f"keys {list(obj) if type(obj) is dict else type(obj).__name__}")
        if ("owner" in obj) != (obj["kind"] == LIVE):
            raise ValueError("owner must be present exactly when kind is live")
        key = _str(obj.pop("key"), "key")
        return key, DiskRecord(**obj)
    except (orjson.JSONDecodeError, ValueError, TypeError) as e:
        raise FormatError(f"header schema: {e}") from None


def round_up(n: int) -> int:
    """`n` bytes rounded up to a multiple of PAYLOAD_ALIGN (4096)."""
    return -(-n // PAYLOAD_ALIGN) * PAYLOAD_ALIGN


def payload_offset(header_len: int) -> int:
    """The file offset of the payload: 44 + header_len rounded up to a multiple of PAYLOAD_ALIGN (4096)."""
    return round_up(FIXED_BYTES + header_len)


def file_bytes(record: DiskRecord) -> int:
    """The size in bytes of ``record``'s file: payload_offset(header length) + payload."""
    return expected_size(len(encode_header(record)), record)


def payload_hasher():
    """A new payload checksum (XXH3-128, seed 0): ``update(bytes-like)``, ``digest()`` (16 bytes)."""
    return xxhash.xxh3_128()


def file_prefix(header: bytes, payload_len: int, payload_digest: bytes) -> bytes:
    """Everything before the payload: lead, ``header`` (``encode_header``), trailer (crc, payload length, digest)
    and the zero padding up to ``payload_offset``: payload_offset(len(header)) bytes, a multiple of PAYLOAD_ALIGN.
    A writer that hashes while it writes passes 16 zero bytes and later overwrites them at ``digest_offset``."""
    head = (LEAD.pack(MAGIC, FORMAT_VERSION, len(header)) + header
            + TRAILER.pack(zlib.crc32(header), payload_len, payload_digest))
    return head + bytes(payload_offset(len(header)) - len(head))


def digest_offset(header_len: int) -> int:
    """The file offset of the 16-byte payload XXH3-128: 28 + header_len."""
    return LEAD.size + header_len + 12


def parse_lead(raw: bytes) -> int:
    """The header length from the first 16 bytes. Raises FormatError on a short read ("truncated"), a wrong
    magic ("magic"), another version ("version N") or an out-of-range length ("header length N")."""
    if len(raw) < LEAD.size:
        raise FormatError("truncated")
    magic, version, header_len = LEAD.unpack(raw[:LEAD.size])
    if magic != MAGIC:
        raise FormatError("magic")
    if version != FORMAT_VERSION:
        raise VersionError(f"version {version}")
    if not 1 <= header_len <= MAX_HEADER_BYTES:
        raise FormatError(f"header length {header_len}")
    return header_len


def parse_header(header: bytes, trailer: bytes, header_len: int, name_key: str) -> tuple[DiskRecord, bytes]:
    """(record, payload digest) from the header and trailer bytes of a file named ``<name_key>.ignkv``.
    Raises FormatError: "truncated" (short reads), "header crc", "header schema: ...", "key" (the recomputed key
    differs from the header's), "name" (the header's key is not the file name), "payload length"."""
    if len(header) != header_len or len(trailer) != TRAILER.size:
        raise FormatError("truncated")
    crc, payload_len, digest = TRAILER.unpack(trailer)
    if zlib.crc32(header) != crc:
        raise FormatError("header crc")
    key, record = decode_header(header)
    if record.key != key:
        raise FormatError("key")
    if key != name_key:
        raise FormatError("name")
    if payload_len != record.payload_bytes:
        raise FormatError("payload length")
    return record, digest


def expected_size(header_len: int, record: DiskRecord) -> int:
    """The exact size of a well-formed file: payload_offset(header_len) + payload_bytes."""
    return payload_offset(header_len) + record.payload_bytes


def byte_view(data) -> memoryview:
    """A flat byte view of a bytes-like (C-contiguous) object. Raises ValueError when it is not contiguous."""
    mv = memoryview(data)
    if not mv.c_contiguous:
        raise ValueError("buffer must be C-contiguous")
    return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


def stamp_of(stamp) -> tuple[str, str, str]:
    """(structural_hash, kv_format, drafter) of a Stamp-like object or a 3-tuple of str."""
    if hasattr(stamp, "structural_hash"):
        stamp = (stamp.structural_hash, stamp.kv_format, stamp.drafter)
    stamp = tuple(stamp)
    if len(stamp) != 3 or not all(type(s) is str for s in stamp):
        raise ValueError(f"stamp must be three strings, got {stamp!r}")
    return stamp


def read_head(f, key: str) -> tuple[DiskRecord, bytes]:
    """The reader's checks up to the payload, on a blocking binary file ``f`` positioned at 0: (record, payload
    digest), the file then positioned at the payload (``payload_offset``, past the padding, which must be zeros).
    key: the file name's key. Raises FormatError."""
    size = os.fstat(f.fileno()).st_size
    header_len = parse_lead(f.read(LEAD.size))
    if size < FIXED_BYTES + header_len:
        raise FormatError("truncated")
    header = f.read(header_len)
    record, digest = parse_header(header, f.read(TRAILER.size), header_len, key)
    want = expected_size(header_len, record)
    if size != want:
        raise FormatError("truncated" if size < want else "trailing bytes")
    pad = payload_offset(header_len) - FIXED_BYTES - header_len
    padding = f.read(pad)
    if len(padding) != pad:
        raise FormatError("truncated")
    if padding.count(0) != pad:
        raise FormatError("padding")
    return record, digest
