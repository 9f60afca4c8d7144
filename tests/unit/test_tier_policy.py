"""The tier policy on plain ints (ignisd/cache/tiers.py through the CacheManager, DESIGN §4.4-§4.5): no torch.

Real PagePool, StateSlots, RetainedStore, ExtentAllocator, Tiers and CacheManager; a "byte" here is only an
integer the accounting adds up. Every expected offset, page list and byte count below is worked out by hand from
the sizes the world is built with (page P = 1,000 bytes, arena aligned to P, a KV-disk file's header reserve H =
100 bytes), and the accounting is proven after every step (pages, slots, extents, disk bytes)."""
from __future__ import annotations

import pytest

from ignisd.cache.extents import ExtentAllocator
from ignisd.cache.manager import CacheManager
from ignisd.cache.page_pool import IntegrityError, PagePool
from ignisd.cache.retained import RetainedStore
from ignisd.cache.retained_state import Stamp
from ignisd.cache.state_slots import StateSlots
from ignisd.cache.tiers import Tiers, default_floor, TierCost
from ignisd.plan import TierMove

PT = 64
P = 1000                      # bytes of one KV page
H = 100                       # header reserve of one KV-disk file
STAMP = Stamp("h", "fp32")
IMAGE = (("recurrent", "float32", (4, 8), 128), ("conv", "bfloat16", (3, 4), 24))
IMG = 152                     # bytes of one hybrid image (128 + 24)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def toks(tag: int, n: int) -> list[int]:
    """`n` token ids of conversation `tag` (distinct conversations share no first token)."""
    return [tag * 1000 + i for i in range(n)]


class World:
    def __init__(self, pages=8, arena_pages=0, disk_bytes=0, hybrid=False, host_slots=16, floors=None):
        self.clock = Clock()
        self.pool = PagePool(pages, PT)
        self.store = RetainedStore(STAMP, page_tokens=PT, device_slots=StateSlots(0),
                                   host_slots=StateSlots(host_slots), needs_slot=hybrid, clock=self.clock)
        arena = ExtentAllocator(arena_pages * P, align=P) if arena_pages else None
        self.tiers = Tiers(arena, disk_bytes, P, IMAGE if hybrid else (), floors=floors or {"ram": 1, "disk": 1},
                           header_bytes=H, page_tokens=PT)
        self.cache = CacheManager(self.pool, P, retained=self.store, tiers=self.tiers)

    def retain(self, tokens, kind="checkpoint", priority="interactive", after_user=True):
        """What a finished request leaves behind: its pages (a sequence prefilled `tokens` and ended) retained."""
        self.clock.t += 1
        t = self.store.reserve_capture(kind, tokens, priority=priority, after_user=after_user)
        assert t.ok, t.refused
        need = self.pool.pages_for(len(tokens)) + (1 if len(tokens) % PT else 0)
        self.cache.evict_for_pages(need)            # as its admission did: room made by the tier policy
        live = self.pool.alloc(self.pool.pages_for(len(tokens)))
        full = len(tokens) // PT
        pages = live[:full]
        self.pool.incref(pages)
        if len(tokens) % PT:
            pages = pages + self.pool.alloc(1)
        s = self.store.commit(t, pages).state
        self.pool.release(live)
        self.check()
        return s

    def admit(self, sid, pages):
        """An unrelated request bound to `pages` pages (no reuse); None when it does not fit."""
        self.clock.t += 1
        return self.cache.admit(sid, toks(900 + len(sid), 5), pages * PT, reuse=False)

    def check(self):
        self.cache.check_integrity()

    def tier(self, s) -> str | None:
        return self.store.get(s.id).tier if s.id in self.store else None

    def write_done(self, s, nbytes=None):
        """The round produced the bytes of `s` and its KV-disk file was written (`nbytes` long)."""
        n = s.placement.disk_bytes - H if nbytes is None else nbytes
        assert self.cache.bytes_ready(s.id, b"\0" * n)
        assert self.cache.disk_written(s.id, n)
        self.check()


# ------------------------------------------------------------------ device → KV-RAM


