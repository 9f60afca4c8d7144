"""The first divergence between what ignis retained and what a request sent, and its likely cause (DESIGN §5).

Shared by the daemon (``ignis.reuse.diverged_at``) and ``ignis lint``. Standard library only (†: no torch).

``diverged_at(...)`` builds the wire object ``{"token", "message_index", "role", "char_offset", "ours", "theirs"}``:
``token`` is the first token position where the two token lists differ; ``char_offset`` the first character where
the two texts differ (in the request's rendered text, at or after the start of that token); ``message_index`` /
``role`` the request message whose span holds that character (null: in the template's own text, e.g. the generation
opener); ``ours`` is the retained state's text and ``theirs`` the request's, each ``CONTEXT_CHARS`` (40) characters
either side of the divergence. ``cause(...)`` names a likely reason (one of ``CAUSES``), for lint and logs; it is not
part of the wire object.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

CONTEXT_CHARS = 40

# Likely causes of a divergence, most specific first (``cause``).
CAUSES = (
    "none",            # no divergence
    "extended",        # one side is a prefix of the other (the request continues past the retained state)
    "tokenization",    # the texts agree where the tokens differ (a different split of the same characters)
    "volatile",        # digits differ on both sides: a timestamp, date, counter or id in the prompt
    "whitespace",      # the difference starts with whitespace on one side
    "reasoning",       # one side has a <think> block where the other has none (templates drop old reasoning)
    "tool_arguments",  # inside a tool call (arguments re-serialised)
    "tools",           # inside the tools block
    "system",          # inside the system message
    "assistant",       # inside an earlier assistant message (re-rendered differently)
    "edited",          # inside an earlier user or tool message (edited)
    "template",        # in the template's own text (preamble, opener)
)


def first_divergence(a: Sequence, b: Sequence) -> int | None:
    """The first index where ``a`` and ``b`` differ; ``min(len)`` when one is a prefix of the other and they differ
    in length; None when they are equal. Works on token lists and strings."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return None if len(a) == len(b) else n
    lo, hi = 0, n                  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def window(text: str, at: int, radius: int = CONTEXT_CHARS) -> str:
    """``text[at - radius : at + radius]`` clipped to the text."""
    return text[max(0, at - radius):max(0, at + radius)]


def message_at(messages: Sequence[dict] | None, char: int) -> tuple[int | None, str | None]:
    """(index, role) of the message whose span ``{"role", "start", "end"}`` (the ``tokenize`` op's ``messages``)
    holds character ``char``; (None, None) when none does (unknown spans have start/end null)."""
    for i, m in enumerate(messages or ()):
        s, e = m.get("start"), m.get("end")
        if s is not None and e is not None and s <= char < e:
            return i, m.get("role")
    return None, None


def diverged_at(ours_tokens: Sequence[int], theirs_tokens: Sequence[int], ours_text: str, theirs_text: str,
                theirs_offsets: Sequence[Sequence[int]] | None = None,
                messages: Sequence[dict] | None = None, token: int | None = None) -> dict | None:
    """The ``ignis.reuse.diverged_at`` object, or None when neither tokens nor texts differ.

    ours_tokens / ours_text: the retained candidate's tokens and their decoded text. theirs_tokens / theirs_text /
    theirs_offsets: the request's prompt tokens, rendered text and per-token (start, end) character offsets.
    messages: the request's message spans (``tokenize``'s ``messages``). token: the divergence position when already
    known (``Candidate.common_tokens``; it also counts image identities), else computed from the token lists.
    """
    tok_div = first_divergence(ours_tokens, theirs_tokens)
    char = first_divergence(ours_text, theirs_text)
    if token is None:
        token = tok_div
    if token is None and char is None:
        return None
    if token is None:            # same tokens, different texts: the caller's texts disagree with its tokens
        token = min(len(ours_tokens), len(theirs_tokens))
    if theirs_offsets:
        lo, hi = (tuple(theirs_offsets[token][:2]) if token < len(theirs_offsets)
                  else (len(theirs_text), len(theirs_text)))
        # the character divergence when it lies in the diverging token; else the token's start (a different split
        # of equal text, or an image that differs under equal placeholder tokens)
        if char is None or not lo <= char <= hi or (tok_div is not None and token < tok_div):
            char = lo
    elif char is None:
        char = min(len(ours_text), len(theirs_text))
    index, role = message_at(messages, char)
    return {"token": token, "message_index": index, "role": role, "char_offset": char,
            "ours": window(ours_text, char), "theirs": window(theirs_text, char)}


