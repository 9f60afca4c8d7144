"""Retained states (ignisd/cache/retained.py, DESIGN §4.4): two-phase capture over the real PagePool / StateSlots,
ranking with an injected clock, slot exhaustion, the two-checkpoint conversation rule, pins, stamps, reset —
with the pool's integrity proven after every step."""
from __future__ import annotations

import pytest

from ignisd.cache.manager import CacheManager
from ignisd.cache.page_pool import IntegrityError, PagePool
from ignisd.cache.placement import Placement
from ignisd.cache.retained import RetainedStore
from ignisd.cache.retained_state import Stamp
from ignisd.cache.state_slots import StateSlots

STAMP = Stamp("abc123", "fp32")


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class World:
    """A pool, one live sequence holding pages for the whole prompt, and a store, owned by a cache manager (which
    drops the pages of every state the store lets go)."""

    def __init__(self, pages=64, device=0, host=2, needs_slot=True, ttl=300.0):
        self.clock = Clock()
        self.pool = PagePool(pages, 64)
        self.store = RetainedStore(STAMP, page_tokens=64,
                                   device_slots=StateSlots(device) if device is not None else None,
                                   host_slots=StateSlots(host), needs_slot=needs_slot, interactive_ttl=ttl,
                                   clock=self.clock)
        self.cache = CacheManager(self.pool, 1, retained=self.store)
        self.live: dict[str, list[int]] = {}

    def run(self, name: str, tokens: list[int]) -> list[int]:
        """A live sequence that prefilled `tokens` (its pages stay held until `end`)."""
        self.live[name] = self.pool.alloc(self.pool.pages_for(len(tokens) + 1))
        return self.live[name]

    def end(self, name: str) -> None:
        self.pool.release(self.live.pop(name))

    def capture(self, live: str, tokens, kind="checkpoint", priority="interactive", after_user=False, stamp=None,
                images=()):
        """What schedule() + runner + update() do: reserve, share full pages, copy the partial one, commit."""
        self.clock.t += 1
        t = self.store.reserve_capture(kind, tokens, images, priority=priority, after_user=after_user, stamp=stamp)
        if not t.ok:
            return t, None
        full = len(tokens) // 64
        pages = self.live[live][:full]
        self.pool.incref(pages)
        if len(tokens) % 64:
            pages = pages + self.pool.alloc(1)
        res = self.store.commit(t, pages)
        self.check()
        return t, res

    def check(self):
        self.pool.check_integrity(list(self.live.values()) + self.store.holders())
        self.store.check_integrity()

    def ids(self, kind=None):
        return sorted(s.id for s in self.store.states() if kind is None or s.kind == kind)


SYS = list(range(10_000, 10_130))                 # a 130-token system + tools block → retained prefix at 128


def test_capture_commit_lookup_and_integrity():
    w = World()
    prompt = SYS + list(range(500, 600))          # 230 tokens
    w.run("r1", prompt)
    t, res = w.capture("r1", prompt[:128], kind="prefix")
    assert t.ok and t.slot_tier == "host" and t.slot is not None
    s = res.state
    assert (s.kind, s.n_tokens, s.tier, s.priority, s.stamp) == ("prefix", 128, "device", "interactive", STAMP)
    assert s.pages == w.live["r1"][:2] and w.pool.refcount(s.pages[0]) == 2
    t, res = w.capture("r1", prompt[:227], after_user=True)
    c = res.state
    assert len(c.pages) == 4 and c.pages[:3] == w.live["r1"][:3] and c.pages[3] not in w.live["r1"]
    w.end("r1")
    w.check()
    assert w.pool.used == 4                        # 3 shared full pages (now retained only) + the copied tail
    # lookups: the next turn hits the checkpoint, a subagent with another task hits the prefix
    nxt = prompt[:227] + [1, 2, 3] + list(range(700, 760))
    hit = w.store.lookup(nxt, limit=len(nxt) - 1)
    assert (hit.state.id, hit.matched_tokens, hit.reason, hit.candidate) == (c.id, 227, None, None)
    assert hit.state.pins == 1
    assert w.store.drop(c.id) is False            # a pinned state is not freed: it is doomed
    assert c.doomed and c.id not in w.store.index and w.store.get(c.id)
    w.check()
    w.store.unpin(c.id)                           # the restore is done: the doomed state goes now
    assert c.id not in w.store
    w.check()
    sub = SYS + [42] * 90
    hit = w.store.lookup(sub, limit=len(sub) - 1)
    assert (hit.state.id, hit.matched_tokens) == (s.id, 128)
    w.store.unpin(s.id)
    with pytest.raises(IntegrityError):
        w.store.unpin(s.id)
    w.check()


