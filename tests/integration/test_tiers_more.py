"""More tiers over the socket (DESIGN §4.5, issue 9): the tiny Qwen3.5 hybrid (GDN state images travel with the
pages) hit from the device, KV-RAM and KV-disk after churn, then 20 fresh conversations in a row each hit from
KV-RAM and from KV-disk; the same prompt from 1, 4 and 16 concurrent clients with its checkpoint in KV-RAM; and
SmolLM2 once.

Expected output comes from daemons the tiers never touch: "cold" runs with ``--reuse-prompt off`` (greedy text
must match), and "ref" keeps everything on the device with a large pool (the same resume point, so the restored
run's logprobs must match it *exactly*: a restore that changed one bit of a page or an image would show there).
A fork's follow-up is shorter than a page, so it captures no checkpoint of its own (too close to the resume
point) and the conversation's checkpoint stays the one to hit."""
from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from daemon_support import DaemonProc, agents_then_interactive, live_files

WORDS = ("river bridge market garden harbour tower museum street square palace canal station library theatre "
         "castle forest meadow valley mountain island").split()


def words(n: int, salt: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n))


def convo(salt: int, n: int = 60) -> list[dict]:
    """Turn 1 of conversation `salt`: a system block and a user message of `n` words. The conversations under test
    use n = 130 + 3 × (their number), so each one's checkpoint has a length of its own, longer than any of the
    traffic's (n = 60): ``status.retained`` rows carry no id, the length names the checkpoint."""
    return [{"role": "system", "content": f"System {salt}. You answer about " + words(80, salt)},
            {"role": "user", "content": f"Question {salt}: tell me about " + words(n, salt + 1)}]


def fork(salt: int, n: int, k: int) -> list[dict]:
    """Turn 2 of conversation (`salt`, `n`), variant `k` (a short follow-up: it resumes at turn 1's checkpoint)."""
    return convo(salt, n) + [{"role": "assistant", "content": "Answer " + words(12, salt)},
                             {"role": "user", "content": f"Follow-up {k}: " + words(20, salt + k)}]


def chat(c, rid, msgs, max_tokens=6, **kw) -> dict:
    r = c.request({"id": rid, "op": "chat", "messages": msgs, "temperature": 0, "max_tokens": max_tokens, **kw})
    assert r["type"] == "done", r
    return r


def exact(c, rid, msgs) -> dict:
    """A greedy request with its generated tokens' logprobs (the exactness probe)."""
    return chat(c, rid, msgs, logprobs=True, top_logprobs=3)


def cached(r) -> int:
    return r["usage"]["prompt_tokens_details"]["cached_tokens"]


def checkpoints(d) -> dict[int, str]:
    """tokens -> tier of every retained checkpoint."""
    return {r["tokens"]: r["tier"] for r in d.status()["retained"] if r["kind"] == "checkpoint"}


class Pusher:
    """Other traffic (fresh conversations) until a checkpoint sits in a tier."""

    def __init__(self, d, salt0: int):
        self.d, self.c, self.salt = d, d.conn(), salt0

    def until(self, tokens: int, tier: str, limit: int = 40) -> int:
        for n in range(limit):
            got = checkpoints(self.d).get(tokens)
            if got == tier:
                if tier == "disk":               # its file written: a hit then reads it back
                    self.d.wait_disk_settled()
                return n
            assert got is not None, f"the checkpoint of {tokens} tokens was dropped on its way to {tier}"
            chat(self.c, f"push{self.salt}", convo(self.salt), max_tokens=2)
            self.salt += 1
            self.d.wait_idle()
        raise AssertionError(f"the checkpoint never reached {tier}: {self.d.status()['retained']}")


def clean_log(d) -> None:
    """No failed integrity check (logged as integrity_failed when the daemon goes idle), round or traceback."""
    log = d.log()
    bad = ("integrity_failed", "IntegrityError", "Traceback", "round_failed", "kv_disk_error")
    assert not [w for w in bad if w in log], log[-4000:]


def done_line(d, rid: str) -> str:
    """The `done` log line of request `rid` (the server prefixes ids with the connection: match the suffix)."""
    lines = [ln for ln in d.log().splitlines() if " done " in ln and ln.split("id=", 1)[-1].split()[0].endswith(rid)]
    assert lines, rid
    return lines[-1]


def metric_values(c) -> dict[str, float]:
    text = c.request({"id": "m", "op": "metrics"})["result"]["text"]
    return {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
            if ln and not ln.startswith("#")}


def start(args, name: str) -> DaemonProc:
    return DaemonProc(args, Path(tempfile.mkdtemp(prefix=f"ignis-{name}-", dir="/tmp")))


# ------------------------------------------------------------------ the hybrid

