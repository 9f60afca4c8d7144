"""Three tiers over the socket (DESIGN §4.5, issue 9): a conversation's retained state is hit on the device, pushed
to KV-RAM and then to KV-disk by other traffic, and hit from each tier with the cold run's greedy output; floors;
a restart indexes the KV-disk files again (after SIGTERM and after kill -9); a corrupt file is never used; a full or
failing KV-disk keeps the daemon serving. Every test ends with the accounting proven (the engine's integrity check
runs when idle: a failure there is logged and the daemon's status would not settle)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from daemon_support import DaemonProc, agents_then_interactive, live_files, metric

WORDS = ("river bridge market garden harbour tower museum street square palace canal station library theatre "
         "castle forest meadow valley mountain island").split()


def words(n: int, salt: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n))


def convo(salt: int, turns: int = 1) -> list[dict]:
    """A system block, a long first user message, and `turns - 1` scripted later turns."""
    msgs = [{"role": "system", "content": f"System {salt}. You answer about " + words(80, salt)},
            {"role": "user", "content": f"Question {salt}: tell me about " + words(90, salt + 1)}]
    for t in range(1, turns):
        msgs += [{"role": "assistant", "content": f"Answer {t} " + words(12, salt + t)},
                 {"role": "user", "content": f"Follow-up {t}: " + words(20, salt + 2 * t)}]
    return msgs


def chat(c, rid, msgs, max_tokens=6):
    r = c.request({"id": rid, "op": "chat", "messages": msgs, "temperature": 0, "max_tokens": max_tokens})
    assert r["type"] == "done", r
    return r


def page_bytes(model_dir: Path) -> int:
    from ignisd.cache.kv_format import get_kv_format
    from ignisd.model.spec import ModelSpec
    spec = ModelSpec.from_hf_config(json.loads((model_dir / "config.json").read_text()), "tiny")
    return get_kv_format("fp32").page_bytes(spec, 64)


def tiers_of(d) -> dict:
    return {t["tier"]: t for t in d.status()["tiers"]}


def where(d, tokens: int) -> str | None:
    """The tier of the retained checkpoint of `tokens` tokens (None when gone)."""
    rows = [r for r in d.status()["retained"] if r["kind"] == "checkpoint" and r["tokens"] == tokens]
    return rows[0]["tier"] if rows else None


def checkpoint_tokens(d, expect: int = 2) -> int:
    """The length of the retained opener checkpoint of the one conversation run so far: the shorter of its `expect`
    checkpoints (an attention-only model in an exact format also keeps the whole sequence, prompt + reply, DESIGN
    §4.3, so 2; hq-e8-2b keeps the previous rule, 1; the scripted turn 2 does not send that reply back, so it
    resumes at the opener)."""
    cks = sorted(r["tokens"] for r in d.status()["retained"] if r["kind"] == "checkpoint")
    assert len(cks) == expect, cks
    return cks[0]


def push(c, d, tokens: int, want: str, salt0: int) -> int:
    """Send other conversations until the checkpoint of `tokens` tokens sits in tier `want`."""
    salt = salt0
    for _ in range(40):
        if where(d, tokens) == want:
            return salt
        chat(c, f"push{salt}", convo(salt), max_tokens=2)
        salt += 1
        d.wait_idle()
    raise AssertionError(f"the checkpoint never reached {want}: {d.status()['retained']}")


@pytest.fixture(scope="module")
def cold(start_module_daemon, tiny_llama_dir):
    return start_module_daemon(["--model", str(tiny_llama_dir), "--lanes", "1", "--vram-kv-pool-bytes", "4Ktok",
                               "--model-context-tokens", "1024", "--reuse-prompt", "off"])


def tiered_args(model_dir: Path, disk_dir: Path, arena_pages: int = 12, disk: str = "64M") -> list[str]:
    return ["--model", str(model_dir), "--lanes", "1", "--vram-kv-pool-bytes", "1Ktok",
            "--model-context-tokens", "512", "--reuse-kv-host-pool-bytes", str(arena_pages * page_bytes(model_dir)),
            "--kv-disk-bytes", disk, "--kv-disk-dir", str(disk_dir),
            # the tiny model prefills faster than a disk restore pays for: these tests want every tier hit
            "--reuse-restore-floor-ram", "1", "--reuse-restore-floor-disk", "1"]


def test_churn_hits_each_tier_with_the_cold_output(start_daemon, tiny_llama_dir, cold, tmp_path):
    d = start_daemon(tiered_args(tiny_llama_dir, tmp_path / "kv"))
    c = d.conn()
    first = chat(c, "t1", convo(1))

    def turn2(tier: str) -> list[dict]:
        """Turn 2, with a last message of its own per tier: the checkpoint one tier's turn 2 leaves (an
        attention-only model keeps every opener) cannot serve the next tier's."""
        msgs = convo(1, turns=2)
        return msgs[:-1] + [{"role": "user", "content": msgs[-1]["content"] + f" ({tier} tier)"}]
    want = {t: chat(cold.conn(), f"cold-{t}", turn2(t)) for t in ("device", "ram", "disk")}
    d.wait_idle()
    ck = checkpoint_tokens(d)                         # turn 1's checkpoint at its generation opener
    assert 0 < ck < first["usage"]["prompt_tokens"] and where(d, ck) == "device"
    seen = {}
    salt = 100
    for tier in ("device", "ram", "disk"):
        salt = push(c, d, ck, tier, salt)
        r = chat(c, f"t2-{tier}", turn2(tier))
        reuse = r["ignis"]["reuse"]
        seen[tier] = (reuse["tier"], reuse["kind"], r["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert r["text"] == want[tier]["text"], tier
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == reuse["cached_tokens"]
        d.wait_idle()
    assert seen == {t: (t, "checkpoint", ck) for t in ("device", "ram", "disk")}
    t = tiers_of(d)
    assert t["ram"]["bytes_total"] == 12 * page_bytes(tiny_llama_dir) and t["disk"]["states"] >= 1
    assert "integrity_failed" not in d.log() and "Traceback" not in d.log()


def test_restart_hits_kv_disk_and_a_corrupt_file_is_never_used(tiny_llama_dir, cold, tmp_path):
    kv = tmp_path / "kv"
    args = tiered_args(tiny_llama_dir, kv)
    base = Path(tempfile.mkdtemp(prefix="ignis-tier-", dir="/tmp"))
    for sub in "abc":
        (base / sub).mkdir()
    d = DaemonProc(args, base / "a")
    try:
        c = d.conn()
        chat(c, "t1", convo(7))
        d.wait_idle()
        ck = checkpoint_tokens(d)
        chat(c, "other", convo(8))
        d.wait_idle()
    finally:
        assert d.stop() == 0                       # SIGTERM: the retained states are written to KV-disk
    files = sorted(kv.glob("*.ignkv"))
    assert len(files) >= 2, d.log()
    turn2 = convo(7, turns=2)
    want = chat(cold.conn(), "cold", turn2)
    d = DaemonProc(args, base / "b")
    try:
        r = chat(d.conn(), "t2", turn2)
        assert r["ignis"]["reuse"]["tier"] == "disk" and r["text"] == want["text"]
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == ck
    finally:
        d.proc.send_signal(signal.SIGKILL)        # kill -9: nothing flushed, nothing half-written is ever used
        d.proc.wait(30)
    corrupted = sorted(kv.glob("*.ignkv"))
    for f in corrupted:                           # corrupt every file's last byte
        data = bytearray(f.read_bytes())
        data[-1] ^= 0xFF
        f.write_bytes(bytes(data))
    (kv / ".lock").unlink(missing_ok=True)
    d = DaemonProc(args, base / "c")
    try:
        r = chat(d.conn(), "t2", turn2)
        assert r["ignis"]["reuse"]["tier"] in (None, "device") and r["text"] == want["text"]
        assert "kv_disk_index" in d.log() and "corrupt=" in d.log()
        assert not [f for f in kv.glob("*.ignkv") if f in files]     # the corrupt files were deleted
        metrics = d.conn().request({"id": "m", "op": "metrics"})["result"]["text"]
        assert f"ignis_tier_disk_errors_total {float(len(corrupted))}" in metrics     # and counted as faults
        assert "kv_disk_io=direct" in d.log() or "kv_disk_io=buffered" in d.log()
        d.wait_idle()
        assert "integrity_failed" not in d.log() and "Traceback" not in d.log()
    finally:
        assert d.stop() == 0


def test_a_full_or_failing_kv_disk_keeps_serving(start_daemon, tiny_llama_dir, cold, tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                             capture_output=True).returncode == 0
    try:
        kv = mnt if mounted else tmp_path / "ro"
        kv.mkdir(exist_ok=True)
        d = start_daemon(tiered_args(tiny_llama_dir, kv, arena_pages=6, disk="8M"))
        c = d.conn()
        if not mounted:                          # fallback: the directory disappears under the daemon
            for f in kv.iterdir():
                if f.name != ".lock":
                    f.unlink()
            os.chmod(kv, 0o500)
        want = chat(cold.conn(), "cold", convo(3, turns=2))
        for salt in range(20, 32):
            chat(c, f"fill{salt}", convo(salt), max_tokens=2)
        r = chat(c, "after", convo(3, turns=2))
        assert r["text"] == want["text"]
        st = d.wait_idle()
        assert st["kv_pool"]["pages_live"] == 0
        assert "integrity_failed" not in d.log() and "Traceback" not in d.log()
        metrics = d.metrics(until="ignis_tier_disk_errors_total" if mounted else None)   # writes land late
        errors = [ln for ln in metrics.splitlines() if ln.startswith("ignis_tier_disk_errors_total")]
        if mounted:
            assert errors and float(errors[0].split()[-1]) >= 1, "a 256 KiB tmpfs must fill up"
            assert "kv_disk_error" in d.log()
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.mark.parametrize("arena, disk", [("8M", None), ("0", None), ("pages:2", "64M"), ("pages:2", "tmpfs")])
def test_live_eviction_resumes_bit_exact_and_streams_every_token_once(start_daemon, tiny_llama_dir, cold, arena,
                                                                       disk, tmp_path):
    """Two lanes full of agent work; an interactive request forces an eviction. The evicted agent's final text is an
    uninterrupted run's, and its streamed deltas concatenate to exactly that text (moved to KV-RAM and restored; with
    no KV-RAM recomputed; with an arena of two pages, too small for it, and KV-disk on, moved to a KV-disk file and
    restored from it, never recomputed; and with KV-disk on a 64 KiB tmpfs, too small for the file, one failed write
    counted and then either recomputed, or restored from its bytes still in memory when its re-admission came first)."""
    if arena.startswith("pages:"):
        arena = str(int(arena[6:]) * page_bytes(tiny_llama_dir))
    kv, full = tmp_path / "kv", disk == "tmpfs"
    if full:
        kv.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(kv)],
                          capture_output=True).returncode:
            pytest.skip("cannot mount a tmpfs here")
    try:
        extra = ["--kv-disk-bytes", "64M" if full else disk, "--kv-disk-dir", str(kv)] if disk else []
        d = start_daemon(["--model", str(tiny_llama_dir), "--lanes", "2", "--vram-kv-pool-bytes", "4Ktok",
                          "--model-context-tokens", "1024", "--reuse-kv-host-pool-bytes", arena,
                          "--reuse-evict-window-pages", "2", *extra])
        agents = {f"a{k}": convo(40 + k) for k in range(2)}
        want = {rid: chat(cold.conn(), rid, m, max_tokens=120)["text"] for rid, m in agents.items()}
        r, out = agents_then_interactive(d, agents, convo(60), max_tokens=120)
        assert r["type"] == "done" and r["finish_reason"] in ("length", "stop"), r
        for rid in agents:
            text, _, done = out[rid]
            assert done["text"] == want[rid], rid
            assert text == done["text"], rid
        assert d.wait_idle()["kv_pool"]["pages_live"] == 0
        how = "moved" if arena != "0" else "recomputed"

        def count(name):
            return metric(metrics, name)
        # a KV-disk write may land after its sequence ended
        metrics = d.metrics(until="ignis_tier_disk_errors_total" if full else None)
        assert count(f'ignis_live_evictions_total{{how="{how}"}}') >= 1, metrics
        log = d.log()
        if disk:
            assert live_files(kv) == [], "a live file outlived its sequence"
        if full:                                 # the write failed: one warning, counted; then either
            assert count("ignis_tier_disk_errors_total") >= 1 and "kv_disk_error" in log, metrics
            assert count("ignis_tier_disk_reads_total") == 0, metrics    # nothing was ever read back
            # recomputed (the failure landed before its re-admission) or restored from its bytes still in memory
            # (the interactive request finished while the write was in flight): exactly one of the two
            assert count('ignis_live_evictions_total{how="recomputed"}') + \
                count('ignis_tier_restores_total{tier="disk"}') == 1, metrics
        elif disk:
            assert count('ignis_live_evictions_total{how="recomputed"}') == 0, metrics
            assert count("ignis_tier_disk_errors_total") == 0, metrics
            assert count('ignis_tier_restores_total{tier="disk"}') >= 1, metrics    # restored from its KV-disk bytes
        assert "integrity_failed" not in log and "round_failed" not in log and "Traceback" not in log
    finally:
        if full:
            subprocess.run(["umount", "-l", str(kv)], capture_output=True)


