"""The engine's round loop in-process (ignisd/engine.py) with a fake runner: admission, chunking, capture, resume,
cancel, finish and a failing round, on exact ids — the scheduler, the cache manager and the retained store are the
real ones; only the forward pass is replaced. The fake runner answers every sampled item with token
500 + (the position it predicts), so every token id below is computed by hand from the plan."""
from __future__ import annotations

import asyncio
import threading

import pytest

from ignisd.cache.manager import CacheManager
from ignisd.cache.page_pool import PagePool
from ignisd.cache.retained import RetainedStore
from ignisd.cache.retained_state import Stamp
from ignisd.cache.state_slots import StateSlots
from ignisd.engine import Engine
from ignisd.plan import ItemResult, RoundPlan, RoundResult
from ignisd.request import AdmittedEvent, DoneEvent, ErrorEvent, FinishReason, Request, SamplingParams, TokenEvent
from ignisd.scheduler import Scheduler

PT = 64
STOP = 9_999


class FakeRunner:
    """Stands in for ignisd.runner.Runner: records each plan (a value) and answers sampled items with
    500 + start + len(token_ids). fail_at: the round index that raises instead."""

    def __init__(self, fail_at: int | None = None):
        self.plans: list[RoundPlan] = []
        self.fail_at = fail_at
        self.forgotten: list[str] = []
        self.stop_at: dict[str, int] = {}      # seq id -> the position whose prediction is the stop token
        self.hooks: dict[int, object] = {}    # round index -> called in the worker thread during that round

    def execute(self, plan: RoundPlan) -> RoundResult:
        self.plans.append(plan)
        hook = self.hooks.get(len(self.plans) - 1)
        if hook is not None:
            hook()
        if self.fail_at is not None and len(self.plans) - 1 == self.fail_at:
            raise RuntimeError("injected forward failure")
        out = []
        for it in plan.items:
            pos = it.start + len(it.token_ids)
            tok = STOP if self.stop_at.get(it.seq_id) == pos else 500 + pos
            out.append(ItemResult(token_id=tok if it.sample else None))
        return RoundResult(out)

    def forget(self, rid: str) -> None:
        self.forgotten.append(rid)

    def chunks(self, rid: str) -> list[tuple[int, int]]:
        """(start, length) of every item of `rid`, in plan order."""
        return [(it.start, len(it.token_ids)) for p in self.plans for it in p.items if it.seq_id == rid]


def make(*, pages=64, hybrid=False, host_slots=4, fail_at=None, lanes=4):
    pool = PagePool(pages, PT)
    store = RetainedStore(Stamp("h", "fp32"), page_tokens=PT, device_slots=StateSlots(0),
                          host_slots=StateSlots(host_slots if hybrid else 0), needs_slot=hybrid)
    cache = CacheManager(pool, 1, slots=StateSlots(lanes) if hybrid else None, retained=store)
    sched = Scheduler(cache, lanes=lanes, context_tokens=4096, prefill_chunk=64, round_prefill_tokens=256,
                      max_queue=16)
    runner = FakeRunner(fail_at)
    return Engine(sched, runner), runner


def req(rid, ids, *, max_tokens=3, publish=0, opener=None, **kw):
    return Request(rid, list(ids), SamplingParams(max_tokens=max_tokens, temperature=0.0,
                                                  stop_token_ids=frozenset({STOP})),
                   publish=publish, opener=opener, **kw)


async def drain(q: asyncio.Queue) -> list:
    out = []
    while True:
        ev = await asyncio.wait_for(q.get(), 10)
        out.append(ev)
        if isinstance(ev, (DoneEvent, ErrorEvent)):
            return out


def run(engine: Engine, body):
    """Run the engine loop while `body(engine)` (a coroutine function) talks to it; then stop it."""
    async def main():
        task = asyncio.create_task(engine.run())
        try:
            return await body(engine)
        finally:
            engine.stop()
            await task
    return asyncio.run(main())


PROMPT = list(range(1000, 1300))                # 300 tokens: publish 128, opener 250


