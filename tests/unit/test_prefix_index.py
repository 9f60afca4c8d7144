"""The content index (ignisd/cache/prefix_index.py, DESIGN §4.4): longest retained prefix, exact tails, image
identities, ties, best candidate and divergence positions — hand-computed positions on synthetic token lists."""
from __future__ import annotations

import subprocess
import sys

import pytest

from ignisd.cache.prefix_index import Candidate, Match, PrefixIndex, normalize_spans, page_hashes

PROMPT = list(range(1000, 1300))            # 300 distinct tokens: pages [0,64) [64,128) [128,192) [192,256) + 44


def idx(**states) -> PrefixIndex:
    ix = PrefixIndex(64)
    for sid, toks in states.items():
        ix.insert(sid, toks)
    return ix


def test_longest_prefix_wins():
    ix = idx(a=PROMPT[:100], b=PROMPT[:130], c=PROMPT[:150] + [7] * 50, d=PROMPT[:64])
    assert ix.lookup(PROMPT) == Match("b", 130)
    assert ix.matches(PROMPT) == [Match("b", 130), Match("a", 100), Match("d", 64)]
    assert ix.lookup(PROMPT[:129]) == Match("a", 100)
    assert ix.lookup([5] + PROMPT) is None
    ix.check_integrity()


@pytest.mark.parametrize("n", [1, 63, 64, 65, 127, 128, 129, 256, 299, 300])
def test_state_lengths_around_pages(n):
    ix = idx(s=PROMPT[:n])
    assert ix.lookup(PROMPT) == Match("s", n)
    assert ix.lookup(PROMPT, limit=len(PROMPT) - 1) == (Match("s", n) if n < 300 else None)
    # a different last token: the exact tail compare (partial page) or the last page hash refuses it
    other = PROMPT[:n - 1] + [1]
    assert PrefixIndex(64).lookup(PROMPT) is None
    ix2 = idx(s=other)
    assert ix2.lookup(PROMPT) is None
    assert ix2.best_candidate(PROMPT) == Candidate("s", n - 1, n)


def test_tail_is_compared_exactly_and_prompt_must_be_long_enough():
    ix = idx(s=PROMPT[:100])
    assert ix.lookup(PROMPT[:99]) is None            # the state is longer than the prompt
    assert ix.best_candidate(PROMPT[:99]) == Candidate("s", 99, 100)
    assert ix.lookup(PROMPT[:100]) == Match("s", 100)
    assert ix.lookup(PROMPT[:100], limit=99) is None
    assert ix.lookup(PROMPT[:65] + [0] + PROMPT[66:]) is None   # tail differs at 65
    assert ix.best_candidate(PROMPT[:65] + [0] + PROMPT[66:]) == Candidate("s", 65, 100)


def test_ties_go_to_the_key_then_the_latest():
    ix = idx(x=PROMPT[:128], y=PROMPT[:128], z=PROMPT[:128])
    assert ix.lookup(PROMPT) == Match("z", 128)                 # no key: inserted last
    rank = {"x": (1, 5.0), "y": (1, 9.0), "z": (0, 99.0)}
    assert ix.lookup(PROMPT, key=rank.get) == Match("y", 128)
    assert ix.lookup(PROMPT, key=rank.get, accept=lambda s: s != "y") == Match("x", 128)
    ix.remove("z")
    assert ix.lookup(PROMPT) == Match("y", 128)
    # best_candidate ties too
    ix = idx(p=PROMPT[:70] + [1], q=PROMPT[:70] + [2])
    assert ix.best_candidate(PROMPT) == Candidate("q", 70, 71)
    assert ix.best_candidate(PROMPT, key={"p": 2, "q": 1}.get) == Candidate("p", 70, 71)


def test_images_key_pages_and_never_end_a_match_inside():
    d1, d2 = "11" * 32, "22" * 32
    img = [(60, 70, d1)]                               # crosses the page boundary at 64
    ix = PrefixIndex(64)
    ix.insert("s", PROMPT[:130], img)
    assert ix.lookup(PROMPT, img) == Match("s", 130)
    assert ix.lookup(PROMPT) is None                   # same placeholder tokens, no image: not the same content
    assert ix.lookup(PROMPT, [(60, 70, d2)]) is None   # another image over the same span
    assert ix.best_candidate(PROMPT, [(60, 70, d2)]) == Candidate("s", 60, 130)
    assert ix.best_candidate(PROMPT) == Candidate("s", 60, 130)
    assert ix.lookup(PROMPT, [(60, 71, d1)]) is None   # same image, other span
    # a later image of the prompt, after the state's end, does not matter
    assert ix.lookup(PROMPT, img + [(130, 140, d2)]) == Match("s", 130)
    # a state that would end inside an image of the prompt is not a match
    ix.insert("t", PROMPT[:100])
    assert ix.lookup(PROMPT, img + [(90, 110, d2)]) is None
    assert ix.matches(PROMPT, img + [(90, 110, d2)]) == []
    assert ix.lookup(PROMPT, img + [(100, 110, d2)]) is None   # t has no image in [0, 100)... but s does: t misses
    ix.insert("u", PROMPT[:100], img)
    assert ix.lookup(PROMPT, img + [(100, 110, d2)]) == Match("u", 100)   # an image starting at the end is fine
    assert ix.lookup(PROMPT, img + [(99, 110, d2)]) is None
    ix.check_integrity()