def test_device_room_moves_the_lowest_ranked_state_to_ram():
    w = World(pages=8, arena_pages=4)
    a = w.retain(toks(1, 192))                      # 3 pages, oldest
    b = w.retain(toks(2, 192))                      # 3 pages
    a_pages = list(a.pages)
    assert w.pool.free == 2
    adm = w.admit("x", 4)                           # needs 4: 2 free, a (least recently used) makes room
    assert adm is not None and len(adm.pages) == 4
    moves = w.cache.plan_moves()
    assert moves == [TierMove("to_ram", a.id, pages=tuple(a_pages), dst_offset=0)]
    assert w.cache.plan_moves() == []               # taken once
    assert (a.tier, a.pages, a.placement.extents) == ("ram", [], [(0, 3 * P)])
    assert b.tier == "device"
    assert set(a_pages) <= set(adm.pages)           # the pages a gave up went to the new request
    assert all(w.pool.refcount(p) == 1 for p in adm.pages)
    assert w.tiers.arena.used_bytes == 3 * P and w.tiers.counts["demotions_ram"] == 1
    rows = {r["tier"]: r for r in w.cache.status()["tiers"]}
    assert rows["ram"] == {"tier": "ram", "bytes_total": 4 * P, "bytes_used": 3 * P, "states": 1}
    assert rows["device"]["states"] == 1 and "disk" not in rows
    w.check()
    w.cache.release("x")
    w.check()
    assert w.pool.free == 5


def test_ram_full_moves_the_lowest_ram_state_to_disk_before_placing_the_new_one():
    w = World(pages=6, arena_pages=2, disk_bytes=2 * P + H)
    a = w.retain(toks(1, 128))                      # 2 pages
    b = w.retain(toks(2, 128))                      # 2 pages
    a_pages = list(a.pages)
    w.admit("x", 4)                                 # a → RAM at 0
    assert w.cache.plan_moves() == [TierMove("to_ram", a.id, pages=tuple(a_pages), dst_offset=0)]
    assert (a.tier, a.placement.extents) == ("ram", [(0, 2 * P)])
    w.cache.release("x")
    b_pages = list(b.pages)
    w.admit("y", 6)                                 # b must leave: the arena is full of a, which goes to disk first
    moves = w.cache.plan_moves()
    key = w.cache.disk_record(a.id).key
    assert moves == [TierMove("to_bytes", a.id, src_offset=0, nbytes=2 * P),
                     TierMove("to_ram", b.id, pages=tuple(b_pages), dst_offset=0)]
    assert (b.tier, b.placement.extents) == ("ram", [(0, 2 * P)])
    p = a.placement
    assert (p.tier, p.disk_file, p.disk_bytes, p.in_flight, p.payload, p.extents) == ("disk", key, 2 * P + H, True,
                                                                                      None, [])
    assert w.tiers.disk_used == 2 * P + H and w.tiers.counts["demotions_disk"] == 1
    w.check()
    # in flight: it cannot be moved or dropped for room, but it can be restored once its bytes are in memory
    assert w.store.victim(tier="disk") is None
    w.write_done(a, 2 * P + 40)                     # the file came out 40 bytes of header long
    assert (a.placement.in_flight, a.placement.payload, a.placement.disk_bytes) == (False, None, 2 * P + 40)
    assert w.tiers.disk_used == 2 * P + 40
    w.check()


def test_disk_full_drops_the_lowest_disk_state():
    w = World(pages=6, arena_pages=2, disk_bytes=2 * P + H)
    a = w.retain(toks(1, 128))
    b = w.retain(toks(2, 128))
    w.admit("x", 4)                                 # a → RAM
    w.cache.release("x")
    w.admit("y", 6)                                 # a → disk, b → RAM
    w.cache.release("y")
    w.write_done(a)
    key_a = a.placement.disk_file
    c = w.retain(toks(3, 128))
    c_pages = list(c.pages)
    w.cache.plan_moves()
    w.admit("z", 6)                                 # c → RAM: b → disk: the disk is full of a, which is dropped
    moves = w.cache.plan_moves()
    assert moves == [TierMove("to_bytes", b.id, src_offset=0, nbytes=2 * P),
                     TierMove("to_ram", c.id, pages=tuple(c_pages), dst_offset=0)]
    assert a.id not in w.store and w.tier(b) == "disk" and w.tier(c) == "ram"
    assert w.cache.take_disk_deletes() == [key_a] and w.cache.take_disk_deletes() == []
    assert w.tiers.counts["dropped"] == 1 and w.tiers.disk_used == 2 * P + H
    w.check()


