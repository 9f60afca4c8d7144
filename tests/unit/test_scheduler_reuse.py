"""The scheduler's prompt-reuse wiring on plain ints (no torch): lookup at admission, shared pages, restore and
capture ops, commit/abort, unpin, and the pool's accounting (DESIGN §4.1-§4.4)."""
import pytest

from ignisd.cache.manager import CacheManager
from ignisd.cache.page_pool import PagePool
from ignisd.cache.retained import RetainedStore
from ignisd.cache.retained_state import Stamp
from ignisd.cache.state_slots import StateSlots
from ignisd.request import DoneEvent, FinishReason, Priority, Request, SamplingParams
from ignisd.scheduler import ItemResult, Scheduler

PT = 64


def make(pages=32, hybrid=False, host_slots=4, reuse=True, lanes=2, chunk=64, budget=256):
    pool = PagePool(pages, PT)
    store = None
    if reuse:
        store = RetainedStore(Stamp("h", "fp32"), page_tokens=PT, device_slots=StateSlots(0),
                              host_slots=StateSlots(host_slots if hybrid else 0), needs_slot=hybrid)
    cache = CacheManager(pool, 1, slots=StateSlots(lanes) if hybrid else None, retained=store)
    return Scheduler(cache, lanes=lanes, context_tokens=4096, prefill_chunk=chunk, round_prefill_tokens=budget,
                     max_queue=16)


def req(rid, ids, publish=0, opener=None, max_tokens=2, **kw):
    return Request(rid, list(ids), SamplingParams(max_tokens=max_tokens, temperature=0.0), publish=publish,
                   opener=opener, **kw)


def run(sched, log=None):
    """Drive rounds until idle with a fake runner (every sampled token is 7); returns the DoneEvents by rid."""
    done = {}
    for _ in range(200):
        if sched.idle():
            break
        plan = sched.schedule()
        if log is not None:
            log.append(plan)
        res = [ItemResult(token_id=7 if it.sample else None) for it in plan.items]
        for ev in sched.update(plan, res):
            if isinstance(ev, DoneEvent):
                done[ev.rid] = ev
    assert sched.idle()
    sched.cache.check_integrity()
    return done


PROMPT = list(range(1000, 1300))     # 300 tokens: publish 128, opener 250


def test_cold_run_captures_prefix_and_checkpoint_at_chunk_ends():
    s = make(hybrid=True)        # a hybrid's capture takes an image: its traversals split at the cut points
    log = []
    s.submit(req("a", PROMPT, publish=128, opener=250, after_user=True))
    done = run(s, log)
    assert done["a"].cached_tokens == 0 and done["a"].reuse.reason == "miss"
    caps = [(it.start + len(it.token_ids), c.kind) for p in log for it in p.items for c in it.captures]
    assert caps == [(128, "prefix"), (250, "checkpoint")]
    # chunks restart at each cut point; the capture chunk is the sequence's last of its round
    starts = [it.start for p in log for it in p.items if it.seq_id]
    assert 128 in starts and 250 in starts and 192 in starts
    for p in log:
        for it in p.items:
            if it.captures:
                assert it is [x for x in p.items if x.seq_id == it.seq_id][-1]
    store = s.cache.retained
    assert sorted((x.kind, x.n_tokens) for x in store.states()) == [("checkpoint", 250), ("prefix", 128)]
    # the checkpoint shares the prefix's two full pages, holds a third and a private copy of its partial page
    ck = next(x for x in store.states() if x.kind == "checkpoint")
    pf = next(x for x in store.states() if x.kind == "prefix")
    assert ck.pages[:2] == pf.pages and len(ck.pages) == 4
    assert s.cache.pool.used == s.cache.retained_pages() == 4


