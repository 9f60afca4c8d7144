"""Prompt reuse over the socket (DESIGN §4.1-§4.4, §4.7, §5 ignis.reuse): turn checkpoints, retained prefixes of a
subagent burst, misses that say why and where, resumed = cold (greedy text and fp32 logprobs against daemons with
--reuse-prompt off), cache_prompt false, reset, and the pool's accounting after every test.

The tiny Llama renders SmolLM2's ChatML template (no tools); the tiny real-vocabulary Qwen3.5 hybrid renders the
Qwen3.5 template with tools and reasoning, and restores a state image beside the shared pages."""
import json
import math

import pytest

from daemon_support import RawConn

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city, with an optional number of days ahead",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}},
         {"type": "function", "function": {
             "name": "search_files", "description": "Search the workspace for files whose text matches a pattern",
             "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}},
                            "required": ["pattern"]}}}]

WORDS = ("river bridge market garden harbour tower museum street square palace canal station library theatre "
         "castle forest meadow valley mountain island").split()


def words(n: int, salt: int = 0) -> str:
    """n distinct-ish English words (a tokenizer gives about one token each)."""
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n))


def long_user(salt: int = 0, n: int = 90) -> dict:
    return {"role": "user", "content": f"Question {salt}: tell me about " + words(n, salt)}


@pytest.fixture(scope="module")
def tiny_off(start_module_daemon, tiny_llama_dir):
    return start_module_daemon(["--model", str(tiny_llama_dir), "--lanes", "4", "--vram-kv-pool-bytes", "4Ktok",
                               "--model-context-tokens", "1024", "--reuse-prompt", "off"])


@pytest.fixture(scope="module")
def qwen_off(start_module_daemon, tiny_qwen35_real_dir):
    return start_module_daemon(["--model", str(tiny_qwen35_real_dir), "--lanes", "4", "--vram-kv-pool-bytes", "4Ktok",
                               "--model-context-tokens", "2048", "--reuse-prompt", "off"])


def fresh(d) -> RawConn:
    """A connection to daemon `d` after a reset (every test starts with no retained state)."""
    c = d.conn()
    c.request({"id": "reset", "op": "reset"})
    return c


def settle(d) -> dict:
    """Wait for idle; prove the accounting: no live page, every page free or retained, slots all back."""
    st = d.wait_idle()
    kv = st["kv_pool"]
    assert kv["pages_live"] == 0
    assert kv["pages_free"] + kv["pages_retained"] == kv["pages_total"]
    assert st["live_states"]["slots_used"] == 0
    held = sum(1 for r in st["retained"] if r["image_slot"])    # KV-RAM states may carry their image in the arena
    s = st["slots"]
    if st["model"]["arch"].startswith("qwen"):
        assert s["device_total"] - s["device_free"] + s["host_total"] - s["host_free"] == held
    return st


def chat(c, rid, messages, tools=None, **kw):
    body = {"id": rid, "op": "chat", "messages": messages, "temperature": 0, "max_tokens": 6, **kw}
    if tools:
        body["tools"] = tools
    r = c.request(body)
    assert r["type"] == "done", r
    return r


def burst(c, bodies: list, tools=None, **kw) -> list[dict]:
    """Send every chat body at once; returns their final replies in order."""
    for i, m in enumerate(bodies):
        body = {"id": f"u{i}", "op": "chat", "messages": m, "temperature": 0, "max_tokens": 4, **kw}
        if tools:
            body["tools"] = tools
        c.send(body)
    finals = {}
    while len(finals) < len(bodies):
        r = c.recv()
        if r["type"] in ("done", "error"):
            finals[r["id"]] = r
    out = [finals[f"u{i}"] for i in range(len(bodies))]
    for r in out:
        assert r["type"] == "done", r
    return out


def cuts(c, messages, tools=None) -> dict:
    body = {"id": "tk", "op": "tokenize", "messages": messages}
    if tools:
        body["tools"] = tools
    return c.request(body)["result"]