BASE = ["--lanes", "1", "--model-context-tokens", "512"]


@pytest.fixture(scope="module")
def hybrid(tiny_qwen35_real_dir, tmp_path_factory):
    """(tiered, cold, ref) daemons on the tiny hybrid (hybrid_daemons)."""
    yield from hybrid_daemons(tiny_qwen35_real_dir, tmp_path_factory.mktemp("kv_hybrid"))


def hybrid_daemons(model_dir, kv, extra=(), images_in_arena=0, host_slots=32):
    """(tiered, cold, ref) daemons on the model at model_dir, each with `extra` args (e.g. a KV format), KV-disk in
    kv. tiered: 16 device pages, a 12-page arena, 64 MB of KV-disk, floors 1, enough retained host slots that slots
    never push a state past KV-RAM. ref: everything stays on the device (a large pool, and retained slots for every
    state: each request retains a prefix and a checkpoint). images_in_arena: state images the arena holds besides
    its pages (hq-e8-2b's image carries the exact window, large next to its pages). A generator: stops the daemons
    when closed."""
    m = ["--model", str(model_dir), *extra]
    procs = []
    try:
        cold = start(m + BASE + ["--vram-kv-pool-bytes", "2Ktok", "--reuse-prompt", "off"], "cold")
        procs.append(cold)
        ref = start(m + BASE + ["--vram-kv-pool-bytes", "16Ktok", "--reuse-host-slots-per-lane", "128"], "ref")
        procs.append(ref)
        page = ref.status()["tiers"][0]["bytes_total"] // ref.status()["kv_pool"]["pages_total"]
        arena = 12 * page + images_in_arena * ref.status()["model"]["state_bytes"]
        tiered = start(m + BASE + ["--vram-kv-pool-bytes", "1Ktok", "--reuse-kv-host-pool-bytes", str(arena),
                                   "--reuse-host-slots-per-lane", str(host_slots), "--kv-disk-bytes", "64M",
                                   "--kv-disk-dir", str(kv), "--reuse-restore-floor-ram", "1",
                                   "--reuse-restore-floor-disk", "1"], "tiered")
        procs.append(tiered)
        yield tiered, cold, ref
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(kv, ignore_errors=True)


def hit_and_compare(d, cold, ref, salt, n, k, tier, ck):
    r = exact(d.conn(), f"f{salt}-{k}", fork(salt, n, k))
    want = chat(cold.conn(), f"c{salt}-{k}", fork(salt, n, k))
    base = exact(ref.conn(), f"r{salt}-{k}", fork(salt, n, k))
    reuse = r["ignis"]["reuse"]
    assert (reuse["tier"], reuse["kind"], reuse["cached_tokens"], cached(r)) == (tier, "checkpoint", ck, ck), reuse
    assert cached(base) == ck and base["ignis"]["reuse"]["tier"] == "device"
    assert r["text"] == want["text"], (tier, salt, k)
    assert r["logprobs"] == base["logprobs"], (tier, salt, k)      # bit-exact pages and image: same floats
    assert f"tier={tier} " in done_line(d, f"f{salt}-{k}")          # the done log line names the tier
    d.wait_idle()
    return r


def turn1(d, ref, salt, n) -> int:
    """Run turn 1 of conversation (`salt`, `n`) on `d` (and `ref`, when given); the length of its checkpoint."""
    before = set(checkpoints(d))
    chat(d.conn(), f"t{salt}", convo(salt, n))
    d.wait_idle()
    if ref is not None:
        chat(ref.conn(), f"t{salt}", convo(salt, n))
        ref.wait_idle()
    after = checkpoints(d)
    new = sorted(set(after) - before)     # the opener checkpoint and, attention-only, the whole sequence (longer)
    assert len(new) in (1, 2), new
    ck = new[0]
    assert after[ck] == "device"
    return ck


def test_hybrid_churn_device_ram_disk(hybrid):
    d, cold, ref = hybrid
    ck = turn1(d, ref, 1, 125)
    push = Pusher(d, 100)
    for k, tier in enumerate(("device", "ram", "disk")):
        push.until(ck, tier)
        hit_and_compare(d, cold, ref, 1, 125, k, tier, ck)
    rows = {t["tier"]: t for t in d.status()["tiers"]}
    assert rows["ram"]["states"] >= 1 and rows["disk"]["states"] >= 1
    assert rows["disk"]["bytes_used"] > 0 and rows["ram"]["bytes_used"] > 0
    clean_log(d)