def test_attention_only_captures_ride_the_chunks_and_the_whole_sequence_is_kept():
    s = make()                   # attention-only, exact format: captures cost no traversal (DESIGN §4.3)
    assert s.cache.free_captures and not make(hybrid=True).cache.free_captures
    log = []
    s.submit(req("a", PROMPT, publish=128, opener=250, after_user=True))
    run(s, log)
    starts = [it.start for p in log for it in p.items if it.phase == "prefill"]
    assert starts == [0, 64, 128, 192, 256]             # the same chunks as a prompt without cut points
    caps = [(it.start, c.pos, c.kind) for p in log for it in p.items for c in it.captures]
    assert caps == [(64, 128, "prefix"), (192, 250, "checkpoint")]
    states = {x.n_tokens: x for x in s.cache.retained.states()}
    # 300 prompt tokens + 2 generated (7, 7): the pages hold the prompt and the first generated token
    assert sorted(states) == [128, 250, 301]
    pf, ck, whole = states[128], states[250], states[301]
    assert whole.tokens == tuple(PROMPT) + (7,) and whole.kind == "checkpoint"
    assert whole.superseded and not ck.superseded       # ranked below the opener checkpoint; supersedes nothing
    assert s.cache.retained.rank(whole) < s.cache.retained.rank(ck)
    # the whole sequence keeps the live pages (its last page was no longer written: shared, not copied)
    assert whole.pages[:2] == pf.pages and whole.pages[:3] == ck.pages[:3] and len(whole.pages) == 5
    assert ck.pages[3] not in whole.pages
    assert s.cache.pool.used == s.cache.retained_pages() == 6
    # a continuation that sends the reply back resumes past it
    s.submit(req("b", list(PROMPT) + [7] + list(range(5000, 5040)), publish=128, opener=330))
    done = run(s)
    assert done["b"].cached_tokens == 301 and done["b"].prefilled_tokens == 40


def test_attention_only_keeps_an_opener_close_to_the_resume_point():
    s = make()
    s.submit(req("a", PROMPT, publish=128, opener=250))
    run(s)
    s.submit(req("b", PROMPT[:250] + list(range(5000, 5010)), publish=128, opener=253))
    log = []
    done = run(s, log)
    assert done["b"].cached_tokens == 250
    assert [c.pos for p in log for it in p.items for c in it.captures] == [253]     # 3 tokens past the resume
    h = make(hybrid=True)
    h.submit(req("a", PROMPT, publish=128, opener=250))
    run(h)
    h.submit(req("b", PROMPT[:250] + list(range(5000, 5010)), publish=128, opener=253))
    log = []
    run(h, log)
    assert not any(it.captures for p in log for it in p.items)    # a hybrid skips it: under a page past the resume


def test_resume_shares_full_pages_and_copies_the_partial_one():
    s = make()
    s.submit(req("a", PROMPT, publish=128, opener=250))
    run(s)
    ck = next(x for x in s.cache.retained.states() if x.kind == "checkpoint")
    turn2 = PROMPT[:250] + list(range(5000, 5100))
    s.submit(req("b", turn2, publish=128, opener=340))
    seq = s.running[0]
    assert seq.resume == seq.computed == 250 and ck.pins == 1
    assert seq.pages[:3] == ck.pages[:3]                      # shared in place
    assert s.cache.pool.refcount(ck.pages[0]) == 4             # prefix + checkpoint + a's whole sequence + live
    plan = s.schedule()
    rs = plan.restores[0]
    assert (rs.src_page, rs.dst_page) == (ck.pages[3], seq.pages[3]) and rs.dst_page != rs.src_page
    assert plan.items[0].start == 250                          # the first chunk starts at the resume point
    s.update(plan, [ItemResult(token_id=7 if it.sample else None) for it in plan.items])
    assert ck.pins == 0 and not s.schedule().restores
    done = run(s)
    assert done["b"].cached_tokens == 250 and done["b"].prefilled_tokens == 100
    assert (done["b"].reuse.kind, done["b"].reuse.tier, done["b"].reuse.reason) == ("checkpoint", "device", None)


