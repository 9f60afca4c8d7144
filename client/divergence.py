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
