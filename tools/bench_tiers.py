"""Tier figures over the socket, one run (DESIGN §4.5, issue 9): demote / restore MB/s of KV-RAM and KV-disk against a
plain sequential write / read of the same bytes in the same directory, and TTFT of a long prompt restored from each
tier against cold prefill, then again after a restart.

    python tools/bench_tiers.py [--tokens 8000] [--threads 1] [--model PATH] [--dir DIR] [--cold-cache]
                                [--round-prefill-tokens N]

Serves the built-in SmolLM2 (fp32 KV) unless --model. One conversation X of about --tokens tokens is run once (its
checkpoint retained), then turn 2 of it (a short follow-up, resumed at that checkpoint) is timed: cold
(``cache_prompt: false``), restored from the device, from KV-RAM (after other traffic moved the checkpoint there),
from KV-disk (moved again), and from KV-disk after SIGTERM + a new daemon on the same directory. The daemon runs with
the restore floors at 1 so that every tier is taken, a device pool that holds one such prompt, an arena that holds
one such checkpoint (plus a few pages), and enough KV-disk for several.

How each figure is obtained (the daemon has no demotion timer; see the notes it prints):

- KV-RAM restore MB/s: ``ignis_tier_restore_bytes / ignis_tier_restore_seconds`` {tier="ram"} over the restore.
- KV-RAM demote MB/s, by timing: a request with a short prompt and a large max_tokens (so its admission needs the
  whole pool: the checkpoint is moved to the arena in its first round), cancelled after its first token; its TTFT
  minus the TTFT of the same request when nothing had to move, against the bytes moved.
- KV-disk demote MB/s, by timing: such a request pushes the checkpoint from the arena to KV-disk; its bytes are
  produced in that request's first round and the file is written (aiofiles, temporary name, fsync, rename) after
  it: from its first token to ``ignis_tier_disk_write_bytes`` counting the file (polled every 2 ms).
- KV-disk restore MB/s, by timing: the request that hits KV-disk waits in the queue while its file is read back and
  verified; ``ignis_tier_disk_read_bytes`` over its ``queue_ms``. (Also shown: the payload → pool copy from the
  restore metrics.)
- Also the daemon's own timers of the file tasks (``ignis_tier_disk_write_seconds`` / ``read_seconds``: start to
  end of the write, or of the read and its verification), without the client's view around them.
- Raw, the aim's baselines: a plain sequential write / read of the same bytes to the same disk. The daemon's
  KV-disk I/O bypasses the page cache (O_DIRECT, cache/disk_io.py; IGNIS_KV_DISK_DIRECT=0 turns it off), so the
  disk is what it is compared with: the same number of bytes written with O_DIRECT from one page-aligned 8 MiB
  buffer + fsync + directory fsync, and that file read back with O_DIRECT into one aligned 8 MiB buffer (also
  shown: read buffered after posix_fadvise(DONTNEED), i.e. from the disk through readahead, right after the
  O_DIRECT read of the same bytes). The virtual disk is backed by a file on the host, whose cache may serve bytes
  written or read moments before: the raw reads follow their write (and each other) at once, the daemon's read
  comes seconds after its write, so the figures of one run vary by up to 2x (every raw run is printed).
- Raw, page-cache figures (printed as other baselines; they measure guest memory, not the disk): the bytes written
  buffered in 8 MiB pieces with one fsync, then read back twice: into one reused 8 MiB buffer (it stays in the
  CPU cache) and into one buffer of the file's size, touched before (a restore keeps every byte; the daemon reads
  into a free KV-RAM arena extent, memory touched at load). Both hot in the page cache unless --cold-cache, which
  drops the files' pages with posix_fadvise before each read, the daemon's KV-disk files included. On a VM whose
  host backs guest memory lazily, freed guest memory goes back to the host within seconds (free page reporting),
  and a file's page cache filled into memory not used lately costs several times one filled into the pages an
  unlink just freed: the buffered write after a 5 s pause (raw runs 1 and 4, as the daemon's write, which follows
  such a pause) is the "paused" figure, runs 2, 3 and 5 (each right after an unlinked file) the "warm" one. 5 runs:
  a pause, 3 runs, a pause, the daemon's write, ..., its read, a pause, 2 runs. Every run is printed.
- In-process: the daemon's write code (disk_io.write_file) alternated with a plain write of the same bytes, in each
  mode against the plain write of that mode (O_DIRECT against O_DIRECT, buffered against buffered, both warm), and
  DiskStore.read_sync alternated with a plain O_DIRECT read of the same file.

Aims (issue 9, SmolLM2 at 8K): daemon / raw >= 0.8x for each disk figure; TTFT restored from KV-RAM <= 1% and from
KV-disk <= 3% of cold.
"""
from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
from bench_reuse import Bench, cached, ttft, words  # noqa: E402  (conversation sizing, as bench_reuse does it)
from daemon_support import DaemonProc  # noqa: E402