def test_admission_chunking_capture_and_finish_on_exact_ids():
    engine, runner = make(hybrid=True)

    async def body(e):
        return await drain(e.submit(req("a", PROMPT, publish=128, opener=250, after_user=True)))

    events = run(engine, body)
    # a hybrid's chunks restart at each cut point: [0,128) in 64s, [128,250) in 64s, then [250,300); at most 256 a
    # round and the capture chunk is the sequence's last of its round
    assert runner.chunks("a") == [(0, 64), (64, 64), (128, 64), (192, 58), (250, 50), (300, 1), (301, 1)]
    rounds = [[(it.start, len(it.token_ids), it.captures[0].kind if it.captures else None) for it in p.items]
              for p in runner.plans]
    assert rounds == [[(0, 64, None), (64, 64, "prefix")], [(128, 64, None), (192, 58, "checkpoint")],
                      [(250, 50, None)], [(300, 1, None)], [(301, 1, None)]]
    assert [p.items[0].phase for p in runner.plans] == ["prefill", "prefill", "prefill", "decode", "decode"]
    toks = [ev.token_id for ev in events if isinstance(ev, TokenEvent)]
    assert toks == [800, 801, 802]               # 500 + the position each token predicts
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason is FinishReason.LENGTH
    assert (done.prompt_tokens, done.cached_tokens, done.prefilled_tokens, done.generated_tokens) == (300, 0, 300, 3)
    assert done.reuse.reason == "miss"
    store = engine.cache.retained
    assert sorted((s.kind, s.n_tokens, tuple(s.pages)) for s in store.states()) == [
        ("checkpoint", 250, (0, 1, 2, 5)), ("prefix", 128, (0, 1))]   # pages 0-4 were a's; 5 the tail copy
    assert engine.integrity_checks == 1 and runner.forgotten == ["a"]
    assert engine.cache.pool.used == 4 and engine.cache.live_pages() == 0


def test_the_next_turn_resumes_at_the_checkpoint():
    engine, runner = make(hybrid=True)
    turn2 = PROMPT[:250] + list(range(5000, 5100))

    async def body(e):
        await drain(e.submit(req("a", PROMPT, publish=128, opener=250)))
        n = len(runner.plans)
        ev = await drain(e.submit(req("b", turn2, publish=128, opener=None, max_tokens=2)))
        return n, ev

    n, events = run(engine, body)
    plan = runner.plans[n]
    (rs,) = plan.restores
    ck = next(s for s in engine.cache.retained.states() if s.kind == "checkpoint")
    # b shares a's pages 0-2 and allocates 3 more: a released its run 3, 4 together, which the pool hands back in
    # ascending order (PagePool.release), so b's first new page is 3
    assert (rs.seq_id, rs.state_id, rs.src_page, rs.dst_page) == ("b", ck.id, ck.pages[3], 3)
    assert runner.chunks("b") == [(250, 64), (314, 36), (350, 1)]
    assert [ev.token_id for ev in events if isinstance(ev, TokenEvent)] == [850, 851]
    done = events[-1]
    assert (done.cached_tokens, done.prefilled_tokens, done.reuse.kind, done.reuse.tier) == (250, 100, "checkpoint",
                                                                                            "device")
    assert ck.pins == 0 and engine.integrity_checks == 2


def test_admission_event_precedes_the_prefill_round():
    """A request's first event says how much of its prompt is restored, sent before the round that starts its
    prefill runs (a front reports reuse before the first token, whose prefill may take seconds); it matches the
    DoneEvent's count."""
    engine, runner = make(hybrid=True)
    turn2 = PROMPT[:250] + list(range(5000, 5100))
    admitted = threading.Event()
    seen = {}

    async def body(e):
        first = await drain(e.submit(req("a", PROMPT, publish=128, opener=250)))
        q = e.submit(req("b", turn2, publish=128, opener=None, max_tokens=2))
        # b's first round waits (in the forward's thread) for b's first event to reach the client side
        runner.hooks[len(runner.plans)] = lambda: seen.update(during=admitted.wait(5))
        events = [await asyncio.wait_for(q.get(), 10)]
        admitted.set()
        return first, events + await drain(q)

    first, events = run(engine, body)
    assert first[0] == AdmittedEvent("a", 0) and first[-1].cached_tokens == 0
    assert seen["during"] is True
    assert events[0] == AdmittedEvent("b", 250) and isinstance(events[1], TokenEvent)
    assert events[-1].cached_tokens == 250 and sum(isinstance(ev, AdmittedEvent) for ev in events) == 1