def test_cache_prompt_false_and_prompt_logprobs_neither_restore_nor_capture():
    s = make()
    s.submit(req("a", PROMPT, publish=128, opener=250, cache_prompt=False))
    assert run(s)["a"].reuse.reason == "reuse_off" and len(s.cache.retained) == 0
    s.submit(req("b", PROMPT, publish=128, opener=250))
    run(s)
    s.submit(req("c", PROMPT, publish=128, opener=250, prompt_logprobs=1))
    d = run(s)["c"]
    assert d.cached_tokens == 0 and d.reuse.reason == "prompt_logprobs"
    off = make(reuse=False)
    off.submit(req("d", PROMPT, publish=128, opener=250))
    assert run(off)["d"].reuse.reason == "reuse_off"


def test_miss_reports_cut_reason_and_candidate():
    s = make()
    s.submit(req("a", PROMPT, publish=0, opener=250, cut_reason="below_page"))
    run(s)
    other = PROMPT[:100] + [1] + PROMPT[101:]
    s.submit(req("b", other, publish=0, opener=250, cut_reason="below_page"))
    d = run(s)["b"]
    assert d.reuse.reason == "below_page" and d.reuse.candidate_common == 100
    assert d.reuse.candidate_kind == "checkpoint" and len(d.reuse.candidate_tokens) == 250


def test_cancel_before_the_round_unpins_and_a_failed_round_aborts_captures():
    s = make()
    s.submit(req("a", PROMPT, publish=128, opener=250))
    run(s)
    ck = next(x for x in s.cache.retained.states() if x.kind == "checkpoint")
    s.submit(req("b", PROMPT[:250] + [9] * 90, publish=128, opener=None))
    assert ck.pins == 1
    s.cancel(s.running[0].rid, FinishReason.CANCELLED)
    assert ck.pins == 0
    s.cache.check_integrity()
    # a round whose captures were reserved but never committed (the forward failed): cancel aborts them
    s.cache.retained.reset()
    s.submit(req("c", PROMPT, publish=128, opener=250))
    plan = s.schedule()
    assert any(it.captures for it in plan.items)
    s.cancel("c", FinishReason.CANCELLED)
    assert len(s.cache.retained) == 0 and s.cache.pool.used == 0
    s.cache.check_integrity()


def test_hybrid_captures_take_retained_slots_and_skip_when_none():
    s = make(hybrid=True, host_slots=1)
    s.submit(req("a", PROMPT, publish=128, opener=250))
    log = []
    run(s, log)
    caps = [c for p in log for it in p.items for c in it.captures]
    assert [c.kind for c in caps] == ["prefix", "checkpoint"]
    assert all(c.slot_tier == "host" for c in caps) and caps[1].copy_page is not None
    # one slot: the newer checkpoint took the prefix's slot (the prefix ranked below it and was dropped)
    (st,) = s.cache.retained.states()
    assert st.kind == "checkpoint" and st.slot == caps[1].slot
    # an agent request's captures cannot displace an interactive state: skipped, and the request runs normally
    log = []
    s.submit(req("x", list(range(9000, 9300)), publish=128, opener=250, priority=Priority.AGENT))
    dx = run(s, log)["x"]
    assert dx.generated_tokens == 2 and dx.reuse.reason == "no_slot"     # the reply says why nothing was left
    assert not any(it.captures for p in log for it in p.items)
    assert s.cache.retained.states() == [st]
    s.submit(req("b", PROMPT[:250] + [3] * 50, publish=128, opener=None))
    plan = s.schedule()
    rs = plan.restores[0]
    assert (rs.slot_tier, rs.slot) == ("host", st.slot) and rs.src_page == st.pages[3]
    s.update(plan, [ItemResult(token_id=7 if it.sample else None) for it in plan.items])
    assert run(s)["b"].cached_tokens == 250


def test_admission_evicts_retained_state_rather_than_refusing():
    s = make(pages=8)
    s.submit(req("a", PROMPT, publish=128, opener=250))
    run(s)
    assert s.cache.pool.free == 2        # prefix 2 + checkpoint's copy 1 + the whole sequence's 5 (2 shared): 6 used
    s.submit(req("b", list(range(7000, 7400)), max_tokens=40))   # 7 pages: needs retained pages back
    assert s.running and s.running[0].rid == "b"
    run(s)


