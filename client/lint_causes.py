"""Why one rendered request diverges from an earlier one, and how far a byte-stable harness would have matched
(``ignis lint``). Standard library only (†: no torch).

``Rendered`` is one request as the daemon's ``tokenize`` op renders it (tokens, offsets, text, message spans, the
mapped chat body). ``explain(ours, theirs, char)`` classifies the first difference at character ``char`` (the texts
agree before it) and then keeps comparing past every *volatile* difference — one a harness could have kept
byte-stable — to find the **achievable** point: where the two prompts would stop agreeing if every volatile span
were stable. Causes (``LINT_CAUSES``), the first rule that holds wins:

* in the tools block (Qwen-style ``<tools>…</tools>``, or before the first non-system message when the two tool lists
  differ): ``tools_reordered`` (the same tools, another order), ``json_key_order`` (the same tools, keys in another
  order), else ``tools`` (the tools changed: not volatile);
* in message *m*, when message *m* of both chat bodies is the same JSON once keys are sorted (tool-call arguments
  decoded): ``json_key_order``; the same once ``reasoning_content`` is dropped, or a ``<think>`` block differs or is
  present on one side only: ``reasoning`` (dropped or changed reasoning);
* ``nonce``, ``timestamp``, ``id``, ``counter``, ``whitespace`` (``divergence.volatile_span``);
* otherwise by where it lies (not volatile: a real change): ``system``, ``assistant``, ``edited`` (a user or tool
  message), ``template`` (the template's own text).

A volatile span is skipped on each side (its pattern's extent; for tools the block up to ``</tools>``; for a message
the rest of the message) and the comparison resumes; it stops at a non-volatile difference, at the first message the
earlier request did not have, or at the end of the earlier request.
"""
from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field

from .divergence import _inside, first_divergence, message_at, sort_keys, tool_name, volatile_span

VOLATILE = ("tools_reordered", "json_key_order", "reasoning", "nonce", "timestamp", "id", "counter", "whitespace")
CHANGES = ("tools", "system", "assistant", "edited", "template")
LINT_CAUSES = VOLATILE + CHANGES
MAX_SKIPS = 64


@dataclass
class Rendered:
    """One request rendered by ``tokenize``: tokens, per-token ``[start, end)`` character offsets, text, message
    spans (``[{"role", "start", "end"}]``) and the chat body the template was given (``{"messages", "tools"}``);
    ``ends`` are the offsets' ends."""

    tokens: list[int]
    offsets: list[list[int]]
    text: str
    spans: list[dict]
    chat: dict = field(default_factory=dict)

    def __post_init__(self):
        self.ends = [int(o[1]) for o in self.offsets]

    @classmethod
    def from_tokenize(cls, result: dict, chat: dict | None = None) -> "Rendered":
        """From a ``tokenize`` result; `chat` defaults to the result's ``chat`` (an HTTP front's body)."""
        return cls(list(result["tokens"]), result["offsets"], result["text"], list(result.get("messages") or ()),
                   chat or result.get("chat") or {})

    def span_end(self, index: int | None) -> int | None:
        """End character of message `index` (None when unknown)."""
        if index is None or index >= len(self.spans):
            return None
        return self.spans[index].get("end")

    def tokens_through(self, char: int) -> int:
        """How many tokens end at or before character `char`."""
        return bisect.bisect_right(self.ends, char)

    def new_from(self, earlier_messages: int) -> int:
        """First character of this request's message number `earlier_messages` (the first one an earlier request
        with that many messages did not have); past the end of the text when there is none."""
        if earlier_messages < len(self.spans) and self.spans[earlier_messages].get("start") is not None:
            return self.spans[earlier_messages]["start"]
        return len(self.text) + 1


def _messages(r: Rendered) -> list:
    return list(r.chat.get("messages") or ())


def _canon_message(m) -> str:
    if not isinstance(m, dict):
        return json.dumps(m)
    m = dict(m)
    calls = []
    for c in m.get("tool_calls") or ():
        c = json.loads(json.dumps(c))
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"])
            except ValueError:
                pass
        calls.append(c)
    if calls:
        m["tool_calls"] = calls
    return json.dumps(sort_keys(m), ensure_ascii=False)


def _dumps(v) -> str:
    """Order-sensitive JSON text (dict equality ignores key order; this does not)."""
    return json.dumps(v, ensure_ascii=False)


def _without_reasoning(m):
    return {k: v for k, v in m.items() if k != "reasoning_content"} if isinstance(m, dict) else m