def test_miss_and_best_candidate():
    w = World()
    p = SYS + list(range(500, 600))
    w.run("r", p)
    w.capture("r", p[:128], kind="prefix")
    _, res = w.capture("r", p[:200], after_user=True)
    edited = SYS + list(range(500, 520)) + [0] + list(range(521, 600))
    hit = w.store.lookup(edited)
    # the retained prefix still serves; the checkpoint diverges at 150 (the edited user message)
    assert (hit.matched_tokens, hit.state.kind) == (128, "prefix")
    assert (hit.candidate.state_id, hit.candidate.common_tokens, hit.candidate_state) == (res.state.id, 150,
                                                                                          res.state)
    w.store.unpin(hit.state.id)
    changed = [0] + SYS[1:] + list(range(500, 600))
    miss = w.store.lookup(changed)
    assert (miss.state, miss.matched_tokens, miss.reason) == (None, 0, "miss")
    assert miss.candidate.common_tokens == 0
    assert w.store.lookup(changed, explain=False).candidate is None
    w.check()


def test_slot_exhaustion_evicts_the_lowest_ranked_unpinned():
    w = World(host=2)
    a, b, c = (SYS + [i] * 100 for i in (1, 2, 3))
    for name, p in (("a", a), ("b", b), ("c", c)):
        w.run(name, p)
    _, ra = w.capture("a", a[:200], after_user=True)
    _, rb = w.capture("b", b[:200], after_user=True)
    t, rc = w.capture("c", c[:200], after_user=True)          # no free slot: a (least recently used) gives its up
    assert t.dropped == [ra.state.id] and w.ids() == sorted([rb.state.id, rc.state.id])
    # pinned states never give up their slot: with both pinned the capture is skipped
    w.store.pin(rb.state.id)
    w.store.pin(rc.state.id)
    t, res = w.capture("a", a[:210])
    assert (t.ok, t.refused, res) == (False, "no_slot", None)
    w.store.unpin(rc.state.id)
    # an agent capture never takes an interactive state's slot
    t, _ = w.capture("a", a[:220], priority="agent")
    assert t.refused == "no_slot" and w.ids() == sorted([rb.state.id, rc.state.id])
    w.store.unpin(rb.state.id)
    w.check()
    assert w.store.slots_free("host") == 0 and w.store.slots_free("device") == 0


def test_device_slots_first_then_host():
    w = World(device=1, host=1)
    p = SYS + [5] * 100
    w.run("r", p)
    t1, _ = w.capture("r", p[:128], kind="prefix")
    t2, _ = w.capture("r", p[:200], after_user=True)
    assert (t1.slot_tier, t2.slot_tier) == ("device", "host")
    assert w.store.slot_holders() == {"device": [t1.slot], "host": [t2.slot]}


def test_ranking_and_ttl_demotion():
    w = World(host=8, ttl=300.0)
    p, q = SYS + [5] * 200, SYS + [6] * 200
    w.run("r", p)
    w.run("q", q)
    _, inter_old = w.capture("q", q[:200], after_user=True)
    _, agent_new = w.capture("r", p[:140], priority="agent", after_user=True)
    s = w.store
    assert s.rank(inter_old.state) > s.rank(agent_new.state)   # interactive above agent, whatever the recency
    assert s.victim().id == agent_new.state.id
    # an interactive checkpoint idle in KV-RAM longer than the ttl ranks as agent (then by recency: it is older)
    s.get(inter_old.state.id).placement.tier = "ram"
    w.clock.t = inter_old.state.last_use + 300.0
    assert s.rank(inter_old.state)[1] == 1                    # not longer than the ttl yet
    w.clock.t += 0.5
    assert s.rank(inter_old.state)[1] == 0
    s.get(agent_new.state.id).last_use = inter_old.state.last_use + 1
    assert s.victim().id == inter_old.state.id
    # on the device, or as a retained prefix, no demotion
    s.get(inter_old.state.id).placement.tier = "device"
    assert s.rank(inter_old.state)[1] == 1
    _, pre = w.capture("r", p[:128], kind="prefix")
    s.get(pre.state.id).placement.tier = "ram"
    w.clock.t += 10_000
    assert s.rank(pre.state)[1] == 1
    assert s.rank(s.get(inter_old.state.id))[1] == 1
    with pytest.raises(ValueError):
        Placement("gpu")


