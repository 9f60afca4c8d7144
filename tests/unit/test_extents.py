"""ExtentAllocator (ignisd/cache/extents.py, DESIGN §4.5): first fit, alignment, coalescing, fits / largest_free,
integrity failures, and a randomized alloc/free run checked against a byte-per-unit occupancy model."""
from __future__ import annotations

import random

import pytest

from ignisd.cache.extents import ExtentAllocator
from ignisd.cache.page_pool import IntegrityError


def free_pieces(a: ExtentAllocator) -> list[tuple[int, int]]:
    """The allocator's free list (a read-only look at its private state; the tests compare it with models)."""
    return list(a._free)


def test_sizes_are_rounded_to_the_alignment_and_the_total_is_truncated():
    a = ExtentAllocator(10_000, align=4096)
    assert a.total_bytes == 8192                       # 10,000 truncated down to two aligned units
    assert a.rounded(0) == 4096 and a.rounded(1) == 4096 and a.rounded(4096) == 4096 and a.rounded(4097) == 8192
    assert a.free_bytes == 8192 and a.used_bytes == 0 and a.largest_free() == 8192
    assert ExtentAllocator(4095, align=4096).total_bytes == 0
    empty = ExtentAllocator(0, align=16)
    assert (empty.alloc(1), empty.largest_free(), empty.fits(1)) == (None, 0, False)
    empty.check_integrity([])
    with pytest.raises(ValueError):
        ExtentAllocator(-1)
    with pytest.raises(ValueError):
        ExtentAllocator(100, align=0)


def test_first_fit_and_alignment():
    a = ExtentAllocator(100, align=10)
    assert a.alloc(1) == 0                    # takes 10
    assert a.alloc(11) == 10                  # takes 20: [10, 30)
    assert a.alloc(10) == 30                  # [30, 40)
    assert a.size_of(0) == 10 and a.size_of(10) == 20 and a.size_of(30) == 10
    assert a.used_bytes == 40 and a.free_bytes == 60
    a.free(10)                                # hole of 20 at 10, tail of 60 at 40
    assert a.alloc(5) == 10                   # first fit: the hole, not the tail
    assert a.alloc(10) == 20                  # the rest of the hole
    assert a.alloc(15) == 40                  # hole full: the tail
    for off in (0, 10, 20, 30, 40):
        assert off % 10 == 0
    a.check_integrity([0, 10, 20, 30, 40])
    # nothing fits: None, and nothing was taken
    before = (a.used_bytes, free_pieces(a))
    assert a.alloc(41) is None
    assert (a.used_bytes, free_pieces(a)) == before


def test_first_fit_prefers_the_lowest_hole_even_when_a_later_one_fits_exactly():
    a = ExtentAllocator(80, align=10)
    offs = [a.alloc(10) for _ in range(8)]
    assert offs == [0, 10, 20, 30, 40, 50, 60, 70]
    a.free(10)
    a.free(20)                                # hole of 20 at 10
    a.free(50)                                # hole of 10 at 50
    assert a.alloc(10) == 10                  # first fit, not best fit
    assert a.alloc(10) == 20
    assert a.alloc(10) == 50


def test_coalescing_with_both_neighbours():
    a = ExtentAllocator(50, align=10)
    offs = [a.alloc(10) for _ in range(5)]
    a.free(offs[1])
    a.free(offs[3])
    assert free_pieces(a) == [(10, 10), (30, 10)] and a.largest_free() == 10
    assert not a.fits(11) and a.fits(10)
    a.free(offs[2])                           # joins left and right: one piece of 30
    assert free_pieces(a) == [(10, 30)] and a.largest_free() == 30 and a.fits(30) and not a.fits(31)
    a.free(offs[0])
    a.free(offs[4])
    assert free_pieces(a) == [(0, 50)]
    assert a.alloc(50) == 0 and a.largest_free() == 0 and a.free_bytes == 0
    a.check_integrity([0])


