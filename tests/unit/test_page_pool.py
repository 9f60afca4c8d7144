"""Page pool accounting and the scheduler's admission/chunk plan, on plain ints (no torch needed)."""
import pytest

from ignisd.cache.manager import CacheManager
from ignisd.cache.page_pool import IntegrityError, PagePool, PoolExhausted
from ignisd.request import DoneEvent, FinishReason, Priority, Request, SamplingParams
from ignisd.scheduler import AdmissionError, ItemResult, QueueFull, Scheduler


def test_alloc_release_refcounts():
    pool = PagePool(10)
    a = pool.alloc(4)
    b = pool.alloc(6)
    assert sorted(a + b) == list(range(10)) and pool.free == 0
    with pytest.raises(PoolExhausted):
        pool.alloc(1)
    pool.incref(a[:2])
    pool.check_integrity([a, b, a[:2]])
    with pytest.raises(IntegrityError):
        pool.check_integrity([a, b])  # refcount 2 on a[:2] but only one holder listed
    pool.release(a)
    assert pool.free == 2 and pool.refcount(a[0]) == 1
    pool.release(a[:2])
    pool.release(b)
    assert pool.free == 10
    pool.check_integrity([])
    with pytest.raises(IntegrityError):
        pool.release([0])


def test_pages_for_is_ceil_of_64():
    pool = PagePool(4)
    assert [pool.pages_for(n) for n in (0, 1, 64, 65, 128, 129)] == [0, 1, 1, 2, 2, 3]


def _req(rid, n, max_tokens=10, prio=Priority.INTERACTIVE, arrival=0.0):
    return Request(rid, list(range(1, n + 1)), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                             stop_token_ids=frozenset({0})),
                   priority=prio, arrival=arrival)


def _sched(pages=16, lanes=2, chunk=64, budget=128, ctx=2048, max_queue=4):
    return Scheduler(CacheManager(PagePool(pages), 4096), lanes=lanes, context_tokens=ctx, prefill_chunk=chunk,
                     round_prefill_tokens=budget, max_queue=max_queue)


def test_admission_reserves_whole_bound_and_queues():
    s = _sched(pages=4, lanes=4)
    s.submit(_req("a", 100, max_tokens=100))   # 200 tokens -> 4 pages: whole pool
    s.submit(_req("b", 10, max_tokens=10))
    plan = s.schedule()
    assert [it.seq_id for it in plan.items] == ["a", "a"]     # 100 tokens: chunks [0,64) and [64,100)
    assert [(it.start, len(it.token_ids)) for it in plan.items] == [(0, 64), (64, 36)]
    assert s.cache.pool.free == 0 and [q.rid for q in s.waiting] == ["b"]
    assert plan.items[-1].sample and not plan.items[0].sample


def test_context_and_pool_limits_refused():
    s = _sched(pages=4, ctx=300)
    with pytest.raises(AdmissionError) as e:
        s.submit(_req("a", 200, max_tokens=101))
    assert e.value.code == "context_length" and e.value.field == "max_tokens"
    with pytest.raises(AdmissionError) as e:
        s.submit(_req("b", 200, max_tokens=100))   # 300 tokens = 5 pages > 4-page pool
    assert e.value.code == "context_length" and "pool" in e.value.message
    with pytest.raises(AdmissionError):
        s.submit(_req("c", 0))


def test_queue_full_is_busy():
    s = _sched(max_queue=2, lanes=1)
    s.submit(_req("a", 5))        # gets the lane at once: never waits
    s.submit(_req("b", 5))
    s.submit(_req("c", 5))
    assert [q.rid for q in s.waiting] == ["b", "c"]
    with pytest.raises(QueueFull):
        s.submit(_req("d", 5))