def test_two_checkpoints_per_conversation_over_five_turns():
    """turn 1 user → C1; tool results → C2, C3; user → C4; tool result → C5. Ranked high: the latest and the one
    right after the last real user message; older ones of the same conversation are superseded — kept, ranked below
    every current state, so a fork or regeneration still resumes at them (DESIGN §4.4); others are untouched."""
    w = World(host=16)
    conv = SYS + [1] * 20                       # system block + first user message
    w.run("other", SYS + [9] * 90)
    w.capture("other", (SYS + [9] * 90)[:128], kind="prefix")
    _, other = w.capture("other", SYS + [9] * 80, after_user=True)   # another conversation: not a prefix
    turns = [(conv, True)]
    for seg, after_user in (([2] * 70, False), ([3] * 70, False), ([4] * 70, True), ([5] * 70, False)):
        turns.append((turns[-1][0] + seg, after_user))
    ids = []
    kept = []
    for k, (tokens, after_user) in enumerate(turns):
        w.run(f"t{k}", tokens)
        t, res = w.capture(f"t{k}", tokens, after_user=after_user)
        ids.append(res.state.id)
        w.end(f"t{k}")
        kept.append(sorted(s.id for s in w.store.states()
                           if s.kind == "checkpoint" and not s.superseded and s.id != other.state.id))
        w.check()
    c1, c2, c3, c4, c5 = ids
    assert kept == [[c1], sorted([c1, c2]), sorted([c1, c3]), [c4], sorted([c4, c5])]
    assert sorted(set(w.ids("checkpoint")) - {other.state.id}) == sorted(ids)      # nothing was dropped
    assert [w.store.get(c).superseded for c in ids] == [True, True, True, False, False]
    assert other.state.id in w.ids() and len(w.ids("prefix")) == 1 and not w.store.get(other.state.id).superseded
    # superseded checkpoints are the first to go when room is needed, the oldest first
    assert w.store.victim().id == c1
    assert w.cache.evict_for_pages(w.pool.total)[:3] == [c1, c2, c3]
    w.check()
    held = {p for h in w.store.holders() for p in h} | {p for h in w.live.values() for p in h}
    assert w.pool.used == len(held)


def test_fork_and_regeneration_resume_at_the_superseded_parent():
    """A retry, a regeneration or a second fork from one point all hit: committing a longer checkpoint of the
    conversation does not drop its parent (DESIGN §4.4: reuse copies and never consumes)."""
    w = World(host=8)
    turn2 = SYS + [1] * 100 + [2] * 80                        # the checkpoint after turn 2
    w.run("r", turn2 + [3] * 120)
    _, c2 = w.capture("r", turn2, after_user=False)
    _, c3 = w.capture("r", turn2 + [3] * 120, after_user=True)   # turn 3 (a user turn) sent once
    assert c3.superseded == [c2.state.id] and c2.state.id in w.store and c2.state.superseded
    fork = turn2 + [4] * 60                                   # a different turn 3 from the same turn 2
    hit = w.store.lookup(fork)
    assert (hit.state.id, hit.matched_tokens) == (c2.state.id, len(turn2))
    w.store.unpin(hit.state.id)
    regen = turn2 + [7]                                       # regenerate turn 2's reply
    hit = w.store.lookup(regen)
    assert (hit.state.id, hit.matched_tokens) == (c2.state.id, len(turn2))
    w.store.unpin(hit.state.id)
    w.check()


def test_conversation_rule_never_touches_a_pinned_parent():
    w = World(host=8)
    a = SYS + [1] * 100
    w.run("r", a + [2] * 100)
    _, c1 = w.capture("r", a[:200], after_user=False)
    hit = w.store.lookup(a + [2] * 50)
    assert hit.state is c1.state
    _, c2 = w.capture("r", (a + [2] * 100)[:260], after_user=True)
    assert c2.superseded == [c1.state.id] and not c1.state.doomed and c1.state.pins == 1
    w.check()
    w.store.unpin(c1.state.id)
    assert c1.state.id in w.store and w.store.victim().id == c1.state.id
    w.check()


def test_stamp_mismatch_is_refused_before_anything_moves():
    w = World(host=4)
    p = SYS + [7] * 100
    w.run("r", p)
    _, old = w.capture("r", p[:200], after_user=True, stamp=Stamp("other-model", "fp32"))
    res = w.store.lookup(p)
    assert (res.state, res.reason, res.matched_tokens) == (None, "stamp_mismatch", 0)
    assert old.state.pins == 0 and not w.store.stamp_ok(old.state)
    _, pre = w.capture("r", p[:128], kind="prefix")
    res = w.store.lookup(p)                       # a shorter state of the right stamp still serves
    assert (res.state.id, res.reason) == (pre.state.id, None)
    w.store.unpin(pre.state.id)
    assert Stamp("x", "bf16") != Stamp("x", "bf16", "eagle")