def test_image_in_the_tail_and_on_page_boundaries():
    d1, d2 = "ab" * 32, "cd" * 32
    ix = PrefixIndex(64)
    ix.insert("tail", PROMPT[:150], [(130, 140, d1)])          # image only in the partial last page
    ix.insert("page", PROMPT[:192], [(64, 128, d2)])           # image filling page 1 exactly
    # 'tail' has no image in page 1; 'page' has no image at 130: each matches only its own prompt
    assert ix.matches(PROMPT, [(130, 140, d1)]) == [Match("tail", 150)]
    assert ix.matches(PROMPT, [(64, 128, d2)]) == [Match("page", 192)]
    assert ix.matches(PROMPT, [(64, 128, d2), (130, 140, d1)]) == []
    assert ix.matches(PROMPT, [(130, 140, d2)]) == []
    assert ix.best_candidate(PROMPT, [(130, 140, d2)]) == Candidate("tail", 130, 150)
    assert ix.best_candidate(PROMPT, [(64, 128, d1)]) == Candidate("page", 64, 192)


def test_best_candidate_finds_the_longest_divergent_state():
    ix = idx(sys=PROMPT[:128], old=PROMPT[:200] + [9] * 30, other=[1, 2, 3] + PROMPT[3:250])
    assert ix.lookup(PROMPT) == Match("sys", 128)
    assert ix.best_candidate(PROMPT) == Candidate("old", 200, 230)
    edited = PROMPT[:20] + [0] + PROMPT[21:]
    assert ix.lookup(edited) is None
    assert ix.best_candidate(edited) == Candidate("old", 20, 230)         # tie at 20 with "sys": inserted last
    assert ix.best_candidate(edited, key={"sys": 1, "old": 0, "other": 0}.get) == Candidate("sys", 20, 128)
    assert ix.best_candidate([1, 2]) == Candidate("other", 2, 250)
    assert idx(a=PROMPT[:10]).best_candidate(PROMPT) is None        # every state is a prefix
    assert PrefixIndex().best_candidate(PROMPT) is None
    assert ix.common_prefix("old", PROMPT) == 200


def test_remove_prunes_and_reinsert():
    ix = idx(a=PROMPT[:200], b=PROMPT[:130])
    assert len(ix) == 2 and "a" in ix
    assert ix.remove("a") is True and ix.remove("a") is False
    assert ix.lookup(PROMPT) == Match("b", 130)
    assert len(ix._nodes) == 1 + 2                      # root + b's two full pages
    ix.remove("b")
    assert len(ix._nodes) == 1 and len(ix) == 0
    ix.insert("a", PROMPT[:64])
    assert ix.lookup(PROMPT) == Match("a", 64)
    with pytest.raises(ValueError):
        ix.insert("a", PROMPT[:10])
    assert ix.tokens("a") == tuple(PROMPT[:64]) and ix.image_spans("a") == ()
    ix.check_integrity()


def test_empty_state_and_empty_prompt():
    ix = idx(e=[])
    assert ix.lookup(PROMPT) == Match("e", 0)
    assert ix.lookup([]) == Match("e", 0)
    assert ix.lookup(PROMPT, limit=-1) is None


def test_span_validation():
    assert normalize_spans([(5, 9, "b"), (0, 2, "a")]) == ((0, 2, "a"), (5, 9, "b"))
    for bad in ([(3, 3, "a")], [(-1, 2, "a")], [(0, 5, "a"), (4, 6, "b")]):
        with pytest.raises(ValueError):
            normalize_spans(bad)
    with pytest.raises(ValueError):
        PrefixIndex().insert("s", [1, 2, 3], [(2, 4, "a")])


def test_page_hashes_are_chained_and_stable_across_processes():
    toks = list(range(200))
    h = page_hashes(toks, ((10, 20, "ff" * 32),))
    assert len(h) == 3 and len(set(h)) == 3 and all(len(x) == 32 for x in h)
    assert page_hashes(toks, ())[1:] != h[1:]             # the image of page 0 changes every later hash
    assert page_hashes(toks[:128], ((10, 20, "ff" * 32),)) == h[:2]
    code = ("from ignisd.cache.prefix_index import page_hashes; "
            "print(','.join(x.hex() for x in page_hashes(list(range(200)), ((10, 20, 'ff' * 32),))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""}).stdout.strip()
    assert out == ",".join(x.hex() for x in h)