def test_disk_full_of_in_flight_writes_drops_the_state_being_demoted():
    w = World(pages=6, arena_pages=2, disk_bytes=2 * P + H)
    a = w.retain(toks(1, 128))
    b = w.retain(toks(2, 128))
    w.admit("x", 4)
    w.cache.release("x")
    w.admit("y", 6)                                 # a → disk (still being written), b → RAM
    w.cache.release("y")
    c = w.retain(toks(3, 128))
    w.cache.plan_moves()
    w.admit("z", 6)                                 # c → RAM; b cannot go to disk (a in flight fills it): dropped
    moves = w.cache.plan_moves()
    assert [(m.op, m.state_id) for m in moves] == [("to_ram", c.id)]
    assert w.tier(a) == "disk" and b.id not in w.store and w.tier(c) == "ram"
    assert w.cache.take_disk_deletes() == []        # b had no file
    w.check()


def test_no_arena_and_no_disk_drop_as_before():
    w = World(pages=6)
    a = w.retain(toks(1, 128))
    b = w.retain(toks(2, 128))
    adm = w.admit("x", 4)
    assert adm is not None
    assert w.cache.plan_moves() == [] and a.id not in w.store and w.tier(b) == "device"
    assert w.tiers.counts == {"demotions_ram": 0, "demotions_disk": 0, "dropped": 1, "disk_errors": 0}
    assert [r["tier"] for r in w.cache.status()["tiers"]] == ["device"]
    w.check()


def test_no_arena_goes_straight_to_disk_and_a_state_larger_than_the_arena_skips_it():
    w = World(pages=8, disk_bytes=10 * P)
    a = w.retain(toks(1, 130))                      # 3 pages (2 shared + a private partial copy)
    a_pages = list(a.pages)
    w.admit("x", 8)
    assert w.cache.plan_moves() == [TierMove("to_bytes", a.id, pages=tuple(a_pages))]
    assert a.placement.disk_bytes == 3 * P + H
    w.cache.release("x")
    w.check()
    w2 = World(pages=8, arena_pages=2, disk_bytes=10 * P)
    big = w2.retain(toks(2, 192))                   # 3 pages > a 2-page arena
    small = w2.retain(toks(3, 64))
    big_pages = list(big.pages)
    w2.clock.t += 1
    w2.store.touch(small.id)
    w2.admit("x", 5)                                # 3 pages short: big (lowest) goes, past the arena, to disk
    assert w2.cache.plan_moves() == [TierMove("to_bytes", big.id, pages=tuple(big_pages))]
    assert w2.tier(small) == "device" and w2.tiers.arena.used_bytes == 0
    w2.check()


def test_pinned_states_never_move():
    w = World(pages=6, arena_pages=4)
    a = w.retain(toks(1, 128))
    b = w.retain(toks(2, 128))
    hit = w.store.lookup(toks(1, 128) + [5])        # a is being restored by someone: pinned
    assert hit.state is a and a.pins == 1
    w.admit("x", 4)
    assert [(m.op, m.state_id) for m in w.cache.plan_moves()] == [("to_ram", b.id)]
    assert w.tier(a) == "device"
    w.cache.release("x")
    w.store.pin(b.id)
    assert w.admit("y", 6) is None                  # a pinned, b pinned in RAM: nothing can give pages
    assert w.cache.plan_moves() == [] and w.tier(a) == "device" and w.pool.free == 4
    w.store.unpin(a.id)
    w.store.unpin(b.id)
    w.check()