def test_chunks_restart_at_multiples_and_budget_holds():
    s = _sched(pages=64, lanes=2, chunk=64, budget=100)
    s.submit(_req("long", 300, arrival=0.0))
    s.submit(_req("short", 30, arrival=1.0))
    rounds = []
    for _ in range(4):
        plan = s.schedule()
        rounds.append([(it.seq_id, it.start, len(it.token_ids)) for it in plan.items])
        s.update(plan, [ItemResult(token_id=7 if it.sample else None) for it in plan.items])
    # shortest remaining prefill first, and a round that ends a prefill runs no other prefill (head-of-line rule);
    # then only whole chunks within the 100-token budget (chunk = min(64, 100)), restarting at multiples of 64
    assert rounds[0] == [("short", 0, 30)]
    assert rounds[1] == [("short", 30, 1), ("long", 0, 64)]
    assert rounds[2] == [("short", 31, 1), ("long", 64, 64)]
    assert rounds[3] == [("short", 32, 1), ("long", 128, 64)]


def test_update_emits_tokens_stop_and_length_and_frees_pages():
    s = _sched(pages=8)
    s.submit(_req("a", 10, max_tokens=3))
    s.submit(_req("b", 10, max_tokens=3))
    plan = s.schedule()
    ev = s.update(plan, [ItemResult(token_id=7), ItemResult(token_id=0)])   # b samples the stop token 0
    assert [type(e).__name__ for e in ev] == ["TokenEvent", "DoneEvent"]
    assert ev[1].finish_reason is FinishReason.STOP and ev[1].generated_tokens == 1
    for _ in range(2):
        plan = s.schedule()
        assert [(it.seq_id, it.start, it.token_ids) for it in plan.items][0][:2] == ("a", s.running[0].computed)
        ev = s.update(plan, [ItemResult(token_id=5)])
    assert isinstance(ev[-1], DoneEvent) and ev[-1].finish_reason is FinishReason.LENGTH
    assert ev[-1].generated_tokens == 3 and ev[-1].prompt_tokens == 10 and ev[-1].cached_tokens == 0
    assert s.idle() and s.cache.pool.free == 8
    s.cache.check_integrity()


def test_cancel_waiting_and_running():
    s = _sched(pages=8, lanes=1)
    s.submit(_req("a", 10))
    s.submit(_req("b", 10))
    s.schedule()
    assert [e.finish_reason for e in s.cancel("b", FinishReason.CANCELLED)] == [FinishReason.CANCELLED]
    assert [e.rid for e in s.cancel("a", FinishReason.CANCELLED)] == ["a"]
    assert s.cancel("zzz", FinishReason.CANCELLED) == []
    assert s.idle() and s.cache.pool.free == 8


def test_interactive_admitted_before_agent():
    s = _sched(pages=8, lanes=1)
    s.submit(_req("first", 10))
    s.submit(_req("agent", 10, prio=Priority.AGENT, arrival=0.0))
    s.submit(_req("inter", 10, prio=Priority.INTERACTIVE, arrival=1.0))
    s.cancel("first", FinishReason.CANCELLED)    # the lane frees: the later interactive request goes first
    s.schedule()
    assert [q.rid for q in s.running] == ["inter"]


def test_state_slots_follow_sequences():
    from ignisd.cache.state_slots import StateSlots
    cache = CacheManager(PagePool(16), 4096, slots=StateSlots(2), state_bytes=1000)
    s = Scheduler(cache, lanes=4, context_tokens=2048, prefill_chunk=64, round_prefill_tokens=128, max_queue=8)
    for rid in ("a", "b", "c"):
        s.submit(_req(rid, 10))
    # two slots: the third request waits although a lane and pages are free
    assert sorted(q.slot for q in s.running) == [0, 1] and [q.rid for q in s.waiting] == ["c"]
    assert cache.live_state_bytes() == 2000
    cache.check_integrity()
    s.cancel("a", FinishReason.CANCELLED)
    s.schedule()
    assert sorted(q.rid for q in s.running) == ["b", "c"]
    cache.check_integrity()
    for rid in ("b", "c"):
        s.cancel(rid, FinishReason.CANCELLED)
    assert cache.slots.free == 2 and cache.live_state_bytes() == 0
    cache.check_integrity()
    with pytest.raises(IntegrityError):
        cache.slots.release(0)


def test_run_freed_together_comes_back_ascending():
    pool = PagePool(16, 64)
    first = pool.alloc(5)
    assert first == [0, 1, 2, 3, 4]
    other = pool.alloc(2)
    pool.release(first)
    assert pool.alloc(5) == first          # the same consecutive run, in order
    pool.release(other)
    assert pool.alloc(2) == other