def whole_or_opener(c, t1, r1, t2, tools=None, d=None) -> int:
    """Where turn 2 resumes on an attention-only model (DESIGN §4.3), from the tokenizer alone: at turn 1's whole
    sequence — its prompt tokens and the generated ids whose K/V reached the pages (all but the last; ``r1`` was
    asked with logprobs, whose entries carry the ids) — when turn 2's tokens start with it (the reply re-rendered
    to the same ids), else at turn 1's opener checkpoint. With daemon `d`: the whole sequence only while a
    checkpoint of its length is still retained (it is the first state dropped when the pool needs room)."""
    k1 = cuts(c, t1, tools)
    seq = k1["tokens"] + [e["token_id"] for e in r1["logprobs"]][:-1]
    t2_ids = cuts(c, t2, tools)["tokens"]
    kept = d is None or any(x["kind"] == "checkpoint" and x["tokens"] == len(seq) for x in d.status()["retained"])
    if kept and len(seq) < len(t2_ids) and t2_ids[:len(seq)] == seq:
        return len(seq)
    return k1["cut_points"]["opener"]


def cached(r) -> int:
    assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == r["ignis"]["reuse"]["cached_tokens"]
    return r["usage"]["prompt_tokens_details"]["cached_tokens"]


# ---------------------------------------------------------------- (a) turns resume at the previous checkpoint

def test_turn2_resumes_at_turn1_checkpoint_llama(tiny_daemon):
    c = fresh(tiny_daemon)
    t1 = [{"role": "system", "content": "You are a travel guide. " + words(70)}, long_user(1)]
    k1 = cuts(c, t1)["cut_points"]
    r1 = chat(c, "t1", t1, logprobs=True)
    assert cached(r1) == 0 and r1["ignis"]["reuse"]["reason"] == "miss"
    rows = tiny_daemon.status()["retained"]
    # an attention-only model also keeps turn 1's whole sequence: prompt + the generated tokens in its pages
    whole = r1["usage"]["prompt_tokens"] + r1["usage"]["completion_tokens"] - 1
    assert sorted((x["kind"], x["tokens"]) for x in rows) == [("checkpoint", k1["opener"]), ("checkpoint", whole),
                                                              ("prefix", k1["publish"])]
    t2 = t1 + [{"role": "assistant", "content": r1["text"]}, {"role": "user", "content": "And the bridges?"}]
    r2 = chat(c, "t2", t2)
    ru = r2["ignis"]["reuse"]
    assert (ru["tier"], ru["kind"], ru["reason"]) == ("device", "checkpoint", None)
    want = whole_or_opener(c, t1, r1, t2)
    assert cached(r2) == want
    assert r2["usage"]["prompt_tokens"] == len(cuts(c, t2)["tokens"])
    # a retry hits turn 2's own opener checkpoint, kept although it lies under a page past turn 2's resume point
    k2 = cuts(c, t2)["cut_points"]["opener"]
    assert k2 - want < 64
    r2b = chat(c, "t2b", t2)
    assert cached(r2b) == k2 and r2b["text"] == r2["text"]
    # a fork that edits turn 1's reply still resumes at turn 1's opener checkpoint
    fork = t1 + [{"role": "assistant", "content": "Edited."}, {"role": "user", "content": "And the bridges?"}]
    assert cached(chat(c, "t2f", fork)) == k1["opener"]
    c.close()
    settle(tiny_daemon)