def test_hybrid_twenty_in_a_row_from_ram_and_disk(hybrid):
    d, cold, ref = hybrid
    push = Pusher(d, 5000)
    ok = {"ram": 0, "disk": 0}
    for i in range(20):
        salt, n = 200 + i, 130 + 3 * i
        ck = turn1(d, ref, salt, n)
        for k, tier in enumerate(("ram", "disk")):
            push.until(ck, tier)
            hit_and_compare(d, cold, ref, salt, n, k, tier, ck)
            ok[tier] += 1
    assert ok == {"ram": 20, "disk": 20}
    metrics = metric_values(d.conn())
    assert metrics.get('ignis_reuse_hits_total{kind="checkpoint",tier="ram"}', 0) >= 20
    assert metrics.get('ignis_reuse_hits_total{kind="checkpoint",tier="disk"}', 0) >= 20
    assert metrics.get('ignis_tier_restore_bytes_total{tier="ram"}', 0) > 0
    assert metrics.get('ignis_tier_restore_bytes_total{tier="disk"}', 0) > 0
    assert metrics.get("ignis_tier_disk_reads_total", 0) >= 1
    assert metrics.get("ignis_tier_disk_errors_total", 0) == 0
    clean_log(d)


def test_hybrid_restore_counters_count_each_restore(hybrid):
    d, _, ref = hybrid
    c = d.conn()
    before = metric_values(c)
    ck = turn1(d, None, 31, 160)
    Pusher(d, 3100).until(ck, "ram")
    r = chat(c, "cnt", fork(31, 160, 0))
    assert r["ignis"]["reuse"]["tier"] == "ram"
    d.wait_idle()
    after = metric_values(c)
    key = 'ignis_tier_restores_total{tier="ram"}'
    assert after.get(key, 0) - before.get(key, 0) == 1, {k: v for k, v in after.items() if "restore" in k}


def test_hybrid_restart_restores_images_from_kv_disk(tiny_qwen35_real_dir, hybrid, tmp_path):
    """Hybrid states (GDN images with their pages) flushed at SIGTERM are indexed again by the next daemon and hit
    from KV-disk with the reference's exact logprobs."""
    _, cold, ref = hybrid
    page = ref.status()["tiers"][0]["bytes_total"] // ref.status()["kv_pool"]["pages_total"]
    args = ["--model", str(tiny_qwen35_real_dir), *BASE, "--vram-kv-pool-bytes", "1Ktok",
            "--reuse-kv-host-pool-bytes", str(12 * page), "--reuse-host-slots-per-lane", "32",
            "--kv-disk-bytes", "64M", "--kv-disk-dir", str(tmp_path / "kv"),
            "--reuse-restore-floor-ram", "1", "--reuse-restore-floor-disk", "1"]
    d = start(args, "restart-a")
    try:
        ck = turn1(d, ref, 41, 170)
        ck2 = turn1(d, ref, 42, 175)
        Pusher(d, 4100).until(ck, "ram")                     # one in KV-RAM, one maybe still on the device
    finally:
        assert d.stop() == 0
    assert len(list((tmp_path / "kv").glob("*.ignkv"))) >= 2, d.log_path.read_text()
    d = start(args, "restart-b")
    try:
        assert {checkpoints(d).get(ck), checkpoints(d).get(ck2)} == {"disk"}
        for salt, n, want_ck in ((41, 170, ck), (42, 175, ck2)):
            hit_and_compare(d, cold, ref, salt, n, 5, "disk", want_ck)
        clean_log(d)
    finally:
        assert d.stop() == 0