def test_duplicates_reset_abort_and_evict_for_pages():
    w = World(pages=16, host=4)
    p = SYS + [3] * 100
    w.run("r", p)
    _, pre = w.capture("r", p[:128], kind="prefix")
    t, res = w.capture("r", p[:128], kind="prefix")
    assert t.refused == "duplicate" and res is None
    assert pre.state.priority == "interactive"
    w.store.get(pre.state.id).priority = "agent"
    w.capture("r", p[:128], kind="prefix", priority="agent")
    assert pre.state.priority == "agent"           # an agent duplicate leaves the class alone...
    w.capture("r", p[:128], kind="prefix")
    assert pre.state.priority == "interactive"     # ...an interactive one promotes it
    # a duplicate that raced in between reserve and commit: the later one gives its pages and slot back
    t1 = w.store.reserve_capture("checkpoint", p[:200])
    t2 = w.store.reserve_capture("checkpoint", p[:200])
    assert t1.ok and t2.ok
    for t in (t1, t2):
        pages = w.live["r"][:3]
        w.pool.incref(pages)
        r = w.store.commit(t, pages + w.pool.alloc(1))
    assert r.duplicate and r.state.id == t1.id
    w.check()
    with pytest.raises(ValueError):
        w.store.commit(t2, [])
    t3 = w.store.reserve_capture("checkpoint", p[:210])
    assert w.store.slots_free("host") == 1
    w.store.abort(t3)
    w.store.abort(t3)
    assert w.store.slots_free("host") == 2
    t4 = w.store.reserve_capture("checkpoint", p[:210])
    with pytest.raises(ValueError):
        w.store.commit(t4, [1])                   # wrong page count
    w.store.abort(t4)
    w.end("r")
    w.check()
    # admission needs 14 free pages: retained states go first, lowest ranked first
    assert w.pool.free == 16 - 4                 # 3 shared full pages + the checkpoint's tail copy
    dropped = w.cache.evict_for_pages(14)
    assert dropped == [pre.state.id, t1.id] and w.pool.free == 16
    w.check()
    # reset drops everything; a pinned state is doomed and goes at its unpin
    w.run("r", p)
    _, a = w.capture("r", p[:128], kind="prefix")
    _, b = w.capture("r", p[:200])
    w.store.pin(b.state.id)
    assert w.store.reset() == 1
    assert w.store.lookup(p).state is None and len(w.store) == 1
    w.store.unpin(b.state.id)
    assert len(w.store) == 0
    w.check()


def test_all_attention_model_needs_no_slot():
    w = World(device=None, host=0, needs_slot=False)
    p = SYS + [1] * 100
    w.run("r", p)
    for n in (128, 150, 190, 200, 210):
        t, res = w.capture("r", p[:n], kind="prefix" if n == 128 else "checkpoint")
        assert t.ok and res.state.slot is None
    assert w.store.slot_holders() == {"host": []}
    w.check()


def test_status_rows_and_errors():
    w = World()
    p = SYS + [1] * 100
    w.run("r", p)
    _, res = w.capture("r", p[:200], priority="agent")
    w.clock.t += 5
    assert w.store.rows() == [{"kind": "checkpoint", "tier": "device", "tokens": 200, "priority": "agent",
                               "age_s": 5.0, "idle_s": 5.0, "holders": 0,
                               "image_slot": True}]                 # a hybrid World: the image is in a host slot
    assert w.store.pages_held() == 4
    with pytest.raises(ValueError):
        w.store.reserve_capture("snapshot", p)
    with pytest.raises(ValueError):
        w.store.reserve_capture("prefix", p, priority="batch")
    # a leaked slot (held by nobody the store knows) fails the integrity check
    w.store.slot_pools["host"].alloc("ghost")
    with pytest.raises(IntegrityError):
        w.store.check_integrity()


def test_lookup_leaves_a_token_to_prefill():
    w = World()
    p = SYS + [1] * 100
    w.run("r", p)
    _, res = w.capture("r", p[:200])
    assert w.store.lookup(p[:200]).reason == "miss"               # the whole prompt: nothing left to sample from
    hit = w.store.lookup(p[:200], limit=200)
    assert hit.matched_tokens == 200
    w.store.unpin(hit.state.id)
    hit = w.store.lookup(p[:201])
    assert hit.matched_tokens == 200 and hit.state.pins == 1
    w.store.unpin(hit.state.id)
    w.check()