def diverged_at_texts(ours_text: str, theirs_text: str, messages: Sequence[dict] | None = None) -> dict | None:
    """``diverged_at`` for two rendered texts alone (lint): ``token`` is null."""
    char = first_divergence(ours_text, theirs_text)
    if char is None:
        return None
    index, role = message_at(messages, char)
    return {"token": None, "message_index": index, "role": role, "char_offset": char,
            "ours": window(ours_text, char), "theirs": window(theirs_text, char)}


def _inside(text: str, at: int, opening: str, closing: str) -> bool:
    """Whether ``at`` lies after an ``opening`` that no ``closing`` has closed yet."""
    o = text.rfind(opening, 0, at)
    return o >= 0 and text.rfind(closing, 0, at) < o


def cause(ours_text: str, theirs_text: str, char: int | None = None, messages: Sequence[dict] | None = None,
          tokens_differ: bool = False) -> str:
    """A likely cause of the first divergence (one of CAUSES), from the two texts and the request's message spans.

    char: the divergence character (computed when None). tokens_differ: the token lists differ (lets a divergence
    with equal texts be named "tokenization"). Heuristic: the first rule that holds wins, in the order of CAUSES.
    """
    if char is None:
        char = first_divergence(ours_text, theirs_text)
    if char is None:
        return "tokenization" if tokens_differ else "none"
    if char >= len(ours_text) or char >= len(theirs_text):
        return "extended"
    a, b = ours_text[char], theirs_text[char]
    if tokens_differ and ours_text[:char + 1] == theirs_text[:char + 1]:
        return "tokenization"
    if a.isdigit() and b.isdigit():
        return "volatile"
    if a.isspace() or b.isspace():
        return "whitespace"
    around_a, around_b = ours_text[char:char + 16], theirs_text[char:char + 16]
    if ("<think>" in around_a) != ("<think>" in around_b) or _inside(ours_text, char, "<think>", "</think>") \
            or _inside(theirs_text, char, "<think>", "</think>"):
        return "reasoning"
    if _inside(theirs_text, char, "<tool_call>", "</tool_call>") or _inside(ours_text, char, "<tool_call>",
                                                                           "</tool_call>"):
        return "tool_arguments"
    if _inside(theirs_text, char, "<tools>", "</tools>"):
        return "tools"
    index, role = message_at(messages, char)
    if role == "system" or role == "developer":
        return "system"
    if role == "assistant":
        return "assistant"
    if role in ("user", "tool"):
        return "edited"
    return "template"


# ---------------------------------------------------------------- volatile spans (lint)
# What lint names a divergence that a byte-stable harness would not have: the cause, and the extent of the volatile
# span on each side, so the comparison can resume after it (``volatile_span``). Most specific first.
VOLATILE_CAUSES = ("nonce", "timestamp", "id", "counter", "whitespace")
BILLING_HEADER = "x-anthropic-billing-header:"
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_DAY = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\.?"
_TIMESTAMP = re.compile("|".join((
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?",   # ISO 8601
    r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s?[AaPp]\.?[Mm]\.?)?",                           # 14:03:07, 2:03 PM
    r"\b\d{1,4}/\d{1,2}/\d{1,4}\b",                                                             # 3/14/2025
    rf"\b(?:{_DAY},?\s+)?{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?(?:\s+\d{{4}})?",                 # Mar 14, 2025
    rf"\b\d{{1,2}}\s+{_MONTH}\s+\d{{4}}",                                                       # 14 March 2025
    rf"\b{_DAY}\b",                                                                             # Friday
    r"\b1\d{9}(?:\d{3})?(?:\.\d+)?\b",                                                          # Unix time (s, ms)
)))
_ID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
                 r"|(?<![0-9A-Za-z])[0-9a-fA-F]{16,}(?![0-9A-Za-z])")
_NONCE_KEY = re.compile(r"(?i)\b(?:nonce|cch|request[_-]?id|req[_-]?id|trace[_-]?id|session[_-]?id|run[_-]?id)"
                        r"\s*[:=]\s*\"?([^\s\";,]+)")