@pytest.mark.parametrize("publish,opener,n", [(64, 127, 200), (64, 129, 200), (128, 191, 193), (0, 64, 65)])
def test_resume_never_reaches_the_last_prompt_token(publish, opener, n):
    s = make()
    ids = list(range(n))
    s.submit(req("a", ids, publish=publish, opener=opener))
    run(s)
    s.submit(req("b", ids, publish=publish, opener=opener))
    d = run(s)["b"]
    assert 0 < d.cached_tokens < n and d.prefilled_tokens == n - d.cached_tokens


def test_burst_waits_for_the_first_to_publish_the_shared_block():
    s = make(lanes=4)
    block = list(range(2000, 2128))
    s.submit(req("a", block + list(range(100)), publish=128, opener=None))
    for i in range(3):
        s.submit(req(f"b{i}", block + [50 + i] * (10 + 40 * i), publish=128, opener=None))
    assert [x.rid for x in s.running] == ["a"] and len(s.waiting) == 3
    done = run(s)
    assert done["a"].cached_tokens == 0
    for i in range(3):
        d = done[f"b{i}"]
        assert (d.cached_tokens, d.reuse.kind) == (128, "prefix")
    # with cache_prompt false a request does not wait
    s.cache.retained.reset()
    s.submit(req("c", block + list(range(100)), publish=128, opener=None))
    s.submit(req("d", block + [1] * 5, publish=128, opener=None, cache_prompt=False))
    assert [x.rid for x in s.running] == ["c", "d"]
    run(s)


def _step(s):
    plan = s.schedule()
    s.update(plan, [ItemResult(token_id=7 if it.sample else None) for it in plan.items])
    return [(it.seq_id, it.start, len(it.token_ids)) for it in plan.items]


def test_a_short_prefill_never_waits_behind_a_long_one():
    """Head-of-line blocking: a short request arriving while a 2,000-token prompt is being prefilled gets its first
    token in the very next round, which runs no chunk of the long prompt; the round after gives the long prompt
    its whole budget back, and a short arrival every round still leaves it every other round."""
    s = make(pages=64, reuse=False, lanes=4, chunk=64, budget=256)
    s.submit(req("long", range(5000, 7000), max_tokens=1))
    assert _step(s) == [("long", 0, 64), ("long", 64, 64), ("long", 128, 64), ("long", 192, 64)]
    s.submit(req("short", range(100, 130), max_tokens=3))
    assert _step(s) == [("short", 0, 30)]                    # its first token, in the first round after arrival
    rows = _step(s)
    assert rows[0] == ("short", 30, 1)                       # decoding from here on
    assert [r for r in rows if r[0] == "long"] == [("long", 256, 64), ("long", 320, 64), ("long", 384, 64),
                                                   ("long", 448, 64)]
    long_rounds = 0
    for k in range(6):                                       # a new short request before every round
        s.submit(req(f"s{k}", range(200 + k, 220 + k), max_tokens=1))
        long_rounds += any(r[0] == "long" for r in _step(s))
    assert long_rounds == 3
    run(s)


def test_miss_reasons_short_and_no_slot_at_all():
    """A prompt of at most one page (64 tokens) can neither resume nor leave anything: reason ``short``, and a
    hybrid daemon with no retained slot at all says ``no_slot`` on every miss, ahead of the prompt's cut reason."""
    s = make()
    s.submit(req("a", range(10, 74), opener=60))                  # 64 tokens
    s.submit(req("b", range(10, 75), opener=60))                  # 65 tokens: a plain miss
    d = run(s)
    assert d["a"].reuse.reason == "short" and d["b"].reuse.reason == "miss"
    h = make(hybrid=True, host_slots=0)
    h.submit(req("c", PROMPT, publish=0, opener=250, cut_reason="below_page"))
    h.submit(req("d", range(10, 40)))
    d = run(h)
    assert d["c"].reuse.reason == "no_slot" and d["d"].reuse.reason == "short"
    assert len(h.cache.retained) == 0