def test_cancel_mid_prefill_and_stop_token():
    engine, runner = make()
    runner.stop_at["s"] = 101                   # s's second sampled token is the stop token

    async def body(e):
        loop = asyncio.get_running_loop()
        # the cancel arrives while round 1 runs (queued on the loop before that round's result): it takes effect
        # at the next round boundary
        runner.hooks[1] = lambda: loop.call_soon_threadsafe(e.cancel, "long")
        qa = e.submit(req("long", list(range(2000, 2800)), max_tokens=5))
        qs = e.submit(req("s", list(range(3000, 3100)), max_tokens=5))
        return await drain(qa), await drain(qs)

    ea, es = run(engine, body)
    assert isinstance(ea[-1], DoneEvent) and ea[-1].finish_reason is FinishReason.CANCELLED
    # round 0 ran only s (its prefill ends there: the head-of-line rule), round 1 gave long the whole budget
    assert ea[-1].generated_tokens == 0 and ea[-1].prefilled_tokens == 256
    assert runner.chunks("long") == [(0, 64), (64, 64), (128, 64), (192, 64)]
    assert runner.chunks("s") == [(0, 64), (64, 36), (100, 1)]
    assert [ev.token_id for ev in es if isinstance(ev, TokenEvent)] == [600]
    assert es[-1].finish_reason is FinishReason.STOP and es[-1].generated_tokens == 2
    assert engine.cache.live_pages() == 0
    engine.cache.check_integrity()


def test_a_failing_round_fails_only_its_requests_and_aborts_its_captures():
    engine, runner = make(hybrid=True, fail_at=1)            # the round holding the checkpoint capture raises

    async def body(e):
        return await drain(e.submit(req("a", PROMPT, publish=128, opener=250)))

    events = run(engine, body)
    assert isinstance(events[-1], ErrorEvent) and events[-1].code == "internal"
    store = engine.cache.retained
    # the prefix committed in round 0 stays; the checkpoint reserved for round 1 was aborted with its copy page
    assert [(s.kind, s.n_tokens) for s in store.states()] == [("prefix", 128)]
    assert engine.cache.pool.used == 2 and engine.cache.live_pages() == 0
    engine.cache.check_integrity()


@pytest.mark.parametrize("n, reason", [(40, "short"), (64, "short"), (65, "miss")])
def test_a_request_cancelled_while_queued_reports_short(n, reason):
    engine, runner = make(lanes=1)

    async def body(e):
        loop = asyncio.get_running_loop()
        runner.hooks[0] = lambda: loop.call_soon_threadsafe(e.cancel, "queued")
        qa = e.submit(req("busy", list(range(4000, 4100)), max_tokens=5))
        qb = e.submit(req("queued", list(range(6000, 6000 + n))))
        eb = await drain(qb)
        await drain(qa)
        return eb

    eb = run(engine, body)
    assert eb[-1].finish_reason is FinishReason.CANCELLED and eb[-1].reuse.reason == reason
    assert not any(it.seq_id == "queued" for p in runner.plans for it in p.items)


def test_hybrid_resume_restores_the_image_into_the_live_slot():
    engine, runner = make(hybrid=True, host_slots=2)

    async def body(e):
        await drain(e.submit(req("a", PROMPT, publish=128, opener=250)))
        n = len(runner.plans)
        await drain(e.submit(req("b", PROMPT[:250] + [7] * 20, max_tokens=1)))
        return n

    n = run(engine, body)
    caps = [c for p in runner.plans[:n] for it in p.items for c in it.captures]
    assert [(c.kind, c.pos, c.slot_tier, c.src_slot) for c in caps] == [("prefix", 128, "host", 0),
                                                                        ("checkpoint", 250, "host", 0)]
    (rs,) = runner.plans[n].restores
    ck = next(s for s in engine.cache.retained.states() if s.kind == "checkpoint")
    assert (rs.slot_tier, rs.slot, rs.dst_slot) == ("host", ck.slot, 0)
    assert engine.cache.slots.free == 4


def make_tiered(*, lanes=2, pages=32, arena_pages=16, window=2):
    from ignisd.cache.extents import ExtentAllocator
    from ignisd.cache.tiers import Tiers
    pool = PagePool(pages, PT)
    store = RetainedStore(Stamp("h", "fp32"), page_tokens=PT, device_slots=StateSlots(0),
                          host_slots=StateSlots(0), needs_slot=False)
    tiers = Tiers(ExtentAllocator(arena_pages * 4096, align=4096) if arena_pages else None, 0, 4096)
    cache = CacheManager(pool, 4096, retained=store, tiers=tiers)
    sched = Scheduler(cache, lanes=lanes, context_tokens=4096, prefill_chunk=64, round_prefill_tokens=256,
                      max_queue=16, evict_window_pages=window)
    runner = FakeRunner()
    return Engine(sched, runner), runner