def test_turns_resume_when_template_drops_reasoning_hybrid(qwen_daemon):
    c = fresh(qwen_daemon)
    t1 = [{"role": "system", "content": "You are a helpful agent. " + words(30)}, long_user(2)]
    k1 = cuts(c, t1, TOOLS)["cut_points"]
    assert k1["publish"] > 0 and k1["opener"] - k1["publish"] >= 64
    r1 = chat(c, "q1", t1, TOOLS)
    assert cached(r1) == 0
    # turn 2: the assistant called a tool (arguments as a JSON string: the template re-serialises them as XML)
    # after some reasoning; the tool answered
    call = {"role": "assistant", "content": "", "reasoning_content": "I should look up the weather.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}}]}
    t2 = t1 + [call, {"role": "tool", "tool_call_id": "c1", "content": "{\"temp_c\": 18}"}]
    r2 = chat(c, "q2", t2, TOOLS)
    assert r2["ignis"]["reuse"]["kind"] == "checkpoint" and cached(r2) == k1["opener"]
    # turn 3: a new user message; the template now drops turn 2's reasoning, so turn 2's checkpoint no longer
    # matches, but the one right after the last real user message (turn 1's) was kept and serves
    t3 = t2 + [{"role": "assistant", "content": "It is 18 degrees.", "reasoning_content": "Easy."},
               {"role": "user", "content": "Thanks, and tomorrow?"}]
    text3 = cuts(c, t3, TOOLS)["text"]
    assert "I should look up the weather." not in text3
    r3 = chat(c, "q3", t3, TOOLS)
    assert r3["ignis"]["reuse"]["kind"] == "checkpoint" and cached(r3) == k1["opener"]
    assert r3["usage"]["prompt_tokens"] - cached(r3) == len(cuts(c, t3, TOOLS)["tokens"]) - k1["opener"]
    c.close()
    settle(qwen_daemon)


# ---------------------------------------------------------------- (b) subagent bursts share the retained prefix

def _block_end(c, m: dict, tools=None) -> int | None:
    """The token position where the system (+ tools) block of [m, user] ends (None: no token starts there)."""
    tk = cuts(c, [m, {"role": "user", "content": "x"}], tools)
    end = tk["messages"][0]["end"]
    return next((i for i, o in enumerate(tk["offsets"]) if o[0] == end), None)


def _system_of_tokens(c, target: int, tools=None) -> tuple[dict, int]:
    """A system message whose block ends at token `target` (the publish character's token), found by search."""
    lo = target // 2 - 20 if tools is None else target - _block_end(c, {"role": "system", "content": "A"}, tools) - 25
    for n in range(max(1, lo), target + 40):
        for salt in range(3):
            m = {"role": "system", "content": f"Agent brief {salt}. " + words(n, salt)}
            pos = _block_end(c, m, tools)
            if pos == target:
                return m, pos
            if pos is not None and pos > target + 3:
                break
    raise AssertionError(f"no system block of {target} tokens")


@pytest.mark.parametrize("target", [127, 128, 129, 191, 192])
def test_burst_resumes_from_retained_prefix_llama(tiny_daemon, target):
    c = fresh(tiny_daemon)
    sysm, end = _system_of_tokens(c, target)
    publish = end - end % 64
    suffixes = [1, 30, 70, 200, 400]
    # the whole burst arrives at once: the first prefills the block, the rest wait for it and resume from it
    bodies = [[sysm, {"role": "user", "content": words(5, 99)}]] + [
        [sysm, {"role": "user", "content": f"Task {i}: " + words(n, i)}] for i, n in enumerate(suffixes)]
    for i, r in enumerate(burst(c, bodies)):
        if i == 0:
            assert cached(r) == 0
            continue
        ru = r["ignis"]["reuse"]
        assert (ru["kind"], cached(r)) == ("prefix", publish), (i, ru)
        assert r["usage"]["prompt_tokens"] > publish
    c.close()
    settle(tiny_daemon)


def test_burst_with_tools_hybrid(qwen_daemon):
    c = fresh(qwen_daemon)
    sysm = {"role": "system", "content": "You are a subagent. " + words(60)}
    publish = cuts(c, [sysm, {"role": "user", "content": "x"}], TOOLS)["cut_points"]["publish"]
    assert publish >= 128
    bodies = [[sysm, {"role": "user", "content": "warm up"}]] + [
        [sysm, {"role": "user", "content": f"Job {i} " + words(n, i + 3)}]
        for i, n in enumerate((1, 65, 300, 2, 127, 64, 700))]
    for i, r in enumerate(burst(c, bodies, TOOLS)):
        assert (r["ignis"]["reuse"]["kind"], cached(r)) == ((None, 0) if i == 0 else ("prefix", publish)), i
    c.close()
    settle(qwen_daemon)


@pytest.fixture(scope="module")
def qwen_wide(start_module_daemon, tiny_qwen35_real_dir):
    """The tiny Qwen3.5 hybrid with room for a burst of long subagent prompts: 4 lanes, context 4,096, 32K KV tokens,
    4 retained slots per lane."""
    return start_module_daemon(["--model", str(tiny_qwen35_real_dir), "--lanes", "4", "--vram-kv-pool-bytes", "32Ktok",
                               "--model-context-tokens", "4096", "--reuse-host-slots-per-lane", "4"])


@pytest.mark.parametrize("page,delta", [(1, -1), (1, 0), (1, 1), (2, -1), (2, 0), (2, 1)])
def test_burst_suffix_sweep_with_tools_hybrid(qwen_wide, page, delta):
    """A burst of 8 subagents sharing a system + tools block that ends ±1 token around a multiple of 64, with user
    messages of 1 to 1,500 tokens: every one after the first resumes from the retained prefix (the block rounded
    down to a whole page), whatever the length of its own suffix."""
    c = fresh(qwen_wide)
    least = _block_end(c, {"role": "system", "content": "A"}, TOOLS)     # the tools alone take a few pages
    target = (-(-least // 64) + page) * 64 + delta
    sysm, end = _system_of_tokens(c, target, TOOLS)
    publish = end - end % 64
    base = len(cuts(c, [sysm, {"role": "user", "content": ""}], TOOLS)["tokens"])
    users = [{"role": "user", "content": "x"}] + [
        {"role": "user", "content": words(n, i)} for i, n in enumerate((2, 63, 64, 65, 128, 700, 1500))]
    own = [len(cuts(c, [sysm, u], TOOLS)["tokens"]) - base for u in users]
    assert min(own) <= 1 and max(own) >= 1500, own
    bodies = [[sysm, {"role": "user", "content": "warm up"}]] + [[sysm, u] for u in users]
    for i, r in enumerate(burst(c, bodies, TOOLS)):
        ru = r["ignis"]["reuse"]
        if i == 0:
            assert cached(r) == 0
            continue
        assert (ru["kind"], ru["tier"], cached(r)) == ("prefix", "device", publish), (i, own[i - 1], ru)
        assert r["usage"]["prompt_tokens"] - cached(r) == len(cuts(c, bodies[i], TOOLS)["tokens"]) - publish
    c.close()
    settle(qwen_wide)


def test_block_below_one_page_gives_no_prefix(tiny_daemon):
    c = fresh(tiny_daemon)
    sysm = {"role": "system", "content": "Be brief."}
    assert cuts(c, [sysm, {"role": "user", "content": "hi"}])["cut_points"]["publish"] == 0
    chat(c, "s0", [sysm, long_user(3)])
    r = chat(c, "s1", [sysm, long_user(4)])
    assert cached(r) == 0
    assert r["ignis"]["reuse"]["reason"] == "below_page"
    # a prompt of at most one page can neither resume nor leave anything behind
    r = chat(c, "s2", [sysm, {"role": "user", "content": "hi"}])
    assert r["usage"]["prompt_tokens"] <= 64 and cached(r) == 0 and r["ignis"]["reuse"]["reason"] == "short"
    c.close()
    settle(tiny_daemon)


# ---------------------------------------------------------------- (c) misses say where they diverged

def test_changed_system_prompt_misses_and_points_at_divergence(tiny_daemon):
    c = fresh(tiny_daemon)
    a = [{"role": "system", "content": "Today is 2026-11-28. " + words(60)}, long_user(5)]
    b = [{"role": "system", "content": "Today is 2026-11-29. " + words(60)}, long_user(5)]
    chat(c, "c0", a)
    ta, tb = cuts(c, a)["tokens"], cuts(c, b)
    first = next(i for i, (x, y) in enumerate(zip(ta, tb["tokens"])) if x != y)
    r = chat(c, "c1", b)
    ru = r["ignis"]["reuse"]
    assert cached(r) == 0 and ru["reason"] == "miss" and ru["kind"] is None
    assert ru["best_candidate"]["kind"] in ("prefix", "checkpoint")
    d = ru["diverged_at"]
    assert d["token"] == first
    assert (d["message_index"], d["role"]) == (0, "system")
    assert tb["text"][d["char_offset"]] == "9" and "2026-11-28" in d["ours"] and "2026-11-29" in d["theirs"]
    # editing the user message keeps the retained prefix (the checkpoint no longer matches)
    e = [a[0], long_user(6)]
    r = chat(c, "c2", e)
    assert (r["ignis"]["reuse"]["kind"], cached(r)) == ("prefix", cuts(c, e)["cut_points"]["publish"])
    c.close()
    settle(tiny_daemon)


# ---------------------------------------------------------------- (d) resumed = cold

def _conversations(k: int, tools: bool):
    """k conversations of varied shape: (turn 1 messages, what turn 2 appends after turn 1's reply). With tools,
    every third turn 2 is the assistant's tool call (arguments a JSON string) and the tool's answer instead."""
    for i in range(k):
        j = i % 12
        sysm = {"role": "system", "content": f"Assistant {i}. " + words(40 + 13 * j, i)}
        t1 = [sysm, long_user(10 + i, 70 + 9 * j)]
        if tools and i % 3 == 2:
            yield t1, [{"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}", "type": "function",
                        "function": {"name": "search_files", "arguments": json.dumps({"pattern": words(3, i)})}}]},
                       {"role": "tool", "tool_call_id": f"c{i}", "content": "found: " + words(10 + 7 * j, i + 2)}]
        else:
            yield t1, [{"role": "user", "content": f"Follow-up {i}: " + words(5 + 20 * j, i + 1)}]


def _first_top(r):
    return {t["token_id"]: t["logprob"] for t in r["logprobs"][0]["top_logprobs"]}


@pytest.mark.parametrize("model", ["llama", "qwen"])
def test_resumed_equals_cold(request, model):
    on = request.getfixturevalue("tiny_daemon" if model == "llama" else "qwen_daemon")
    off = request.getfixturevalue("tiny_off" if model == "llama" else "qwen_off")
    tools = TOOLS if model == "qwen" else None
    c, co = fresh(on), off.conn()
    kw = dict(max_tokens=8, logprobs=True, top_logprobs=5)
    for i, (t1, follow) in enumerate(_conversations(30, tools is not None)):
        r1 = chat(c, f"e{i}a", t1, tools, **kw)
        # overwrite the pages turn 1 gave back, so a resume that failed to copy its partial page cannot pass
        chat(c, f"e{i}n", [{"role": "user", "content": words(300, 5)}], tools, cache_prompt=False)
        reply = r1["text"] if tools is None else "Sure, here it is."
        t2 = t1 + (follow if follow[0]["role"] == "assistant"
                   else [{"role": "assistant", "content": reply or "ok"}, *follow])
        r2 = chat(c, f"e{i}b", t2, tools, **kw)
        want = cuts(c, t1, tools)["cut_points"]["opener"] if tools else whole_or_opener(c, t1, r1, t2, d=on)
        assert cached(r2) == want and cached(r2) > 0
        cold = chat(co, f"o{i}", t2, tools, **kw)
        assert cold["ignis"]["reuse"]["reason"] == "reuse_off" and cached(cold) == 0
        assert r2["text"] == cold["text"], i
        hot_top, cold_top = _first_top(r2), _first_top(cold)
        assert hot_top.keys() == cold_top.keys()
        for t, lp in hot_top.items():
            assert math.isclose(lp, cold_top[t], abs_tol=1e-5), (i, t, lp, cold_top[t])
    c.close()
    co.close()
    settle(on)
    st = settle(off)
    assert st["kv_pool"]["pages_retained"] == 0 and st["retained"] == []


# ---------------------------------------------------------------- (e) opting out, reset, metrics

def test_cache_prompt_false_neither_restores_nor_captures(tiny_daemon):
    c = fresh(tiny_daemon)
    t1 = [{"role": "system", "content": "Private. " + words(70)}, long_user(7)]
    r = chat(c, "p0", t1, cache_prompt=False)
    assert r["ignis"]["reuse"]["reason"] == "reuse_off" and cached(r) == 0
    assert tiny_daemon.status()["retained"] == []
    chat(c, "p1", t1)
    assert len(tiny_daemon.status()["retained"]) == 3     # prefix, opener checkpoint, the whole sequence
    r = chat(c, "p2", t1, cache_prompt=False)
    assert r["ignis"]["reuse"]["reason"] == "reuse_off" and cached(r) == 0
    r = chat(c, "p3", t1)
    assert r["ignis"]["reuse"]["kind"] == "checkpoint" and cached(r) > 0
    assert c.request({"id": "rs", "op": "reset"})["result"] == {"dropped": 3}
    st = settle(tiny_daemon)
    assert st["retained"] == [] and st["kv_pool"]["pages_retained"] == 0
    assert st["kv_pool"]["pages_free"] == st["kv_pool"]["pages_total"]
    text = c.request({"id": "m", "op": "metrics"})["result"]["text"]
    for name in ("ignis_reuse_lookups_total", "ignis_reuse_hits_total", "ignis_reuse_tokens_restored_total",
                 "ignis_reuse_captures_total", "ignis_reuse_captures_skipped_total", "ignis_prefill_tokens_total"):
        assert name in text
    hits = sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("ignis_reuse_hits_total{"))
    assert hits >= 1
    assert 'ignis_reuse_captures_total{kind="checkpoint"}' in text
    assert "tier=device" in tiny_daemon.log() and "kind=checkpoint" in tiny_daemon.log()
    c.close()