@pytest.mark.parametrize("disk", ["64M", "tmpfs"])
def test_live_eviction_on_a_slow_disk_resumes_from_the_bytes_in_memory(tiny_llama_dir, cold, disk, tmp_path):
    """Every KV-disk write waits 3 s first (tests/seams): the evicted agent is admitted again while its file is
    still being written, so it resumes from its bytes still in memory, never recomputed, with the uninterrupted text;
    status shows the write in flight; the file written after its sequence resumed is deleted, and on a 64 KiB tmpfs
    the late failure is counted and changes nothing."""
    arena, kv = str(2 * page_bytes(tiny_llama_dir)), tmp_path / "kv"
    full = disk == "tmpfs"
    kv.mkdir()
    if full and subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(kv)],
                               capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    slow = {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "seams"), "IGNIS_TEST_WRITE_DELAY_S": "3"}
    d = DaemonProc(["--model", str(tiny_llama_dir), "--lanes", "2", "--vram-kv-pool-bytes", "4Ktok",
                    "--model-context-tokens", "1024", "--reuse-kv-host-pool-bytes", arena,
                    "--reuse-evict-window-pages", "2", "--kv-disk-bytes", "64M", "--kv-disk-dir", str(kv)],
                   Path(tempfile.mkdtemp(prefix="ignis-slow-", dir="/tmp")), env=slow)
    try:
        agents = {f"a{k}": convo(40 + k) for k in range(2)}
        want = {rid: chat(cold.conn(), rid, m, max_tokens=120)["text"] for rid, m in agents.items()}
        r, out = agents_then_interactive(d, agents, convo(60), max_tokens=120)
        assert r["type"] == "done"
        assert {t["tier"]: t for t in d.status()["tiers"]}["disk"]["in_flight"] >= 1     # the 3 s write
        for rid in agents:
            text, _, done = out[rid]
            assert done["text"] == want[rid] and text == done["text"], rid
        d.wait_idle()
        d.wait_disk_settled()
        metrics = d.metrics()

        def count(name):
            return metric(metrics, name)
        assert count('ignis_live_evictions_total{how="moved"}') == 1, metrics
        assert count('ignis_live_evictions_total{how="recomputed"}') == 0, metrics
        assert count('ignis_tier_restores_total{tier="disk"}') == 1, metrics       # from the bytes in memory
        assert count("ignis_tier_disk_reads_total") == 0, metrics
        assert count("ignis_tier_disk_errors_total") == (1 if full else 0), metrics
        assert live_files(kv) == [], "the late file outlived its sequence"
        log = d.log()
        assert "integrity_failed" not in log and "round_failed" not in log and "Traceback" not in log
    finally:
        d.stop()
        if full:
            subprocess.run(["umount", "-l", str(kv)], capture_output=True)
