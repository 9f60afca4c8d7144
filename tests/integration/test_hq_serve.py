"""The daemon serving hq-e8-2b KV (DESIGN §4.6): the built-in SmolLM2 answers with Paris, status / metrics / the
vram_plan line report the format's true page size and why it was chosen, and prompt reuse works with the exact
window travelling in the state image — turn 2 resumes at turn 1's checkpoint and a burst resumes from the retained
prefix, on SmolLM2 (all attention) and on the tiny Qwen3.5 hybrid (image = GDN state + window), each resumed greedy
reply equal to the same daemon's cold run with reuse off; the tiers' churn (a checkpoint hit from the device,
KV-RAM and KV-disk) on the tiny llama and on the tiny hybrid, the hybrid's against a device-only daemon's logprobs
bit for bit (test_tiers_more's machinery); SmolLM2's KV-RAM hit in hq-e8-2b is test_tiers_more's parametrized one."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from test_reuse import burst, cached, chat, cuts, fresh, long_user, settle, words

HQ = ["--model-kv-format", "hq-e8-2b"]


@pytest.fixture(scope="module")
def smollm_hq(start_module_daemon):
    return start_module_daemon(["--lanes", "4", "--vram-kv-pool-bytes", "16Ktok", *HQ])


@pytest.fixture(scope="module")
def smollm_hq_off(start_module_daemon):
    return start_module_daemon(["--lanes", "2", "--vram-kv-pool-bytes", "8Ktok", "--reuse-prompt", "off",
                               *HQ])


@pytest.fixture(scope="module")
def qwen_hq(start_module_daemon, tiny_qwen35_real_dir):
    return start_module_daemon(["--model", str(tiny_qwen35_real_dir), "--lanes", "4",
                               "--vram-kv-pool-bytes", "8Ktok", "--model-context-tokens", "2048", *HQ])


@pytest.fixture(scope="module")
def qwen_hq_off(start_module_daemon, tiny_qwen35_real_dir):
    return start_module_daemon(["--model", str(tiny_qwen35_real_dir), "--lanes", "2",
                               "--vram-kv-pool-bytes", "4Ktok", "--model-context-tokens", "2048",
                               "--reuse-prompt", "off", *HQ])


@pytest.mark.smollm
def test_smollm_hq_answers_paris_and_reports_the_format(smollm_hq):
    env = dict(os.environ, IGNIS_SOCKET=smollm_hq.socket)
    r = subprocess.run([sys.executable, "-m", "ignis_client.cli", "chat",
                        "What is the capital of France? Answer in one sentence."],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout
    st = settle(smollm_hq)
    assert st["model"]["kv_format"] == "hq-e8-2b" and st["model"]["page_bytes"] == 64 * 4320
    # the exact window and sink in each live slot, and the centre (μ_K, μ_V; keys centred by default):
    # 30 layers × 2 × (192 + 1 + 1) × 3 heads × 64 × 4 B
    assert st["model"]["state_bytes"] == 30 * 2 * (193 + 1) * 3 * 64 * 4
    c = smollm_hq.conn()
    metrics = c.request({"id": "m", "op": "metrics"})["result"]["text"]
    c.close()
    assert f"ignis_kv_page_bytes {float(64 * 4320)}" in metrics
    plan = next(line for line in smollm_hq.log().splitlines() if "vram_plan" in line)
    assert "kv_format=hq-e8-2b" in plan and "kv_format_why=model.kv_format" in plan and "page_bytes=276480" in plan
    assert "kv_pool_pages=256" in plan and "kv_pool_tokens=16384" in plan
    assert 'kv_decode_kernel="cpu (fused C kernel)"' in plan, plan
    assert 'kv_encode_kernel="cpu (C nearest-codeword kernel)"' in plan, plan
    assert 'kv_window_kernel="cpu (C decode-row kernel)"' in plan, plan
    assert 'decode_step="cpu (fused C layers, 1 to 8 lanes)"' in plan, plan    # the window written in the step


def _turns(c, daemon, off, system_words):
    t1 = [{"role": "system", "content": "You are a travel guide. " + words(system_words)}, long_user(1)]
    k1 = cuts(c, t1)["cut_points"]
    r1 = chat(c, "t1", t1, max_tokens=12)
    t2 = t1 + [{"role": "assistant", "content": r1["text"]}, {"role": "user", "content": "And the bridges?"}]
    r2 = chat(c, "t2", t2, max_tokens=12)
    assert (r2["ignis"]["reuse"]["kind"], cached(r2)) == ("checkpoint", k1["opener"])
    co = off.conn()
    cold = chat(co, "c2", t2, max_tokens=12)
    co.close()
    assert cached(cold) == 0 and cold["text"] == r2["text"]
    return k1


@pytest.mark.smollm
def test_smollm_hq_turn2_resumes_and_equals_cold(smollm_hq, smollm_hq_off):
    c = fresh(smollm_hq)
    k1 = _turns(c, smollm_hq, smollm_hq_off, 200)
    assert k1["opener"] > 4 * 64           # pages left the window before the checkpoint: shared encoded pages
    c.close()
    settle(smollm_hq)


@pytest.mark.smollm
def test_smollm_hq_burst_resumes_from_the_prefix_and_equals_cold(smollm_hq, smollm_hq_off):
    c = fresh(smollm_hq)
    sysm = {"role": "system", "content": "You are a subagent of a code review. " + words(260)}
    publish = cuts(c, [sysm, {"role": "user", "content": "x"}])["cut_points"]["publish"]
    assert publish >= 4 * 64
    bodies = [[sysm, {"role": "user", "content": "warm up"}]] + [
        [sysm, {"role": "user", "content": f"Job {i} " + words(n, i)}] for i, n in enumerate((1, 70, 150))]
    got = burst(c, bodies)
    co = smollm_hq_off.conn()
    for i, r in enumerate(got):
        assert (r["ignis"]["reuse"]["kind"], cached(r)) == ((None, 0) if i == 0 else ("prefix", publish)), i
        cold = co.request({"id": f"c{i}", "op": "chat", "messages": bodies[i], "temperature": 0, "max_tokens": 4})
        assert cold["text"] == r["text"], i
    co.close()
    c.close()
    settle(smollm_hq)


def test_hybrid_hq_turn2_and_burst(qwen_hq, qwen_hq_off):
    c = fresh(qwen_hq)
    _turns(c, qwen_hq, qwen_hq_off, 150)
    sysm = {"role": "system", "content": "You are a subagent. " + words(220)}
    publish = cuts(c, [sysm, {"role": "user", "content": "x"}])["cut_points"]["publish"]
    assert publish >= 3 * 64
    bodies = [[sysm, {"role": "user", "content": "warm up"}]] + [
        [sysm, {"role": "user", "content": f"Job {i} " + words(n, i + 3)}] for i, n in enumerate((1, 65, 300))]
    got = burst(c, bodies)
    co = qwen_hq_off.conn()
    for i, r in enumerate(got):
        assert (r["ignis"]["reuse"]["kind"], cached(r)) == ((None, 0) if i == 0 else ("prefix", publish)), i
        cold = co.request({"id": f"c{i}", "op": "chat", "messages": bodies[i], "temperature": 0, "max_tokens": 4})
        assert cold["text"] == r["text"], i
    co.close()
    c.close()
    settle(qwen_hq)


@pytest.fixture(scope="module")
def tiny_hq_cold(start_module_daemon, tiny_llama_dir):
    return start_module_daemon(["--model", str(tiny_llama_dir), "--lanes", "1", "--vram-kv-pool-bytes",
                               "4Ktok", "--model-context-tokens", "1024", "--reuse-prompt", "off", *HQ])


def test_churn_under_hq_hits_each_tier_with_the_cold_output(start_daemon, tiny_llama_dir, tiny_hq_cold, tmp_path):
    """The tiers issue's churn test with hq-e8-2b pages: turn 1's checkpoint (its encoded pages + an image holding
    the exact window) is hit on the device, from KV-RAM and from KV-disk, each time with the cold run's output."""
    from test_tiers import tiered_args
    # hq-e8-2b gives an all-attention model an image (the window) and so image slots; enough of them that page
    # pressure moves turn 1's checkpoint down to KV-RAM with its slot (slot pressure moves a device state to KV-RAM
    # with its image in its extent, test_hybrid_churn_under_hq...; either way it passes KV-RAM)
    d = start_daemon(tiered_args(tiny_llama_dir, tmp_path / "kv") + HQ + ["--reuse-host-slots-per-lane", "48"])
    try:
        _churn(d, tiny_hq_cold)
    finally:
        d.stop()