@pytest.mark.parametrize("arena_pages", [16, 0])
def test_an_interactive_request_evicts_the_latest_agent_which_resumes_where_it_stopped(arena_pages):
    """Lanes full of agent work: an interactive request moves the latest agent down a window of pages a round (the
    other agent keeps decoding every round), takes its lane, and the evicted one resumes with its own bytes (or, with
    no KV-RAM, is recomputed) and continues: its tokens are exactly what an uninterrupted run gives (the fake runner
    answers 500 + position), none repeated or lost."""
    from ignisd.request import Priority
    engine, runner = make_tiered(arena_pages=arena_pages)

    async def body(e):
        loop = asyncio.get_running_loop()
        qs = {}

        def arrive():
            qs["i"] = e.submit(req("i", list(range(7000, 7100)), max_tokens=3))
        runner.hooks[12] = lambda: loop.call_soon_threadsafe(arrive)
        qa = e.submit(req("a1", list(range(2000, 2300)), max_tokens=40, priority=Priority.AGENT))
        qb = e.submit(req("a2", list(range(3000, 3300)), max_tokens=40, priority=Priority.AGENT))
        ea, eb = await drain(qa), await drain(qb)
        while "i" not in qs:
            await asyncio.sleep(0.001)
        return ea, eb, await drain(qs["i"])

    ea, eb, ei = run(engine, body)
    for evs in (ea, eb):                         # both agents: exactly the uninterrupted token sequence
        assert [ev.token_id for ev in evs if isinstance(ev, TokenEvent)] == [800 + k for k in range(40)]
        assert evs[-1].finish_reason is FinishReason.LENGTH and evs[-1].generated_tokens == 40
    assert [ev.token_id for ev in ei if isinstance(ev, TokenEvent)] == [600, 601, 602]
    plans = runner.plans
    a2_rounds = [k for k, p in enumerate(plans) if any(it.seq_id == "a2" for it in p.items)]
    a1_rounds = [k for k, p in enumerate(plans) if any(it.seq_id == "a1" for it in p.items)]
    gap = [k for k in range(a2_rounds[0], a2_rounds[-1]) if k not in a2_rounds]
    assert gap and not set(gap) & set(range(a1_rounds[0], a1_rounds[-1] + 1)) - set(a1_rounds)
    assert all(any(it.seq_id == "a1" for it in plans[k].items) for k in gap)   # a1 never stopped meanwhile
    if arena_pages:
        moves = [mv for p in plans for mv in p.moves if mv.state_id == "a2"]
        assert [len(mv.pages) for mv in moves] == [2, 2, 1]                      # 5 pages, a window of 2 a round
        assert [mv.dst_offset for mv in moves] == [moves[0].dst_offset + k * 2 * 4096 for k in range(3)]
        (rs,) = [r for p in plans for r in p.restores if r.seq_id == "a2"]
        assert rs.tier == "ram" and rs.src_offset == moves[0].dst_offset and len(rs.dst_pages) == 5
        assert engine.scheduler.evictions.evicted_total == 1
    else:                                        # recomputed: prompt + generated but the last, then decode on
        assert engine.scheduler.evictions.recomputed_total == 1
        redo = [it for p in plans for it in p.items if it.seq_id == "a2" and it.phase == "prefill"][-1]
        before = sum(1 for k in a2_rounds if k < gap[0] for it in plans[k].items if it.seq_id == "a2" and it.sample)
        assert not redo.sample and redo.start + len(redo.token_ids) == 300 + before - 1
    engine.cache.check_integrity()
    assert engine.cache.tiers.arena is None or engine.cache.tiers.arena.used_bytes == 0


@pytest.mark.parametrize("where", ["update", "schedule"])
def test_a_scheduler_bug_fails_its_requests_and_the_engine_serves_on(where, monkeypatch):
    """An exception raised by the scheduler outside the forward pass (a bookkeeping bug) must not end the round
    loop: the round's requests (after a failed schedule, every queued and running one) get an internal error,
    their pages go back, and the next request is served."""
    engine, runner = make()
    sched = engine.scheduler
    real = getattr(sched, where)
    calls = {"n": 0}

    def broken(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyError("injected bookkeeping bug")
        return real(*a, **kw)
    monkeypatch.setattr(sched, where, broken)

    async def body(e):
        first = await drain(e.submit(req("a", list(range(2000, 2100)), max_tokens=4)))
        second = await drain(e.submit(req("b", list(range(3000, 3100)), max_tokens=2)))
        return first, second

    first, second = run(engine, body)
    assert isinstance(first[-1], ErrorEvent) and first[-1].code == "internal"
    assert "injected bookkeeping bug" in first[-1].message and where in first[-1].message
    assert isinstance(second[-1], DoneEvent) and second[-1].finish_reason is FinishReason.LENGTH
    assert [ev.token_id for ev in second if isinstance(ev, TokenEvent)] == [600, 601]
    assert engine.bookkeeping_failures == 1 and engine.cache.live_pages() == 0
    engine.cache.check_integrity()
