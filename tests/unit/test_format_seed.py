"""The research flag --format-seed of tools/bench_kvformat.py: parsing, and that hq-e8-2b's sign vectors follow the
seed inside kvformat_eval.format_seed and return to the format's after (HQ_E8_2B.md §2.1)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from kvformat_eval import format_seed, parse_format_seed  # noqa: E402

from ignis_kernels import hq_seed  # noqa: E402
from ignis_kernels.kvq import rotation  # noqa: E402
from ignisd.cache.kv_format import get_kv_format  # noqa: E402

M64 = (1 << 64) - 1


def _spec_signs(seed: int, layer: int, head: int, kind: int, d: int) -> list[float]:
    """§2.1 written out again: splitmix64 from seed XOR ((ℓ << 16) | (h << 8) | κ); −1 where bit 63 is set."""
    s, out = (seed ^ ((layer << 16) | (head << 8) | kind)) & M64, []
    for _ in range(d):
        s = (s + 0x9E3779B97F4A7C15) & M64
        z = ((s ^ (s >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        out.append(-1.0 if (z ^ (z >> 31)) >> 63 else 1.0)
    return out


@pytest.mark.parametrize("text,want", [("1234567890abcdef", 0x1234567890ABCDEF),
                                       ("0x0FEDCBA987654321", 0x0FEDCBA987654321),
                                       ("ff", 255), (" 0 ", 0), ("ffffffffffffffff", M64)])
def test_parse_hex(text, want):
    assert parse_format_seed(text) == want


@pytest.mark.parametrize("text,words", [("zz", ("--format-seed", "hexadecimal")),
                                        ("1" + "0" * 16, ("--format-seed", "2^64")), ("", ("--format-seed",))])
def test_bad_seed_names_the_flag_and_the_limit(text, words):
    with pytest.raises(ValueError) as e:
        parse_format_seed(text)
    assert all(w in str(e.value) for w in words)


def test_signs_follow_the_seed_and_come_back():
    shipped = hq_seed.FORMAT_SEED
    assert shipped == 0x6871653832620001
    other = 0x1234567890ABCDEF
    with format_seed(other) as s:
        assert s == other
        got = rotation.layer_signs(3, 2, 64)
        for kind in (0, 1):
            for h in range(2):
                assert got[kind, h].tolist() == _spec_signs(other, 3, h, kind, 64)
        assert got.tolist() != [[_spec_signs(shipped, 3, h, k, 64) for h in range(2)] for k in (0, 1)]
    assert hq_seed.FORMAT_SEED == shipped
    assert rotation.layer_signs(3, 1, 64)[0, 0].tolist() == _spec_signs(shipped, 3, 0, 0, 64)


def test_none_keeps_the_format_seed_and_errors_restore():
    with format_seed(None) as s:
        assert s == hq_seed.FORMAT_SEED == 0x6871653832620001
    with pytest.raises(RuntimeError), format_seed(5):
        assert hq_seed.FORMAT_SEED == 5
        raise RuntimeError("boom")
    assert hq_seed.FORMAT_SEED == hq_seed.SHIPPED_SEED == 0x6871653832620001


def test_the_stamp_names_the_seed_in_effect():
    """One seed, two readers: the sign vectors and the stamp that persisted state carries (§2.1: two seeds are two
    incompatible caches), so a cache built under a research seed is refused by a daemon of the format's seed."""
    fmt = get_kv_format("hq-e8-2b")
    assert fmt.stamp.endswith("/seed6871653832620001")
    with format_seed(0x00000000000000FF):
        research = fmt.stamp
        assert rotation.sign_seed(0, 0, 0) == 0xFF
    assert research.endswith("/seed00000000000000ff")
    assert research.rsplit("/", 1)[0] == fmt.stamp.rsplit("/", 1)[0] and research != fmt.stamp