def _churn(d, tiny_hq_cold):
    from test_tiers import chat as tchat
    from test_tiers import checkpoint_tokens, convo, push
    c = d.conn()
    first = tchat(c, "t1", convo(1))
    turn2 = convo(1, turns=2)
    want = tchat(tiny_hq_cold.conn(), "cold", turn2)
    d.wait_idle()
    ck = checkpoint_tokens(d, expect=1)           # hq-e8-2b keeps no whole-sequence checkpoint (CHANGELOG, issue 11)
    assert 3 * 64 < ck < first["usage"]["prompt_tokens"]     # some pages were encoded before the checkpoint
    seen = {}
    salt = 100
    for tier in ("device", "ram", "disk"):
        salt = push(c, d, ck, tier, salt)
        r = tchat(c, f"t2-{tier}", turn2)
        reuse = r["ignis"]["reuse"]
        seen[tier] = (reuse["tier"], reuse["kind"], r["usage"]["prompt_tokens_details"]["cached_tokens"])
        assert r["text"] == want["text"], tier
        d.wait_idle()
    assert seen == {t: (t, "checkpoint", ck) for t in ("device", "ram", "disk")}
    assert "integrity_failed" not in d.log() and "Traceback" not in d.log()


@pytest.fixture(scope="module")
def hybrid_hq(tiny_qwen35_real_dir, tmp_path_factory):
    from test_tiers_more import hybrid_daemons
    yield from hybrid_daemons(tiny_qwen35_real_dir, tmp_path_factory.mktemp("kv_hybrid_hq"), HQ, images_in_arena=8,
                              host_slots=48)


def test_hybrid_churn_under_hq_hits_each_tier_bit_exact(hybrid_hq):
    """test_tiers_more's hybrid churn in hq-e8-2b: the checkpoint (encoded pages + an image of GDN state and exact
    window) hit from each tier with the cold run's text and the device-only daemon's logprobs."""
    from test_tiers_more import Pusher, clean_log, hit_and_compare, turn1
    d, cold, ref = hybrid_hq
    assert d.status()["model"]["kv_format"] == "hq-e8-2b"
    ck = turn1(d, ref, 1, 125)
    assert ck > 3 * 64                              # pages left the exact window before the checkpoint
    push = Pusher(d, 100)
    for k, tier in enumerate(("device", "ram", "disk")):
        push.until(ck, tier)
        hit_and_compare(d, cold, ref, 1, 125, k, tier, ck)
    clean_log(d)