def test_superseded_checkpoints_go_first():
    w = World(pages=10, arena_pages=10)
    other = w.retain(toks(5, 128))                  # the oldest of all, current
    c1 = w.retain(toks(1, 128), after_user=False)
    c2 = w.retain(toks(1, 192), after_user=False)   # the same conversation: c1 is superseded
    assert c1.superseded and not c2.superseded and not other.superseded
    assert w.pool.free == 10 - 2 - 2 - 3
    w.admit("x", 5)                                 # 2 pages short: c1 goes although `other` is older
    assert [m.state_id for m in w.cache.plan_moves()] == [c1.id]
    w.cache.release("x")
    w.admit("y", 7)                                 # 2 more: the next lowest is `other` (current, oldest)
    assert [m.state_id for m in w.cache.plan_moves()] == [other.id]
    assert w.tier(c2) == "device"
    w.check()


def test_the_newest_checkpoint_of_a_conversation_is_the_last_of_it_to_go():
    w = World(pages=16, arena_pages=3, disk_bytes=3 * (4 * P + H))
    c1 = w.retain(toks(1, 128), after_user=True)    # after the user message: kept ranked high
    c2 = w.retain(toks(1, 192), after_user=False)   # tool result
    c3 = w.retain(toks(1, 256), after_user=False)   # tool result: c2 superseded, c1 kept, c3 newest
    assert (c1.superseded, c2.superseded, c3.superseded) == (False, True, False)
    gone = []
    for k in range(12):                             # other traffic until the conversation has left the device
        w.retain(toks(10 + k, 128))
        w.cache.plan_moves()
        for s in (c1, c2, c3):
            if s.id not in gone and w.tier(s) != "device":
                gone.append(s.id)
        w.check()
    assert gone == [c2.id, c1.id, c3.id]


# ------------------------------------------------------------------ restore floors


def two_tier_world(floors):
    """A device prefix and a KV-RAM checkpoint of one conversation (the checkpoint moved there by traffic)."""
    w = World(pages=8, arena_pages=6, disk_bytes=20 * P, floors=floors)
    conv = toks(1, 400)
    ck = w.retain(conv[:192], after_user=True)
    w.admit("x", 8)                                 # ck → RAM
    w.cache.release("x")
    w.cache.plan_moves()
    assert w.tier(ck) == "ram"
    return w, conv, ck


def test_equal_matches_in_two_tiers_restore_from_the_upper_one():
    w, conv, ck = two_tier_world({"ram": 1, "disk": 1})
    pre = w.retain(conv[:192], kind="prefix")       # the same tokens, on the device
    adm = w.cache.admit("r", conv[:300], 320, reuse=True)
    assert (adm.match.state_id, adm.match.tier, adm.resumed) == (pre.id, "device", 192)
    assert adm.restore.tier == "device" and adm.pages[:3] == tuple(pre.pages)
    w.cache.release("r")
    w.check()


def test_a_lower_tier_needs_at_least_floor_more_tokens():
    for floor, want in ((64, "ram"), (65, "device")):
        w, conv, ck = two_tier_world({"ram": floor, "disk": 1})
        pre = w.retain(conv[:128], kind="prefix")   # 192 - 128 = 64 more tokens in KV-RAM
        lk = w.store.lookup(conv[:300], floors=w.tiers.floors)
        assert (lk.state.tier, lk.matched_tokens) == (want, 192 if want == "ram" else 128), floor
        w.store.unpin(lk.state.id)
        adm = w.cache.admit("r", conv[:300], 320, reuse=True)
        assert adm.match.tier == want and adm.restore.tier == want
        if want == "ram":
            assert (adm.restore.src_offset, adm.restore.dst_pages) == (0, adm.pages[:3])
            assert adm.restore.slot is None and not adm.restore.image_after_pages
            assert ck.pins == 1                     # pinned until the round finishes
        else:
            assert adm.match.state_id == pre.id
        w.cache.release("r")
        assert ck.pins == 0
        w.check()