PT = 64
MB = 1e6
COLD_S = 5.0      # idle seconds after which freed guest memory is back with the host (free page reporting: ~2 s)


def pages_for(n: int) -> int:
    return -(-n // PT)


def metrics(b: Bench) -> dict[str, float]:
    text = b.call({"op": "metrics"})["result"]["text"]
    out = {}
    for ln in text.splitlines():
        if ln and not ln.startswith("#"):
            k, v = ln.rsplit(" ", 1)
            out[k] = float(v)
    return out


def m(ms: dict, name: str, tier: str | None = None) -> float:
    key = f'{name}{{tier="{tier}"}}' if tier else name
    return ms.get(key, 0.0)


def checkpoint_tier(b: Bench, tokens: int) -> str | None:
    st = b.call({"op": "status"})["result"]
    got = [r["tier"] for r in st["retained"] if r["kind"] == "checkpoint" and r["tokens"] == tokens]
    return got[0] if got else None


def checkpoint_lengths(b: Bench) -> set[int]:
    return {r["tokens"] for r in b.call({"op": "status"})["result"]["retained"] if r["kind"] == "checkpoint"}


def drop_cache(directory: Path) -> None:
    """Drop the page-cache pages of every file in `directory` (posix_fadvise DONTNEED; only these files)."""
    for f in directory.iterdir():
        if f.is_file():
            try:
                fd = os.open(f, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def touched_buffer(nbytes: int) -> memoryview:
    """`nbytes` of anonymous memory, every page written once (so a read into it pays no first-touch faults, like a
    read into the daemon's KV-RAM arena, which is allocated and mlock'ed at load)."""
    buf = mmap.mmap(-1, max(nbytes, 1))
    view = memoryview(buf)[:nbytes]
    for off in range(0, nbytes, 4096):
        view[off] = 0
    return view


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)          # the daemon renames and fsyncs the directory too
    os.fsync(fd)
    os.close(fd)


def raw_disk(directory: Path, nbytes: int, cold_cache: bool, kept: memoryview) -> dict[str, float]:
    """Plain sequential writes and reads of `nbytes` in `directory`, MB/s. Through the page cache (8 MiB pieces,
    one fsync): "w" the write, "r8" a read into one reused 8 MiB buffer, "rk" a read into `kept` (a touched buffer
    of nbytes that keeps every byte, as a restore must); both hot in the page cache unless `cold_cache`. Then the
    disk itself: "dw" the same bytes written with O_DIRECT from one page-aligned 8 MiB buffer (the last piece
    rounded up to 4096, then ftruncate, as the daemon does), fsync, directory fsync; "dr" that file read back with
    O_DIRECT into one aligned 8 MiB buffer; "cr" it read buffered into `kept` after posix_fadvise(DONTNEED) (from
    the disk, through readahead). Without O_DIRECT on this filesystem "dw" / "dr" are 0."""
    path = directory / f".raw-{os.getpid()}"
    piece = os.urandom(8 << 20)
    out = {}
    try:
        t0 = time.perf_counter()
        with open(path, "wb", buffering=0) as f:
            left = nbytes
            while left > 0:
                f.write(piece[:min(left, len(piece))])
                left -= len(piece)
            os.fsync(f.fileno())
        _fsync_dir(directory)
        out["w"] = nbytes / (time.perf_counter() - t0) / MB
        for name, into in (("r8", None), ("rk", kept)):
            if cold_cache:
                fd = os.open(path, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
            t0 = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                if into is None:
                    while f.read(8 << 20):
                        pass
                else:
                    for off in range(0, nbytes, 8 << 20):
                        f.readinto(into[off:off + (8 << 20)])
            out[name] = nbytes / (time.perf_counter() - t0) / MB
        path.unlink()
        out.update(raw_direct(directory, path, nbytes, piece, kept))
    finally:
        path.unlink(missing_ok=True)
    return out


def raw_direct(directory: Path, path: Path, nbytes: int, piece: bytes, kept: memoryview) -> dict[str, float]:
    """``raw_disk``'s "dw", "dr" and "cr" (the file is left for the caller to remove)."""
    buf = mmap.mmap(-1, 8 << 20)
    buf[:] = piece
    view = memoryview(buf)
    out = {"dw": 0.0, "dr": 0.0}
    try:
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_DIRECT, 0o600)
    except OSError:
        with open(path, "wb") as f:              # no O_DIRECT here: a file for the cold buffered read
            for off in range(0, nbytes, 8 << 20):
                f.write(view[:min(8 << 20, nbytes - off)])
    else:
        try:
            for off in range(0, nbytes, 8 << 20):
                n = min(8 << 20, nbytes - off)
                os.pwrite(fd, view[:-(-n // 4096) * 4096], off)
            os.ftruncate(fd, nbytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(directory)
        out["dw"] = nbytes / (time.perf_counter() - t0) / MB
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            t0 = time.perf_counter()
            for off in range(0, nbytes, 8 << 20):
                os.preadv(fd, [view], off)
            out["dr"] = nbytes / (time.perf_counter() - t0) / MB
        finally:
            os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        t0 = time.perf_counter()
        for off in range(0, nbytes, 8 << 20):
            os.preadv(fd, [kept[off:off + (8 << 20)]], off)
        out["cr"] = nbytes / (time.perf_counter() - t0) / MB
    finally:
        os.close(fd)
    view.release()
    buf.close()
    return out


class Run:
    """One tiered daemon and the requests of the bench."""

    def __init__(self, args, d: DaemonProc, context: int):
        self.args = args
        self.b = Bench(d, context)
        self.n = 0

    def chat(self, messages, **kw) -> dict:
        return self.b.chat(messages, **kw)

    def bound_request(self, max_tokens: int) -> tuple[float, float, dict]:
        """A short prompt bound to `max_tokens` more (its admission reserves that many pages), cancelled after its
        first token, reuse off (it restores and retains nothing): (TTFT ms measured by the client, the wall clock at
        its first token, the done reply)."""
        self.n += 1
        rid = f"bound{self.n}"
        msgs = [{"role": "user", "content": f"Bound {self.n}: " + words(40, self.n)}]
        c = self.b.conn()
        try:
            t0 = time.perf_counter()
            c.send({"id": rid, "op": "chat", "messages": msgs, "temperature": 0, "max_tokens": max_tokens,
                    "stream": True, "cache_prompt": False})
            first = None
            while True:
                r = c.recv()
                if r.get("id") != rid:
                    continue
                if r["type"] == "delta" and first is None:
                    first = time.perf_counter()
                    c.send({"id": f"x{rid}", "op": "cancel", "target": rid})
                if r["type"] in ("done", "error"):
                    if first is None:
                        first = time.perf_counter()
                    break
            if r["type"] == "error":
                raise RuntimeError(r)
            return (first - t0) * 1e3, first, r
        finally:
            c.close()


def in_process(a, kvdir: Path, disk_bytes: int, pool_pages: int, n_pages: int) -> dict[str, float]:
    """MB/s of the tier code paths run here on this model's geometry: transfer.read_pages into a HostArena and
    write_pages back (fp32, one thread, as the daemon's worker), DiskStore.read_sync of the largest KV-disk file
    (the daemon is stopped: the directory lock is free), sha256 of its bytes, and a plain memcpy."""
    from ignisd.cache.disk_format import payload_hasher

    import torch

    from ignisd.cache import transfer
    from ignisd.cache.disk_store import DiskStore
    from ignisd.cache.host_arena import HostArena
    from ignisd.cache.kv_format import get_kv_format
    from ignisd.cache.kv_store import KVStore
    from ignisd.model.loader import open_model

    torch.set_num_threads(a.threads)
    spec = open_model(a.model).spec
    kv = KVStore(get_kv_format("fp32"), spec, pool_pages)
    n = n_pages * kv.page_bytes
    arena = HostArena(n, lock=False)
    arena.buf.fill_(1)
    pages = list(range(n_pages))
    out = {}

    def best(fn) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return n / min(times) / MB

    out["read_pages"] = best(lambda: transfer.read_pages(kv, pages, arena.view(0, n)))
    out["write_pages"] = best(lambda: transfer.write_pages(kv, pages, arena.view(0, n)))
    src = torch.empty(n, dtype=torch.uint8)
    out["memcpy"] = best(lambda: arena.buf.copy_(src))
    files = sorted(kvdir.glob("*.ignkv"), key=lambda f: f.stat().st_size)
    if files:
        big = files[-1]
        with DiskStore(kvdir, disk_bytes) as store:
            if a.cold_cache:
                drop_cache(kvdir)
            t0 = time.perf_counter()
            rec, pg, im = store.read_sync(big.stem)
            size = len(pg) + len(im)
            out["read_sync"] = size / (time.perf_counter() - t0) / MB
            into = touched_buffer(size)                  # as the daemon's read into a free arena extent
            times, raw_times = [], []
            for _ in range(3):                           # alternated with a plain O_DIRECT read of the same file
                if a.cold_cache:
                    drop_cache(kvdir)
                t0 = time.perf_counter()
                store.read_sync(big.stem, into=(into[:rec.pages_bytes], into[rec.pages_bytes:]))
                times.append(time.perf_counter() - t0)
                raw_times.append(direct_read_seconds(big))
            out["read_sync_touched"] = size / min(times) / MB
            out["read_raw_direct"] = big.stat().st_size / min(raw_times) / MB if all(raw_times) else 0.0
            data = bytes(pg)
            t0 = time.perf_counter()
            h = payload_hasher()
            h.update(data)
            h.digest()
            out["checksum"] = len(data) / (time.perf_counter() - t0) / MB
            out.update(write_pairs(kvdir, into))
    return out


def direct_read_seconds(path: Path) -> float:
    """Seconds of a plain O_DIRECT read of the whole file into one aligned 8 MiB buffer (0 without O_DIRECT)."""
    buf = mmap.mmap(-1, 8 << 20)
    view = memoryview(buf)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return 0.0
    try:
        t0 = time.perf_counter()
        for off in range(0, path.stat().st_size, 8 << 20):
            os.preadv(fd, [view], off)
        return time.perf_counter() - t0
    finally:
        os.close(fd)
        view.release()
        buf.close()


def write_pairs(directory: Path, data: memoryview, pairs: int = 3) -> dict[str, float]:
    """MB/s of ``disk_io.write_file`` (+ rename + directory fsync, as DiskStore.write) and of a plain write of the
    same bytes from the same touched buffer (8 MiB pieces, one fsync, directory fsync), alternated back to back
    (each follows the other's unlinked file), in each I/O mode, like with like: "write_file_direct" (O_DIRECT, the
    default) against "write_raw_direct" (O_DIRECT straight from the buffer, the last piece through an aligned one),
    "write_file_buffered" (IGNIS_KV_DISK_DIRECT=0) against "write_raw_buffered". The medians of `pairs` runs each;
    without O_DIRECT on this filesystem the direct figures are left out."""
    from ignisd.cache import disk_direct, disk_io

    tail = mmap.mmap(-1, 8 << 20)
    tail_view = memoryview(tail)

    def daemon_code(direct: bool) -> float:
        tmp, final = directory / ".pair.ignkv.tmp", directory / ".pair.ignkv"
        saved = os.environ.get(disk_direct.DIRECT_ENV)
        os.environ[disk_direct.DIRECT_ENV] = "1" if direct else "0"
        try:
            t0 = time.perf_counter()
            disk_io.write_file(tmp, bytes(4096), (data,), 0)
            os.rename(tmp, final)
            _fsync_dir(directory)
            dt = time.perf_counter() - t0
        finally:
            if saved is None:
                del os.environ[disk_direct.DIRECT_ENV]
            else:
                os.environ[disk_direct.DIRECT_ENV] = saved
        final.unlink()
        return data.nbytes / dt / MB

    def plain(direct: bool) -> float:
        path = directory / ".pair-raw"
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DIRECT if direct else 0), 0o600)
        try:
            for off in range(0, data.nbytes, 8 << 20):
                piece = data[off:off + (8 << 20)]
                if direct and piece.nbytes % 4096:
                    n = -(-piece.nbytes // 4096) * 4096
                    tail_view[:piece.nbytes] = piece
                    tail_view[piece.nbytes:n] = bytes(n - piece.nbytes)
                    piece = tail_view[:n]
                os.pwrite(fd, piece, off)
            if direct:
                os.ftruncate(fd, data.nbytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(directory)
        dt = time.perf_counter() - t0
        path.unlink()
        return data.nbytes / dt / MB

    out = {}
    try:
        plain(True)
    except OSError:
        modes = ("buffered",)
    else:
        modes = ("direct", "buffered")
    for mode in modes:
        direct = mode == "direct"
        plain(direct)                                    # the first file takes memory not used lately
        runs = [(daemon_code(direct), plain(direct)) for _ in range(pairs)]
        out[f"write_file_{mode}"] = statistics.median(d for d, _ in runs)
        out[f"write_raw_{mode}"] = statistics.median(r for _, r in runs)
    tail_view.release()
    tail.close()
    return out


def wait_quiet(b: Bench, d: DaemonProc, quiet_s: float = 0.3, timeout: float = 120) -> None:
    """Until the daemon is idle and its KV-disk write counter has not moved for `quiet_s`."""
    d.wait_idle(timeout)
    last, since = None, time.monotonic()
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        w = m(metrics(b), "ignis_tier_disk_write_bytes_total")
        if w != last:
            last, since = w, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.02)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8000, help="length of the restored prompt (default 8000)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--model", default=None, help="a model path (default: the built-in SmolLM2)")
    ap.add_argument("--dir", default=None, help="the KV-disk directory (default: a new one under /tmp)")
    ap.add_argument("--cold-cache", action="store_true",
                    help="drop the page cache of the KV-disk files (and of the raw file) before each read")
    ap.add_argument("--round-prefill-tokens", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=1, help="cold TTFT runs (median)")
    a = ap.parse_args()

    T = a.tokens
    load0 = os.getloadavg()[0]
    model = ["--model", a.model] if a.model else []
    base = model + ["--lanes", "1", "--server-threads", str(a.threads)]
    if a.round_prefill_tokens:
        base += ["--server-round-prefill-tokens", str(a.round_prefill_tokens)]
    context = min(8192, T + 192) if not a.model else T + 192
    kvdir = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="ignis-bench-kv-", dir="/tmp"))
    kvdir.mkdir(parents=True, exist_ok=True)
    tmp = lambda: Path(tempfile.mkdtemp(prefix="ignis-bench-tiers-"))  # noqa: E731

    # probe: the page size (the arena is sized in pages of this model)
    probe = DaemonProc(base + ["--vram-kv-pool-bytes", "1Ktok", "--reuse-kv-host-pool-bytes", "0",
                               "--model-context-tokens", str(context), "--reuse-prompt", "off"], tmp())
    try:
        st = probe.status()
        page_bytes = st["model"].get("page_bytes") or st["tiers"][0]["bytes_total"] // st["kv_pool"]["pages_total"]
        name = st["model"].get("name")
    finally:
        probe.stop()
    pool_pages = pages_for(T + 192) + 2
    arena_pages = pages_for(T) + 4
    disk_bytes = 6 * pages_for(T) * page_bytes + (64 << 20)
    args = base + ["--vram-kv-pool-bytes", f"{pool_pages * PT}tok", "--model-context-tokens", str(context),
                   "--reuse-kv-host-pool-bytes", str(arena_pages * page_bytes),
                   "--kv-disk-bytes", str(disk_bytes), "--kv-disk-dir", str(kvdir),
                   "--reuse-restore-floor-ram", "1", "--reuse-restore-floor-disk", "1"]
    print(f"model {name}: page {page_bytes / MB:.2f} MB ({page_bytes // PT} B/token), pool {pool_pages} pages, "
          f"arena {arena_pages} pages ({arena_pages * page_bytes / MB:.0f} MB), KV-disk {disk_bytes / MB:.0f} MB "
          f"in {kvdir}, {a.threads} thread(s)")

    d = DaemonProc(args, tmp())
    notes = []
    try:
        r = Run(a, d, context)
        b = r.b
        X = b.conversation_of(T, 1)

        def fork(k: int) -> list[dict]:
            return X + [{"role": "assistant", "content": f"Answer {k}."}, {"role": "user", "content": f"Go on {k}."}]

        def hit_of(bench, k: int) -> dict:
            """Turn 2 (fork k) sent as its token ids: a completion has no cut points, so the timed hit leaves no
            checkpoint of its own (an attention-only model keeps every opener, DESIGN §4.3) that would compete with
            X's for the tiers; the restore path is the same."""
            ids = bench.tokenize(fork(k))["tokens"]
            return bench.call({"op": "completion", "prompt": ids, "max_tokens": 1, "temperature": 0})

        fork_tokens = b.n_tokens(fork(0))
        assert fork_tokens + 1 <= context, (fork_tokens, context)
        bound = context - 96                        # a ~60-token prompt + this many: nearly the whole pool

        # a request bound to the whole pool with nothing to move: the baseline of the demotion timings
        base_ttft = statistics.median(r.bound_request(bound)[0] for _ in range(3))
        d.wait_idle()
        cold = [ttft(b.chat(fork(0), cache_prompt=False)) for _ in range(a.repeat)]
        cold_ms = statistics.median(cold)
        before = checkpoint_lengths(b)
        b.chat(X)                                   # turn 1: the checkpoint to restore
        d.wait_idle()
        (ck,) = checkpoint_lengths(b) - before
        ck_bytes = pages_for(ck) * page_bytes
        rows = []

        hit = hit_of(b, 1)
        assert hit["ignis"]["reuse"]["tier"] == "device" and cached(hit) == ck, hit["ignis"]
        rows.append(("device", ttft(hit), cached(hit)))
        d.wait_idle()

        # device → KV-RAM: a pool-sized request moves the checkpoint (and its prefix) into the arena
        m0 = metrics(b)
        ttft_ram_move, _, _ = r.bound_request(bound)
        d.wait_idle()
        assert checkpoint_tier(b, ck) == "ram", b.call({"op": "status"})["result"]["retained"]
        m1 = metrics(b)
        demoted_ram = (m(m1, "ignis_tier_demotions_total", "ram") - m(m0, "ignis_tier_demotions_total", "ram"))
        after_ttft = r.bound_request(bound)[0]      # nothing left to move: the baseline again (the box is shared)
        d.wait_idle()
        base_ttft = min(base_ttft, after_ttft)
        ram_demote_s = max((ttft_ram_move - base_ttft) / 1e3, 1e-6)

        m0 = metrics(b)
        hit = hit_of(b, 2)
        assert hit["ignis"]["reuse"]["tier"] == "ram" and cached(hit) == ck, hit["ignis"]
        rows.append(("ram", ttft(hit), cached(hit)))
        m1 = metrics(b)
        ram_restore_b = m(m1, "ignis_tier_restore_bytes_total", "ram") - m(m0, "ignis_tier_restore_bytes_total", "ram")
        ram_restore_s = m(m1, "ignis_tier_restore_seconds_total", "ram") - m(m0, "ignis_tier_restore_seconds_total",
                                                                               "ram")
        wait_quiet(b, d)

        # KV-RAM → KV-disk: another checkpoint needs the arena; pool-sized requests push until ours is on disk
        other = b.conversation_of(min(T // 4, 1000), 2)
        b.chat(other)
        d.wait_idle()
        # raw runs in both conditions a file's page cache meets on this VM (see the docstring): run 1 after an
        # idle pause ("cold", as the daemon's write below), runs 2 and 3 right after an unlinked file ("warm")
        kept = touched_buffer(ck_bytes)
        time.sleep(COLD_S)
        raws = [raw_disk(kvdir, ck_bytes, a.cold_cache, kept) for _ in range(3)]
        time.sleep(COLD_S)
        disk_write_s = disk_write_b = None
        ws0 = m(metrics(b), "ignis_tier_disk_write_seconds_total")
        wb0 = m(metrics(b), "ignis_tier_disk_write_bytes_total")
        for _ in range(6):
            if checkpoint_tier(b, ck) == "disk":
                break
            w0 = m(metrics(b), "ignis_tier_disk_write_bytes_total")
            _, first_at, _ = r.bound_request(bound)
            if checkpoint_tier(b, ck) == "disk":
                end = time.monotonic() + 300
                while time.monotonic() < end:
                    w1 = m(metrics(b), "ignis_tier_disk_write_bytes_total")
                    if w1 - w0 >= ck_bytes:
                        disk_write_s = time.perf_counter() - first_at
                        disk_write_b = w1 - w0
                        break
                    time.sleep(0.002)
            d.wait_idle()
        assert checkpoint_tier(b, ck) == "disk", b.call({"op": "status"})["result"]["retained"]
        wait_quiet(b, d)
        m1 = metrics(b)
        timed_w = (m(m1, "ignis_tier_disk_write_bytes_total") - wb0, m(m1, "ignis_tier_disk_write_seconds_total") - ws0)

        if a.cold_cache:
            drop_cache(kvdir)
        m0 = metrics(b)
        hit = hit_of(b, 3)
        assert hit["ignis"]["reuse"]["tier"] == "disk" and cached(hit) == ck, hit["ignis"]
        rows.append(("disk", ttft(hit), cached(hit)))
        m1 = metrics(b)
        read_b = m(m1, "ignis_tier_disk_read_bytes_total") - m(m0, "ignis_tier_disk_read_bytes_total")
        arena1 = m(m1, "ignis_tier_disk_reads_arena_total") - m(m0, "ignis_tier_disk_reads_arena_total")
        read_s = max(hit["timings"]["queue_ms"] / 1e3, 1e-6)
        timed_r = m(m1, "ignis_tier_disk_read_seconds_total") - m(m0, "ignis_tier_disk_read_seconds_total")
        pay_b = m(m1, "ignis_tier_restore_bytes_total", "disk") - m(m0, "ignis_tier_restore_bytes_total", "disk")
        pay_s = m(m1, "ignis_tier_restore_seconds_total", "disk") - m(m0, "ignis_tier_restore_seconds_total", "disk")
        wait_quiet(b, d)
        time.sleep(COLD_S)
        raws += [raw_disk(kvdir, ck_bytes, a.cold_cache, kept) for _ in range(2)]
        raw_w = statistics.median(raws[i]["w"] for i in (0, 3))          # buffered, after a pause, as the daemon's
        raw_ww = statistics.median(raws[i]["w"] for i in (1, 2, 4))      # buffered, warm
        raw_r = statistics.median(x["r8"] for x in raws)                 # page cache (hot unless --cold-cache)
        raw_k = statistics.median(x["rk"] for x in raws)
        raw_dw = statistics.median(x["dw"] for x in raws)                # the disk: O_DIRECT
        raw_dr = statistics.median(x["dr"] for x in raws)
        raw_cr = statistics.median(x["cr"] for x in raws)                # the disk, buffered after DONTNEED
        del kept
    finally:
        t0 = time.perf_counter()
        rc = d.stop()                               # SIGTERM: what is not on KV-disk yet is written
        stop_s = time.perf_counter() - t0
    flushed = "kv_disk_flush" in d.log_path.read_text(errors="replace")

    # restart on the same directory
    d2 = DaemonProc(args, tmp())
    try:
        b2 = Bench(d2, context)
        if a.cold_cache:
            drop_cache(kvdir)
        m0 = metrics(b2)
        hit = hit_of(b2, 4)
        m1 = metrics(b2)
        reuse = hit["ignis"]["reuse"]
        after = (reuse["tier"], ttft(hit), cached(hit))
        read2_b = m(m1, "ignis_tier_disk_read_bytes_total") - m(m0, "ignis_tier_disk_read_bytes_total")
        arena2 = m(m1, "ignis_tier_disk_reads_arena_total") - m(m0, "ignis_tier_disk_reads_arena_total")
        read2_s = max(hit["timings"]["queue_ms"] / 1e3, 1e-6)
        timed_r2 = m(m1, "ignis_tier_disk_read_seconds_total") - m(m0, "ignis_tier_disk_read_seconds_total")
        cold2 = ttft(b2.chat(fork(4), cache_prompt=False))
    finally:
        d2.stop()

    # the same code paths in-process, without the daemon around them (the runner's transfer step; the KV-disk read)
    proc = in_process(a, kvdir, disk_bytes, pool_pages, pages_for(ck))

    # ---------------------------------------------------------------- report
    print(f"\nprompt {fork_tokens} tokens, checkpoint {ck} tokens = {ck_bytes / MB:.1f} MB of KV")
    print("\nbandwidth (MB/s)                 daemon        raw   daemon/raw   how")
    ram_demote = ck_bytes / ram_demote_s / MB
    print(f"KV-RAM demote (device→arena)  {ram_demote:>9.0f}          -            -   TTFT of a pool-sized request "
          f"that moved it ({ttft_ram_move:.1f} ms) − the same with nothing to move ({base_ttft:.1f} ms); "
          f"{demoted_ram:.0f} states moved")
    print(f"KV-RAM restore (arena→pool)   {ram_restore_b / max(ram_restore_s, 1e-9) / MB:>9.0f}          -"
          f"            -   ignis_tier_restore_bytes/seconds (ram): {ram_restore_b / MB:.1f} MB in "
          f"{ram_restore_s * 1e3:.2f} ms")
    def ratio(fig: float, raw: float) -> str:
        return f"{raw:>9.0f}  {fig / raw:>10.2f}x" if raw else f"{'-':>9}  {'-':>11}"

    tw_b, tw_s = timed_w
    dr2 = read2_b / read2_s / MB
    dr = read_b / read_s / MB
    fig_w = disk_write_b / disk_write_s / MB if disk_write_s else 0.0
    fig_tw, fig_tr, fig_tr2 = (nb / max(sec, 1e-9) / MB for nb, sec in ((tw_b, tw_s), (read_b, timed_r),
                                                                      (read2_b, timed_r2)))
    print("KV-disk, the aim's figures: daemon / a plain sequential write or read of the same bytes to the same disk")
    if disk_write_s:
        print(f"KV-disk demote (write)        {fig_w:>9.0f}  {ratio(fig_w, raw_dw)}   first token of the "
              f"request that pushed it → the file counted written ({disk_write_b / MB:.1f} MB in "
              f"{disk_write_s * 1e3:.1f} ms), vs raw O_DIRECT write + fsync")
    else:
        print("KV-disk demote (write)                -  (the write was not seen: see notes)")
        notes.append("the KV-disk write of the checkpoint was not observed after the request that demoted it")
    print(f"  write, daemon's timer       {fig_tw:>9.0f}  {ratio(fig_tw, raw_dw)}   ignis_tier_disk_write_bytes / "
          f"_seconds: the file task alone ({tw_b / MB:.1f} MB in {tw_s * 1e3:.1f} ms), vs raw O_DIRECT write")
    print(f"KV-disk restore (read+verify) {dr:>9.0f}  {ratio(dr, raw_dr)}   ignis_tier_disk_read_bytes over the "
          f"hit's queue_ms ({read_b / MB:.1f} MB in {read_s * 1e3:.1f} ms), vs raw O_DIRECT read")
    print(f"  read, daemon's timer        {fig_tr:>9.0f}  {ratio(fig_tr, raw_dr)}   ignis_tier_disk_read_bytes / "
          f"_seconds ({read_b / MB:.1f} MB in {timed_r * 1e3:.1f} ms), vs raw O_DIRECT read")
    print(f"  after restart, daemon's     {fig_tr2:>9.0f}  {ratio(fig_tr2, raw_dr)}   the same after SIGTERM + a "
          f"new daemon ({read2_b / MB:.1f} MB in {timed_r2 * 1e3:.1f} ms)")
    print(f"after restart: read+verify    {dr2:>9.0f}  {ratio(dr2, raw_dr)}   ({read2_b / MB:.1f} MB in "
          f"{read2_s * 1e3:.1f} ms over the hit's queue_ms)")
    print("  other baselines, daemon / raw (the page-cache ones measure guest memory, not the disk):")
    for label, fig, raw, how in (
            ("  write vs buffered, paused", fig_w, raw_w, "raw buffered write + fsync after a 5 s pause (runs 1, 4)"),
            ("  write vs buffered, warm", fig_w, raw_ww, "raw buffered write + fsync into freed pages (runs 2, 3, 5)"),
            ("  timer vs buffered, paused", fig_tw, raw_w, "the daemon's write timer, same raw"),
            ("  read vs buffered, dropped", dr, raw_cr, "raw buffered read after posix_fadvise(DONTNEED): the disk "
                                                         "through readahead"),
            ("  read vs page cache 8 MiB", dr, raw_r, "raw buffered read of a file just written, into one 8 MiB "
                                                      "buffer" + ("" if a.cold_cache else " (hot page cache)")),
            ("  read vs page cache kept", dr, raw_k, "the same into a touched buffer of the file's size")):
        print(f"{label:<29} {fig:>9.0f}  {ratio(fig, raw)}   {how}")
    print("  raw runs (MB/s; buffered write / page-cache read 8 MiB / read kept | O_DIRECT write / O_DIRECT read / "
          "buffered read after DONTNEED): " + ", ".join(
              f"{x['w']:.0f}/{x['r8']:.0f}/{x['rk']:.0f} | {x['dw']:.0f}/{x['dr']:.0f}/{x['cr']:.0f}" for x in raws)
          + f" — after a {COLD_S:.0f} s pause then 2 back to back, before the daemon's write ({COLD_S:.0f} s after "
          "them); again after its read: a pause, then 1. Buffered write \"paused\": runs 1 and 4, each after a "
          "pause like the daemon's write (on a VM whose host backs guest memory lazily, freed memory goes back to "
          "the host within seconds and a file's page cache filled into it costs several times more); \"warm\": "
          "runs 2, 3, 5, each filling the pages the previous run's unlink just freed. Others: median of all 5")
    print(f"  read into: {'a KV-RAM arena extent' if arena1 else 'the reused read buffer (no arena extent free)'}"
          f"; after restart: {'a KV-RAM arena extent' if arena2 else 'a read buffer (no arena extent free)'} "
          f"(ignis_tier_disk_reads_arena); load average at start / end {load0:.2f} / {os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} CPUs (others' work on the box slows every figure)")
    print(f"KV-disk payload → pool        {pay_b / max(pay_s, 1e-9) / MB:>9.0f}          -            -   "
          f"ignis_tier_restore_bytes/seconds (disk)")

    print(f"in-process, same code:  device→arena (transfer.read_pages) {proc['read_pages']:.0f}, arena→pool "
          f"(write_pages) {proc['write_pages']:.0f}, KV-disk read+verify (DiskStore.read_sync) into a new buffer "
          f"{proc.get('read_sync', 0):.0f}, into touched memory {proc.get('read_sync_touched', 0):.0f}, payload "
          f"checksum (XXH3-128) alone {proc.get('checksum', 0):.0f}, memcpy {proc['memcpy']:.0f}")
    if proc.get("read_raw_direct"):
        print(f"in-process KV-disk read, alternated with a plain O_DIRECT read of the same file into one 8 MiB "
              f"buffer: DiskStore.read_sync into touched memory {proc['read_sync_touched']:.0f}, plain "
              f"{proc['read_raw_direct']:.0f} MB/s = {proc['read_sync_touched'] / proc['read_raw_direct']:.2f}x")
    for mode, how in (("direct", "O_DIRECT (the default)"), ("buffered", "buffered (IGNIS_KV_DISK_DIRECT=0) "
                                                                          "against a buffered plain write, each "
                                                                          "into the pages the other's unlink "
                                                                          "freed")):
        if f"write_file_{mode}" in proc:
            fig, raw = proc[f"write_file_{mode}"], proc[f"write_raw_{mode}"]
            print(f"in-process KV-disk write, alternated with a plain write of the same bytes, {how}: "
                  f"disk_io.write_file {fig:.0f}, plain {raw:.0f} MB/s = {fig / raw:.2f}x")

    print(f"\nTTFT of the {fork_tokens}-token turn 2 (ms)    ttft   cached   % of cold   aim")
    print(f"cold (cache_prompt false)        {cold_ms:>8.1f}   {0:>6}   {100:>8.1f}%")
    aims = {"device": None, "ram": 1.0, "disk": 3.0}
    for tier, t, c in rows:
        pct = 100 * t / cold_ms
        aim = aims[tier]
        verdict = "" if aim is None else f"<= {aim:.0f}%: {'met' if pct <= aim else 'NOT met'}"
        print(f"{tier:<32} {t:>8.1f}   {c:>6}   {pct:>8.2f}%   {verdict}")
    tier, t, c = after
    pct = 100 * t / cold2
    print(f"after restart: {str(tier):<17} {t:>8.1f}   {c:>6}   {pct:>8.2f}%   <= 3%: "
          f"{'met' if pct <= 3 and tier == 'disk' else 'NOT met'} (cold after restart {cold2:.1f} ms)")
    print(f"\nshutdown: exit {rc} in {stop_s:.1f} s, flush logged: {flushed}")
    notes.append("KV-RAM demotion has no daemon timer: it is the TTFT difference of two identical requests, so "
                 "it carries their noise (a few ms); KV-disk reads: the queue wait also holds one admission try")
    if not a.cold_cache:
        notes.append("the raw buffered file is read hot from the page cache (--cold-cache drops it); the KV-disk "
                     "files are read from the disk with O_DIRECT unless IGNIS_KV_DISK_DIRECT=0 (then --cold-cache "
                     "drops their cache too)")
    notes.append("a KV-disk read into a read buffer (no arena extent free) that is new or not touched lately pays "
                 "its first-touch page faults, which on these VMs cost more than the disk; compare the read after "
                 "restart, into an arena extent")
    for n in notes:
        print("note:", n)
    if not a.dir:
        shutil.rmtree(kvdir, ignore_errors=True)


if __name__ == "__main__":
    main()