def test_hybrid_concurrent_clients_restoring_from_ram(tiny_qwen35_real_dir, hybrid, tmp_path):
    _, cold, ref = hybrid
    m = ["--model", str(tiny_qwen35_real_dir)]
    page = ref.status()["tiers"][0]["bytes_total"] // ref.status()["kv_pool"]["pages_total"]
    d = start(m + ["--lanes", "4", "--model-context-tokens", "512", "--vram-kv-pool-bytes", "2Ktok",
                   "--reuse-kv-host-pool-bytes", str(24 * page), "--reuse-host-slots-per-lane", "16",
                   "--kv-disk-bytes", "64M", "--kv-disk-dir", str(tmp_path / "kv"),
                   "--reuse-restore-floor-ram", "1", "--reuse-restore-floor-disk", "1", "--server-max-queue", "64"],
              "conc")
    try:
        ck = turn1(d, None, 77, 140)
        Pusher(d, 7000).until(ck, "ram")
        want = chat(cold.conn(), "cold", fork(77, 140, 0))["text"]
        for n in (1, 4, 16):
            assert checkpoints(d).get(ck) == "ram"
            out: list = [None] * n
            go = threading.Barrier(n)

            def client(i, n=n, out=out, go=go):
                c = d.conn()
                try:
                    go.wait(30)
                    out[i] = chat(c, f"cc{n}-{i}", fork(77, 140, 0))
                except Exception as e:   # noqa: BLE001 — reported below
                    out[i] = e
                finally:
                    c.close()

            ts = [threading.Thread(target=client, args=(i,)) for i in range(n)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(120)
            errors = [o for o in out if not isinstance(o, dict)]
            assert not errors, errors
            texts = [o["text"] for o in out]
            tiers = [o["ignis"]["reuse"]["tier"] for o in out]
            assert texts == [want] * n, (n, tiers, texts)
            assert all(cached(o) == ck for o in out), [cached(o) for o in out]
            assert set(tiers) == {"ram"}, tiers
            d.wait_idle()
        clean_log(d)
    finally:
        d.stop()


def test_hybrid_live_eviction_to_kv_disk_streams_the_uninterrupted_text(tiny_qwen35_real_dir, hybrid, tmp_path):
    """Two lanes of streaming agent work; an interactive request evicts the later agent; a two-page arena cannot hold
    its pages and GDN image, so they go to a KV-disk file and come back: its final text is the cold run's, its
    streamed deltas concatenate to exactly that text, and nothing was recomputed or left on disk."""
    _, cold, ref = hybrid
    page = ref.status()["tiers"][0]["bytes_total"] // ref.status()["kv_pool"]["pages_total"]
    d = start(["--model", str(tiny_qwen35_real_dir), "--lanes", "2", "--model-context-tokens", "512",
               "--vram-kv-pool-bytes", "2Ktok", "--reuse-kv-host-pool-bytes", str(2 * page),
               "--kv-disk-bytes", "64M", "--kv-disk-dir", str(tmp_path / "kv"), "--reuse-evict-window-pages", "2"],
              "live")
    try:
        agents = {f"a{k}": convo(900 + k) for k in range(2)}
        want = {rid: chat(cold.conn(), rid, m, max_tokens=80)["text"] for rid, m in agents.items()}
        r, out = agents_then_interactive(d, agents, convo(950), max_tokens=80, min_generated=8)
        assert r["type"] == "done" and r["finish_reason"] in ("length", "stop"), r
        for rid in agents:
            text, reasoning, done = out[rid]      # the random model's text streams as reasoning (no </think>)
            assert done["text"] == want[rid], rid
            msg = done["message"]
            assert (text, reasoning) == (msg["content"], msg["reasoning_content"] or ""), rid
            assert len(text + reasoning) > 40, rid
        d.wait_idle()
        m = metric_values(d.conn())
        assert m.get('ignis_live_evictions_total{how="moved"}', 0) >= 1, m
        assert m.get('ignis_live_evictions_total{how="recomputed"}', 0) == 0
        assert m.get('ignis_tier_restores_total{tier="disk"}', 0) >= 1
        assert live_files(tmp_path / "kv") == [], "a live file outlived its sequence"
        clean_log(d)
    finally:
        d.stop()


# ------------------------------------------------------------------ SmolLM2 once


# hq-e8-2b: each image carries the exact window (8.9 MB on SmolLM2) and its few encoded pages leave the device by
# slot pressure: enough arena for the images that reach KV-RAM with their pages
@pytest.mark.parametrize("fmt", [["--reuse-kv-host-pool-bytes", "64M"],
                                 ["--reuse-kv-host-pool-bytes", "256M", "--reuse-host-slots-per-lane", "48",
                                  "--model-kv-format", "hq-e8-2b"]],
                         ids=["default", "hq-e8-2b"])
def test_smollm2_ram_hit_equals_cold(tmp_path, fmt):
    # fp32 weights: the exact reference. Under the native int4 kernels (bf16 activations) a resumed prefill, whose
    # chunks start at the checkpoint, may round differently from the cold one and part from it at a near-tie.
    d = start(["--model-weight-format", "fp32", "--lanes", "1", "--vram-kv-pool-bytes", "2Ktok",
               "--model-context-tokens", "1024", "--kv-disk-bytes", "off", "--reuse-restore-floor-ram", "1", *fmt],
              "smol")
    try:
        c = d.conn()
        want = chat(c, "cold", fork(1, 130, 0), max_tokens=8, cache_prompt=False)   # as --reuse-prompt off
        assert cached(want) == 0 and not d.wait_idle()["retained"]
        ck = turn1(d, None, 1, 130)
        Pusher(d, 300).until(ck, "ram")
        r = chat(c, "hit", fork(1, 130, 0), max_tokens=8)
        reuse = r["ignis"]["reuse"]
        assert (reuse["tier"], cached(r)) == ("ram", ck), reuse
        assert r["text"] == want["text"]
        d.wait_idle()
        clean_log(d)
    finally:
        d.stop()