def disk_world(floor_disk):
    w = World(pages=6, disk_bytes=20 * P, floors={"ram": 1, "disk": floor_disk})
    conv = toks(1, 400)
    ck = w.retain(conv[:130], after_user=True)
    w.admit("x", 6)                                 # ck → disk (no arena)
    w.cache.release("x")
    w.cache.plan_moves()
    assert w.tier(ck) == "disk"
    w.write_done(ck)
    return w, conv, ck


def test_a_disk_match_below_the_floor_with_nothing_above_is_ignored():
    w, conv, ck = disk_world(131)
    lk = w.store.lookup(conv[:300], floors=w.tiers.floors)
    assert (lk.state, lk.matched_tokens, lk.reason) == (None, 0, "miss")
    adm = w.cache.admit("r", conv[:300], 320, reuse=True)
    assert adm.wait_for is None and adm.restore is None and adm.resumed == 0
    assert (adm.match.state_id, adm.match.reason) == (None, "miss")
    assert w.cache.loads_wanted() == [] and ck.pins == 0
    w.cache.release("r")
    w.check()


def test_a_disk_match_at_the_floor_is_read_back_then_restored():
    w, conv, ck = disk_world(130)
    adm = w.cache.admit("r", conv[:300], 320, reuse=True)
    assert (adm.wait_for, adm.pages, adm.slot, adm.restore) == (ck.id, (), None, None)
    assert adm.match.tier == "disk" and ck.pins == 0          # nothing held while the file is read
    assert w.cache.loads_wanted() == [ck.id]
    w.check()
    payload = bytes(range(256)) * 12
    assert w.cache.bytes_ready(ck.id, payload)                 # the file was read back and verified
    assert w.cache.loads_wanted() == []
    adm = w.cache.admit("r", conv[:300], 320, reuse=True)
    rs = adm.restore
    assert (adm.resumed, rs.tier, rs.payload, rs.dst_pages, rs.image_after_pages) == (130, "disk", payload,
                                                                                     adm.pages[:3], False)
    assert ck.pins == 1
    w.cache.release("r")
    w.check()


# ------------------------------------------------------------------ hybrid: images travel with the bytes


def test_hybrid_images_stay_in_their_slot_in_ram_and_travel_with_the_pages_to_disk():
    w = World(pages=6, arena_pages=2, disk_bytes=20 * P, hybrid=True, host_slots=3)
    a = w.retain(toks(1, 128))
    b = w.retain(toks(2, 128))
    a_slot, a_pages = a.slot, list(a.pages)
    w.admit("x", 4)                                 # a → RAM: pages only, the image stays in its retained slot
    assert w.cache.plan_moves() == [TierMove("to_ram", a.id, pages=tuple(a_pages), dst_offset=0)]
    assert (a.tier, a.slot, a.placement.extents) == ("ram", a_slot, [(0, 2 * P)])
    w.cache.release("x")
    w.check()
    b_pages = list(b.pages)
    w.admit("y", 6)                                 # b → RAM, a → disk with its image; a's slot is given back
    moves = w.cache.plan_moves()
    assert moves[0] == TierMove("to_bytes", a.id, src_offset=0, nbytes=2 * P, image_slot=("host", a_slot))
    assert moves[1] == TierMove("to_ram", b.id, pages=tuple(b_pages), dst_offset=0)
    assert (a.tier, a.slot, a.placement.disk_bytes) == ("disk", None, 2 * P + IMG + H)
    assert w.store.slots_free("host") == 3 - 1
    rec = w.cache.disk_record(a.id)
    assert rec.image_layout == IMAGE and rec.n_pages == 2 and rec.page_bytes == P
    w.cache.release("y")
    w.check()
    # the restore of a hybrid disk state takes its image from the bytes after the pages
    assert w.cache.bytes_ready(a.id, b"\1" * (2 * P + IMG))
    adm = w.cache.admit("r", toks(1, 200), 256, reuse=True)
    assert adm.restore.tier == "disk" and adm.restore.image_after_pages and adm.restore.slot is None
    w.cache.release("r")
    w.check()