def _tools_cause(ours: Rendered, theirs: Rendered, ca: int, cb: int) -> tuple[str, int | None, int | None] | None:
    to, tt = ours.chat.get("tools") or [], theirs.chat.get("tools") or []
    first_conv = next((s.get("start") for s in theirs.spans if s.get("role") not in ("system", "developer")), None)
    in_block = _inside(theirs.text, cb, "<tools>", "</tools>")
    if not in_block and not (to != tt and first_conv is not None and cb < first_conv):
        return None
    if _dumps(to) == _dumps(tt):
        return None
    names_o, names_t = [tool_name(t) for t in to], [tool_name(t) for t in tt]
    canon_o = sorted(json.dumps(sort_keys(t)) for t in to)
    canon_t = sorted(json.dumps(sort_keys(t)) for t in tt)
    if canon_o != canon_t:
        return "tools", None, None
    kind = "tools_reordered" if names_o != names_t else "json_key_order"
    if in_block:
        ea, eb = ours.text.find("</tools>", ca), theirs.text.find("</tools>", cb)
        if ea >= 0 and eb >= 0:
            return kind, ea, eb
    ia, _ = message_at(ours.spans, ca)
    ib, _ = message_at(theirs.spans, cb)
    ea, eb = ours.span_end(ia), theirs.span_end(ib)
    return (kind, ea, eb) if ea is not None and eb is not None else (kind, None, None)


def classify(ours: Rendered, theirs: Rendered, ca: int, cb: int) -> tuple[str, int | None, int | None]:
    """(cause, resume character in ours, in theirs) of the difference at `ca` in ours / `cb` in theirs (the texts
    agree just before); the resume points are None when the cause is not volatile (see the module docstring)."""
    got = _tools_cause(ours, theirs, ca, cb)
    if got is not None:
        return got
    ia, _ = message_at(ours.spans, ca)
    ib, role = message_at(theirs.spans, cb)
    mo, mt = _messages(ours), _messages(theirs)
    if ia is not None and ia == ib and ib < len(mo) and ib < len(mt) and _dumps(mo[ib]) != _dumps(mt[ib]):
        ea, eb = ours.span_end(ia), theirs.span_end(ib)
        if _canon_message(mo[ib]) == _canon_message(mt[ib]):
            return "json_key_order", ea, eb
        if _canon_message(_without_reasoning(mo[ib])) == _canon_message(_without_reasoning(mt[ib])):
            return "reasoning", ea, eb
    near_a, near_b = ours.text[ca:ca + 16], theirs.text[cb:cb + 16]
    if ("<think>" in near_a) != ("<think>" in near_b) or _inside(ours.text, ca, "<think>", "</think>") \
            or _inside(theirs.text, cb, "<think>", "</think>"):
        ea, eb = ours.span_end(ia), theirs.span_end(ib)
        return ("reasoning", ea, eb) if ia is not None and ia == ib else ("reasoning", None, None)
    vol = volatile_span(ours.text, theirs.text, ca, cb)
    if vol is not None:
        return vol
    if role in ("system", "developer"):
        return "system", None, None
    if role == "assistant":
        return "assistant", None, None
    if role in ("user", "tool"):
        return "edited", None, None
    return "template", None, None


@dataclass
class Explanation:
    """The causes met from the first difference on (first = the first difference's) and the achievable point:
    ``achievable_char`` in theirs and ``achievable_tokens`` (tokens of theirs ending at or before it)."""

    causes: list[str]
    achievable_char: int
    achievable_tokens: int


def explain(ours: Rendered, theirs: Rendered, char: int) -> Explanation:
    """Classify the first difference at `char` and follow volatile spans to the achievable point (module
    docstring). `char` must lie before ``theirs.new_from(len(ours.spans))`` (else nothing diverged early)."""
    new_from = theirs.new_from(len(ours.spans))
    ca = cb = char
    causes: list[str] = []
    achieved = char
    for _ in range(MAX_SKIPS):
        cause, ea, eb = classify(ours, theirs, ca, cb)
        causes.append(cause)
        if ea is None or eb is None:
            achieved = cb
            break
        d = first_divergence(ours.text[ea:], theirs.text[eb:])
        if d is None or ea + d >= len(ours.text):   # the rest of the earlier request matches
            achieved = min(len(theirs.text), eb + len(ours.text) - ea)
            break
        ca, cb = ea + d, eb + d
        achieved = cb
        if cb >= new_from:
            break
    return Explanation(causes, achieved, theirs.tokens_through(achieved))