def test_fits_and_largest_free_under_fragmentation():
    a = ExtentAllocator(100, align=10)
    offs = [a.alloc(10) for _ in range(10)]
    for off in offs[::2]:
        a.free(off)
    assert a.free_bytes == 50                 # half free …
    assert a.largest_free() == 10             # … but in pieces of 10
    assert a.fits(10) and not a.fits(11) and a.alloc(20) is None


def test_integrity_failures():
    a = ExtentAllocator(100, align=10)
    x, y = a.alloc(10), a.alloc(30)
    a.check_integrity([x, y])
    a.free(x)
    with pytest.raises(IntegrityError):       # double free
        a.free(x)
    with pytest.raises(IntegrityError):       # a free in the middle of an extent
        a.free(y + 10)
    with pytest.raises(IntegrityError):       # two holders of one extent
        a.check_integrity([y, y])
    with pytest.raises(IntegrityError):       # a holder of an extent that was freed (a leak the other way round)
        a.check_integrity([x, y])
    with pytest.raises(IntegrityError):       # an extent nobody holds: leaked
        a.check_integrity([])
    with pytest.raises(IntegrityError):       # a holder list naming an offset inside an extent (overlap)
        a.check_integrity([y + 10])
    a.check_integrity([y])


def test_forged_overlapping_extents_are_caught():
    """A corrupted allocator (two extents overlapping, or a gap) must fail the tiling check even when the holder
    list agrees with the held table."""
    a = ExtentAllocator(100, align=10)
    p, q = a.alloc(20), a.alloc(20)
    a._held[p] = 30                           # forged: [0, 30) overlaps [20, 40)
    with pytest.raises(IntegrityError):
        a.check_integrity([p, q])
    a._held[p] = 10                           # forged: [10, 20) is neither free nor held
    with pytest.raises(IntegrityError):
        a.check_integrity([p, q])
    a._held[p] = 20
    a.check_integrity([p, q])
    a._free.append((95, 10))                  # forged: a free piece past the end
    with pytest.raises(IntegrityError):
        a.check_integrity([p, q])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_random_alloc_free_against_an_occupancy_model(seed):
    rng = random.Random(seed)
    align, units = 8, 64
    a = ExtentAllocator(align * units + 5, align=align)       # the 5 stray bytes are cut off
    assert a.total_bytes == align * units
    occ = bytearray(units)                                   # 1 = that aligned unit is held
    held: dict[int, int] = {}                                # offset -> units

    def model_first_fit(n: int) -> int | None:
        run = 0
        for u in range(units):
            run = run + 1 if not occ[u] else 0
            if run == n:
                return (u - n + 1) * align
        return None

    def model_largest() -> int:
        best = run = 0
        for u in range(units):
            run = run + 1 if not occ[u] else 0
            best = max(best, run)
        return best * align

    for step in range(600):
        if held and (rng.random() < 0.45 or not model_largest()):
            off = rng.choice(sorted(held))
            a.free(off)
            n = held.pop(off)
            occ[off // align:off // align + n] = bytes(n)
        else:
            nbytes = rng.randint(1, align * 12)
            n = -(-nbytes // align)
            want = model_first_fit(n)
            assert a.fits(nbytes) == (want is not None), step
            got = a.alloc(nbytes)
            assert got == want, (step, nbytes, got, want)
            if got is not None:
                assert got % align == 0 and a.size_of(got) == n * align
                assert not any(occ[got // align:got // align + n])
                occ[got // align:got // align + n] = b"\x01" * n
                held[got] = n
        assert a.used_bytes == sum(occ) * align
        assert a.free_bytes == (units - sum(occ)) * align
        assert a.largest_free() == model_largest()
        # the free list is the complement of the held extents, in maximal (coalesced) runs
        runs, u = [], 0
        while u < units:
            if occ[u]:
                u += 1
                continue
            v = u
            while v < units and not occ[v]:
                v += 1
            runs.append((u * align, (v - u) * align))
            u = v
        assert free_pieces(a) == runs, step
        a.check_integrity(list(held))
    for off in list(held):
        a.free(off)
    assert free_pieces(a) == [(0, align * units)]
    a.check_integrity([])