def test_hybrid_slot_exhaustion_moves_the_victim_down_instead_of_dropping_it():
    w = World(pages=16, disk_bytes=20 * P, hybrid=True, host_slots=2)
    a = w.retain(toks(1, 128))
    w.retain(toks(2, 128))
    a_pages, a_slot = list(a.pages), a.slot
    c = w.retain(toks(3, 128))                      # no free slot: a (lowest) moves to disk with its image
    assert w.tier(a) == "disk" and c.slot == a_slot
    assert w.cache.plan_moves() == [TierMove("to_bytes", a.id, pages=tuple(a_pages), image_slot=("host", a_slot))]
    w.check()
    # with KV-disk off the victim is dropped as before
    w2 = World(pages=16, hybrid=True, host_slots=1)
    x = w2.retain(toks(1, 128))
    w2.retain(toks(2, 128))
    assert x.id not in w2.store and w2.cache.plan_moves() == []
    w2.check()


def test_slot_pressure_moves_a_device_state_into_ram_with_its_image_then_to_disk():
    """A state that is mostly image (hq-e8-2b: a few encoded pages and the exact window) leaves the device by slot
    pressure: into KV-RAM with its image after its pages in one extent (its slot given back), restored from there,
    and from there to KV-disk with the same bytes."""
    w = World(pages=16, arena_pages=4, disk_bytes=20 * P, hybrid=True, host_slots=2)
    a = w.retain(toks(1, 128))                      # 2 pages each
    b = w.retain(toks(2, 128))
    a_pages, a_slot = tuple(a.pages), a.slot
    c = w.retain(toks(3, 128))                      # no free slot: a (lowest) → RAM, 2P + IMG = 2,152 bytes at 0
    assert w.cache.plan_moves() == [TierMove("to_ram", a.id, pages=a_pages, image_slot=("host", a_slot),
                                             dst_offset=0)]
    assert (a.tier, a.slot, a.placement.extents, a.placement.image_in_extent) == ("ram", None, [(0, 2152)], True)
    assert c.slot == a_slot and w.pool.free == 16 - 4
    assert w.tiers.arena.size_of(0) == 3 * P        # aligned to P
    b_pages, b_slot = tuple(b.pages), b.slot
    w.retain(toks(4, 128))                          # b → RAM the same way; a makes room: → disk from its extent
    moves = w.cache.plan_moves()
    assert moves == [TierMove("to_bytes", a.id, src_offset=0, nbytes=2152),
                     TierMove("to_ram", b.id, pages=b_pages, image_slot=("host", b_slot), dst_offset=0)]
    assert (a.tier, a.slot, a.placement.disk_bytes) == ("disk", None, 2 * P + IMG + H)
    rec = w.cache.disk_record(a.id)
    assert rec.image_layout == IMAGE and rec.n_pages == 2
    # the restore of b takes its pages from the extent and its image from the bytes after them
    adm = w.cache.admit("r", toks(2, 200), 256, reuse=True)
    rs = adm.restore
    assert (rs.tier, rs.src_offset, rs.slot, rs.image_after_pages, len(rs.dst_pages)) == ("ram", 0, None, True, 2)
    w.cache.release("r")
    w.check()
    flush = {m.state_id: m for m in w.cache.plan_flush()}          # b, and the two on the device (c, d)
    assert len(flush) == 3 and flush[b.id] == TierMove("to_bytes", b.id, src_offset=0, nbytes=2152)

def test_a_hybrid_state_never_goes_to_disk_without_an_image_layout():
    w = World(pages=6, disk_bytes=20 * P, hybrid=True)
    w.tiers.image_layout, w.tiers.image_bytes = (), 0          # a misbuilt tier: the image could not be written
    a = w.retain(toks(1, 128))
    w.admit("x", 6)
    assert a.id not in w.store and w.cache.plan_moves() == []  # dropped, never half-saved
    w.check()


# ------------------------------------------------------------------ shutdown flush, integrity, floors' cost model