def test_prompt_logprobs_never_restores(tiny_daemon):
    c = fresh(tiny_daemon)
    t1 = [{"role": "system", "content": "Score. " + words(70)}, long_user(8)]
    chat(c, "l0", t1)
    ids = cuts(c, t1)["tokens"]
    r = c.request({"id": "l1", "op": "completion", "prompt": ids, "max_tokens": 1, "prompt_logprobs": 1})
    assert r["ignis"]["reuse"]["reason"] == "prompt_logprobs" and cached(r) == 0
    r = c.request({"id": "l2", "op": "completion", "prompt": ids, "max_tokens": 1, "temperature": 0})
    assert r["ignis"]["reuse"]["kind"] == "checkpoint" and cached(r) > 0
    c.close()
    settle(tiny_daemon)


@pytest.mark.smollm
def test_smollm_conversation_resumes_and_matches_cold(smollm_daemon):
    """End to end on the real SmolLM2: a three-turn conversation resumes each turn past the previous turn's reply
    (sent back byte for byte: the previous whole sequence is kept, DESIGN §4.3), and its greedy replies equal the
    same requests run cold (cache_prompt false) on the same daemon."""
    c = fresh(smollm_daemon)
    msgs = [{"role": "system", "content": "You are a concise geography tutor. " + words(60)},
            {"role": "user", "content": "Name the longest river in Europe and say which countries it crosses. "
             + words(50, 3)}]
    want = 0
    for turn, follow in enumerate(["Which cities lie on it?", "And its source?", None]):
        r = chat(c, f"sm{turn}", msgs, max_tokens=12, logprobs=True)
        cold = chat(c, f"sc{turn}", msgs, max_tokens=12, cache_prompt=False)
        assert r["text"] == cold["text"]
        assert cached(r) == want
        if follow:
            nxt = msgs + [{"role": "assistant", "content": r["text"]}, {"role": "user", "content": follow}]
            want = whole_or_opener(c, msgs, r, nxt)
            # real text re-renders to the same ids: the resume covers the reply
            assert want == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"] - 1
            msgs = nxt
    c.close()
    settle(smollm_daemon)


def test_hybrid_without_retained_slots_skips_captures(start_daemon, tiny_qwen35_real_dir):
    """No retained slot (host_slots_per_lane 0): a hybrid cannot keep an image, so every capture is skipped and the
    requests run normally, leaving nothing behind."""
    d = start_daemon(["--model", str(tiny_qwen35_real_dir), "--lanes", "2", "--vram-kv-pool-bytes", "2Ktok",
                      "--model-context-tokens", "1024", "--reuse-host-slots-per-lane", "0"])
    c = d.conn()
    t1 = [{"role": "system", "content": "You are a helpful agent. " + words(80)}, long_user(9)]
    for rid in ("n0", "n1"):
        r = chat(c, rid, t1, TOOLS)
        assert cached(r) == 0 and r["ignis"]["reuse"]["reason"] == "no_slot"
    st = settle(d)
    assert st["retained"] == [] and st["slots"]["host_total"] == 0
    text = c.request({"id": "m", "op": "metrics"})["result"]["text"]
    assert 'ignis_reuse_captures_skipped_total{reason="no_slot"} 4.0' in text
    c.close()