_TOKEN = re.compile(r"[A-Za-z0-9_\-+/=]{10,}")
_NUMBER = re.compile(r"\d+")
RESYNC_CHARS = 16   # after a whitespace difference, this many characters must agree again


def _covering(rx: re.Pattern, text: str, at: int, group: int = 0) -> tuple[int, int] | None:
    """(start, end) of a match of `rx` near `at` whose `group` covers character `at` (a match ending at `at` counts
    when `at` is past the end of the text or the match is followed by a differing tail)."""
    lo = max(0, at - 80)
    for m in rx.finditer(text, lo, min(len(text), at + 80)):
        s, e = m.span(group)
        if s <= at < e or (s < at == e):
            return s, e
        if s > at:
            break
    return None


def _line(text: str, at: int) -> tuple[int, int]:
    s = text.rfind("\n", 0, at) + 1
    e = text.find("\n", at)
    return s, len(text) if e < 0 else e


def _random_token(tok: str) -> bool:
    digits = sum(c.isdigit() for c in tok)
    letters = sum(c.isalpha() for c in tok)
    return digits >= 2 and letters >= 2


def volatile_span(ours: str, theirs: str, ca: int, cb: int | None = None) -> tuple[str, int, int] | None:
    """(cause, end in ours, end in theirs) when the first difference, at character `ca` of ours and `cb` of theirs
    (default `ca`: the texts agree before it), lies in a volatile span; None otherwise.

    causes (VOLATILE_CAUSES): ``nonce`` — the line holds Claude Code's billing header (``x-anthropic-billing-header:``)
    or a ``nonce=`` / ``request_id:`` … value, or a random-looking token (10+ characters, letters and digits) differs;
    ``timestamp`` — a date or time (ISO 8601, 14:03, 3/14/2025, Mar 14 2025, a weekday, Unix seconds or ms) covers
    the difference on both sides; ``id`` — a UUID or a hex run of 16+ digits; ``counter`` — another number;
    ``whitespace`` — only whitespace differs here (the texts agree again for RESYNC_CHARS characters after the
    whitespace runs). The ends are where the comparison may resume (the span's end on each side).
    """
    cb = ca if cb is None else cb
    if ca > len(ours) or cb > len(theirs):
        return None
    la, lb = _line(ours, ca), _line(theirs, cb)
    if BILLING_HEADER in theirs[lb[0]:lb[1]] and BILLING_HEADER in ours[la[0]:la[1]]:
        return "nonce", la[1], lb[1]
    for cause_name, rx, group in (("timestamp", _TIMESTAMP, 0), ("id", _ID, 0), ("nonce", _NONCE_KEY, 1)):
        a, b = _covering(rx, ours, ca, group), _covering(rx, theirs, cb, group)
        if a is not None and b is not None:
            return cause_name, a[1], b[1]
    a, b = _covering(_TOKEN, ours, ca), _covering(_TOKEN, theirs, cb)
    if a is not None and b is not None and _random_token(ours[a[0]:a[1]]) and _random_token(theirs[b[0]:b[1]]):
        return "nonce", a[1], b[1]
    a, b = _covering(_NUMBER, ours, ca), _covering(_NUMBER, theirs, cb)
    if a is not None and b is not None:
        return "counter", a[1], b[1]
    ea, eb = ca, cb
    while ea < len(ours) and ours[ea].isspace():
        ea += 1
    while eb < len(theirs) and theirs[eb].isspace():
        eb += 1
    if (ea, eb) != (ca, cb) and ours[ea:ea + RESYNC_CHARS] == theirs[eb:eb + RESYNC_CHARS]:
        return "whitespace", ea, eb
    return None


def sort_keys(v):
    """`v` (decoded JSON) with the keys of every object sorted, recursively; lists keep their order."""
    if isinstance(v, dict):
        return {k: sort_keys(v[k]) for k in sorted(v)}
    if isinstance(v, list):
        return [sort_keys(x) for x in v]
    return v


def tool_name(tool) -> str | None:
    """The name of a tool in any request shape: OpenAI chat (``function.name``), Anthropic Messages and Responses
    (``name``); None when it has none."""
    if not isinstance(tool, dict):
        return None
    fn = tool.get("function")
    name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
    return name if isinstance(name, str) else None