def test_plan_flush_orders_by_rank_and_respects_the_ceiling():
    w = World(pages=16, arena_pages=4, disk_bytes=(3 * P + H) + (2 * P + H) + (1 * P + H) + 50)
    low = w.retain(toks(1, 64), priority="agent")                # 1 page, agent: lowest
    ram = w.retain(toks(2, 128))                                 # 2 pages, will be moved to RAM
    big = w.retain(toks(3, 192))                                 # 3 pages
    top = w.retain(toks(4, 128))                                 # 2 pages, the most recent
    w.cache.plan_moves()
    w.clock.t += 1
    w.store.touch(big.id)
    w.store.touch(low.id)                                        # recency does not lift an agent state
    # device pressure with every other state pinned: only `ram` (2 pages) can give way, into the arena
    for s in (low, big, top):
        w.store.pin(s.id)
    w.admit("x", 16 - 8 + 2)                                     # 8 pages retained: 2 short
    w.cache.release("x")
    for s in (low, big, top):
        w.store.unpin(s.id)
    w.cache.plan_moves()
    assert w.tier(ram) == "ram"
    moves = w.cache.plan_flush()
    # rank: big (touched last) > top > ram > low (agent). Budget: 3P+H, 2P+H, 1P+H (+50): big and top fit, ram's
    # 2P+H does not after them, low's 1P+H does.
    assert [m.state_id for m in moves] == [big.id, top.id, low.id]
    assert moves[0] == TierMove("to_bytes", big.id, pages=tuple(big.pages))
    assert all(w.tier(s) in ("device", "ram") for s in (low, ram, big, top))   # nothing moves: the process ends
    w.tiers.disk_capacity = 100 * P
    moves = w.cache.plan_flush()
    assert [m.state_id for m in moves] == [big.id, top.id, ram.id, low.id]
    assert moves[2] == TierMove("to_bytes", ram.id, src_offset=ram.placement.extents[0][0], nbytes=2 * P)
    w.check()


def test_plan_flush_skips_what_is_on_disk_and_needs_kv_disk():
    w = World(pages=6, disk_bytes=20 * P)
    a = w.retain(toks(1, 128))
    b = w.retain(toks(2, 128))
    w.admit("x", 4)                                              # a → disk
    w.cache.release("x")
    w.cache.plan_moves()
    assert [m.state_id for m in w.cache.plan_flush()] == [b.id]
    assert World(pages=6, arena_pages=4).cache.plan_flush() == []
    assert w.tier(a) == "disk"


def test_check_integrity_catches_a_leaked_extent_and_a_disk_miscount():
    w = World(pages=6, arena_pages=4, disk_bytes=20 * P)
    w.retain(toks(1, 128))
    w.retain(toks(2, 128))
    w.admit("x", 4)
    w.cache.release("x")
    w.check()
    leaked = w.tiers.arena.alloc(P)                             # an extent no state holds
    with pytest.raises(IntegrityError):
        w.check()
    w.tiers.arena.free(leaked)
    w.check()
    w.tiers.disk_used += 1
    with pytest.raises(IntegrityError):
        w.check()
    w.tiers.disk_used -= 1
    w.check()


def test_dropping_states_in_every_tier_gives_everything_back():
    w = World(pages=6, arena_pages=2, disk_bytes=20 * P)
    a = w.retain(toks(1, 128))
    b = w.retain(toks(2, 128))
    w.admit("x", 4)
    w.cache.release("x")
    w.admit("y", 6)                                             # a → disk, b → RAM
    w.cache.release("y")
    w.cache.plan_moves()
    w.write_done(a)
    key = a.placement.disk_file
    c = w.retain(toks(3, 128))
    assert {w.tier(s) for s in (a, b, c)} == {"disk", "ram", "device"}
    assert w.cache.reset() == 3
    assert len(w.store) == 0 and w.pool.free == 6 and w.tiers.arena.used_bytes == 0 and w.tiers.disk_used == 0
    assert w.cache.take_disk_deletes() == [key]
    w.check()


