"""First divergence and its cause (client/divergence.py, DESIGN §5 ``ignis.reuse.diverged_at``), and the torch-free
import of the whole reuse control plane (segments, prefix index, retained store, divergence)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from ignis_client.divergence import (CAUSES, cause, diverged_at, diverged_at_texts, first_divergence, message_at,
                                     window)

ROOT = Path(__file__).resolve().parents[2]

SYSTEM = "<|im_start|>system\nYou are a coding agent. Today is 2025-03-14; be careful with the repository.<|im_end|>\n"
USER = "<|im_start|>user\nPlease fix the failing test in parser.py<|im_end|>\n"
OPENER = "<|im_start|>assistant\n"


def chars(text):
    """A one-token-per-character tokenization: (ids, offsets)."""
    return [ord(c) for c in text], [(i, i + 1) for i in range(len(text))]


def spans(*pieces, roles):
    out, at = [], 0
    for p, r in zip(pieces, roles):
        out.append({"role": r, "start": at, "end": at + len(p)})
        at += len(p)
    return out


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence([], [5]) == 0
    assert first_divergence("abcdef", "abcxef") == 3
    assert first_divergence("x" * 1000 + "a", "x" * 1000 + "b") == 1000
    assert first_divergence("", "") is None


def test_window_and_message_at():
    text = "".join(chr(ord("a") + i % 26) for i in range(100))
    assert window(text, 50) == text[10:90] and len(window(text, 50)) == 80
    assert window(text, 5) == text[:45]
    assert window(text, 99) == text[59:]
    assert window(text, 50, radius=2) == text[48:52]
    msgs = [{"role": "system", "start": 0, "end": 10}, {"role": "user", "start": 10, "end": 20},
            {"role": "tool", "start": None, "end": None}]
    assert message_at(msgs, 0) == (0, "system")
    assert message_at(msgs, 10) == (1, "user")
    assert message_at(msgs, 20) == (None, None)
    assert message_at(None, 3) == (None, None)


def test_changed_timestamp_in_the_system_prompt():
    ours_text = SYSTEM + USER + OPENER
    theirs_text = SYSTEM.replace("2025-03-14", "2025-03-15") + USER + OPENER
    ours, _ = chars(ours_text)
    theirs, offsets = chars(theirs_text)
    at = SYSTEM.index("2025-03-14") + 9
    d = diverged_at(ours, theirs, ours_text, theirs_text, offsets, spans(SYSTEM, USER, roles=("system", "user")))
    assert d == {"token": at, "message_index": 0, "role": "system", "char_offset": at,
                 "ours": ours_text[at - 40:at + 40], "theirs": theirs_text[at - 40:at + 40]}
    assert "2025-03-14" in d["ours"] and "2025-03-15" in d["theirs"]
    assert cause(ours_text, theirs_text, d["char_offset"], spans(SYSTEM, USER, roles=("system", "user"))) == "volatile"


def test_edited_user_message_with_multi_character_tokens():
    ours_text = SYSTEM + USER + OPENER
    edited = USER.replace("failing", "flaky")
    theirs_text = SYSTEM + edited + OPENER
    # words as tokens: "failing" and "flaky" are single tokens that share their first letter
    vocab: dict[str, int] = {}

    def words(text):
        ids, offs, i = [], [], 0
        for w in text.replace(" ", " \0").split("\0"):
            ids.append(vocab.setdefault(w, len(vocab)))
            offs.append((i, i + len(w)))
            i += len(w)
        return ids, offs
    ours, _ = words(ours_text)
    theirs, offsets = words(theirs_text)
    t = first_divergence(ours, theirs)
    lo = offsets[t][0]
    assert theirs_text[lo:].startswith("flaky")
    msgs = spans(SYSTEM, edited, roles=("system", "user"))
    d = diverged_at(ours, theirs, ours_text, theirs_text, offsets, msgs)
    assert (d["token"], d["char_offset"], d["message_index"], d["role"]) == (t, lo + 1, 1, "user")
    assert d["theirs"] == theirs_text[lo + 1 - 40:lo + 1 + 40]
    assert cause(ours_text, theirs_text, d["char_offset"], msgs) == "edited"


def test_same_text_other_tokens_points_at_the_token():
    text = SYSTEM + USER
    ours, _ = chars(text)
    theirs, offsets = chars(text)
    theirs[30:32] = [999]                      # characters 30..31 as one token
    offsets[30:32] = [(30, 32)]
    d = diverged_at(ours, theirs, text, text, offsets)
    assert (d["token"], d["char_offset"], d["message_index"]) == (30, 30, None)
    assert d["ours"] == d["theirs"] == text[:70]
    assert cause(text, text, None, tokens_differ=True) == "tokenization"


def test_image_divergence_given_by_the_index():
    # same placeholder tokens and text, another image at token 40: the index says 40, the text agrees
    text = SYSTEM + USER
    ids, offsets = chars(text)
    d = diverged_at(ids, ids, text, text, offsets, token=40)
    assert (d["token"], d["char_offset"]) == (40, 40)
    # an image before a later text difference: the earlier (image) position wins
    other = text[:60] + "Z" + text[61:]
    d = diverged_at(ids, chars(other)[0], text, other, offsets, token=40)
    assert (d["token"], d["char_offset"]) == (40, 40)


def test_prompt_is_a_prefix_of_the_candidate_and_no_divergence():
    long_text = SYSTEM + USER + OPENER
    short_text = SYSTEM + USER
    ours, _ = chars(long_text)
    theirs, offsets = chars(short_text)
    d = diverged_at(ours, theirs, long_text, short_text, offsets)
    n = len(short_text)
    assert (d["token"], d["char_offset"], d["message_index"]) == (n, n, None)
    assert d["theirs"] == short_text[n - 40:] and d["ours"] == long_text[n - 40:n + 40]
    assert cause(long_text, short_text) == "extended"
    assert diverged_at(ours, ours, long_text, long_text, chars(long_text)[1]) is None
    assert cause(long_text, long_text) == "none"


def test_texts_only_for_lint():
    a = SYSTEM + USER
    b = SYSTEM + USER.replace("Please", "please")
    d = diverged_at_texts(a, b, spans(SYSTEM, USER, roles=("system", "user")))
    at = len(SYSTEM) + len("<|im_start|>user\n")
    assert d == {"token": None, "message_index": 1, "role": "user", "char_offset": at,
                 "ours": a[at - 40:at + 40], "theirs": b[at - 40:at + 40]}
    assert diverged_at_texts(a, a) is None


def test_causes():
    base = "<|im_start|>system\n# Tools\n<tools>\n{\"name\": \"read\"}\n</tools>\nBe terse.<|im_end|>\n"
    tools_changed = base.replace("read", "load")
    at = first_divergence(base, tools_changed)
    sys_span = [{"role": "system", "start": 0, "end": len(base)}]
    assert cause(base, tools_changed, at, sys_span) == "tools"
    assert cause(base, base.replace("terse", "brief"), None, sys_span) == "system"
    a = base + "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nDone.<|im_end|>\n"
    b = base + "<|im_start|>assistant\nDone.<|im_end|>\n"
    assert cause(a, b) == "reasoning"
    c = base + "<|im_start|>assistant\n<tool_call>\n<function=read>\n<parameter=path>\n{\"a\": 1, \"b\": 2}"
    d = base + "<|im_start|>assistant\n<tool_call>\n<function=read>\n<parameter=path>\n{\"b\": 2, \"a\": 1}"
    assert cause(c, d) == "tool_arguments"
    msgs = [{"role": "system", "start": 0, "end": len(base)},
            {"role": "assistant", "start": len(base), "end": len(base) + 60}]
    assert cause(base + "<|im_start|>assistant\nYes", base + "<|im_start|>assistant\nNo", None, msgs) == "assistant"
    assert cause("abc def", "abc  def") == "whitespace"
    assert cause("<|im_start|>assistant\nA", "<|im_start|>assistant\nB") == "template"
    assert set(CAUSES) >= {"none", "extended", "tokenization", "volatile", "whitespace", "reasoning",
                           "tool_arguments", "tools", "system", "assistant", "edited", "template"}


def test_divergence_is_standard_library_only():
    tree = ast.parse((ROOT / "client" / "divergence.py").read_text())
    mods = {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    mods |= {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert mods <= set(sys.stdlib_module_names) | {"__future__"}, mods


def test_reuse_control_plane_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
            "import ignisd.text.segments, ignisd.traversal, ignisd.cache.prefix_index, ignisd.cache.retained\n"
            "import ignis_client.divergence\n"
            "from ignisd.cache.manager import CacheManager\n"
            "from ignisd.cache.page_pool import PagePool\n"
            "from ignisd.cache.retained import RetainedStore\n"
            "from ignisd.cache.retained_state import Stamp\n"
            "s = RetainedStore(Stamp('h', 'fp32'), needs_slot=False)\n"
            "pool = PagePool(4); CacheManager(pool, 1, retained=s)\n"
            "t = s.reserve_capture('prefix', list(range(64)))\n"
            "s.commit(t, pool.alloc(1)); assert s.lookup(list(range(70))).matched_tokens == 64\n"
            "p = ignisd.traversal.plan_traversals(0, 64, 100, 103, chunk_tokens=32)\n"
            "bad = [m for m in sys.modules if m.startswith(('torch', 'numpy')) and sys.modules[m] is not None]\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