def test_failed_round_drops_the_states_its_moves_were_copying():
    from ignisd.plan import RoundPlan
    w = World(pages=6, arena_pages=2, disk_bytes=20 * P)
    a = w.retain(toks(1, 128))
    w.retain(toks(2, 128))
    w.admit("x", 4)
    moves = w.cache.plan_moves()
    w.cache.finish_round(RoundPlan((), (), tuple(moves)), failed=True)
    assert a.id not in w.store and w.tiers.arena.used_bytes == 0
    w.cache.release("x")
    w.check()


def test_default_floor_cost_model():
    # 1,000 tok/s prefill, 100 bytes a token: 1,024 tokens at 1 MB/s take 0.1024 s + 0.01 s latency → 113 tokens
    assert default_floor(1000.0, 100, TierCost(0.01, 1e6)) == 113
    assert default_floor(1000.0, 100, TierCost(0.0, 1e12)) == 1                 # never below 1
    assert default_floor(10.0, 1, TierCost(0.0, 0.0)) == 10 * 1024              # bandwidth clamped to 1 B/s → huge


# ---------------------------------------------- rank is respected across tiers (regression tests of fixed bugs)


def test_demoting_never_drops_a_higher_ranked_disk_state():
    """The newest checkpoint of a conversation, too big for the arena, went to KV-disk first; its superseded parent
    leaving KV-RAM later must not push it out of a full KV-disk (the parent goes instead)."""
    w = World(pages=8, arena_pages=3, disk_bytes=4 * P + H)
    c1 = w.retain(toks(1, 128), after_user=False)   # 2 pages
    w.admit("x", 8)                                 # c1 → RAM (the conversation's only checkpoint so far)
    w.cache.release("x")
    w.cache.plan_moves()
    c2 = w.retain(toks(1, 256), after_user=False)   # the next turn: 4 pages > the arena; c1 is now superseded
    assert c1.superseded and not c2.superseded
    w.admit("y", 8)                                 # c2 → disk (too big for the arena)
    w.cache.release("y")
    w.cache.plan_moves()
    assert w.tier(c2) == "disk"
    w.write_done(c2)
    o = w.retain(toks(2, 192))                      # other traffic: 3 pages into RAM evicts c1 from the arena
    w.admit("z", 8)
    w.cache.release("z")
    assert w.tier(o) == "ram"
    # c1 ranks below c2 (superseded): c1 must be the one that goes, c2 must stay
    assert w.tier(c2) == "disk", "the newest checkpoint was dropped"
    assert c1.id not in w.store
    w.check()


def test_demoting_never_drops_a_higher_ranked_ram_state():
    """With KV-disk off, a superseded agent checkpoint leaving the device must not drop a current interactive one
    from a full arena to take its place (it is dropped itself)."""
    w = World(pages=8, arena_pages=2)
    fresh = w.retain(toks(1, 128))                  # interactive, current
    w.admit("x", 8)                                 # fresh → RAM
    w.cache.release("x")
    w.cache.plan_moves()
    c1 = w.retain(toks(2, 128), after_user=False, priority="agent")
    w.retain(toks(2, 192), after_user=False, priority="agent")   # c1 superseded: the lowest rank of all
    w.clock.t += 1
    w.store.touch(fresh.id)
    assert w.store.rank(c1) < w.store.rank(fresh)
    w.admit("y", 5)                                 # c1 leaves the device: it must not push `fresh` out
    assert fresh.id in w.store, "a higher-ranked KV-RAM state was dropped for a superseded agent checkpoint"
    assert w.tier(fresh) == "ram" and c1.id not in w.store
    w.check()


def test_a_disk_payload_is_let_go_once_its_restore_ran():
    from ignisd.plan import RoundPlan
    w, conv, ck = disk_world(1)
    assert w.cache.admit("r", conv[:300], 320, reuse=True).wait_for == ck.id
    assert w.cache.bytes_ready(ck.id, b"\7" * (3 * P))           # read back and verified
    adm = w.cache.admit("r", conv[:300], 320, reuse=True)
    w.cache.finish_round(RoundPlan((), (adm.restore,), ()))       # the round that restored it ran
    w.cache.release("r")
    w.check()
    assert ck.placement.payload is None, "a state-sized payload is still held after its restore"
