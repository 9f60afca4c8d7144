"""Where each message lies in a rendered prompt (DESIGN §4.3). †: imports no torch.

``message_spans(template, messages, text)``: where each message lies in the rendered text. Boundary ``k``
(the end of ``messages[:k]``) is ``len(render(messages[:k], add_generation_prompt=False))`` when that render is a
prefix of the full text (true for ChatML templates except where the template looks ahead: Qwen3.5 renders
reasoning only after the last user query, groups consecutive tool results, and refuses a conversation with no
user query). Otherwise a *probe*: ``messages[:k]`` plus a user (then an assistant) message of private-use
content is rendered, and the boundary is the last message-start marker (``<|im_start|>`` …) at or before the
point where that render leaves the full text — unless that marker opens message k-1 itself (its content lies
after it: consecutive tool results share one block), then that point itself. Boundary 0 (start of the first
message, after any preamble the template adds: Qwen's tools block, SmolLM2's default system prompt) always uses
the probe. Boundaries that neither finds are None and their spans are reported unresolved.

``message_at_char`` finds the one message holding a character in O(log N) renders. Consumed by
``text.segments.cut_points`` (which reads bounds 0, 1 and N) and the ``tokenize`` op.

All character positions are Python ``str`` indices of the rendered text.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Protocol, Sequence

from ignis_client.divergence import first_divergence

PROBE_CONTENT = "\ue000\ue001"          # private-use characters: never in a real prompt, never trimmed
MARKERS = ("<|im_start|>", "<|start_header_id|>", "<start_of_turn>")   # message-start markers, by template family


class Renderer(Protocol):
    """What ``message_spans`` needs of a ChatTemplate (duck-typed)."""

    def render(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True,
               **template_kwargs) -> str: ...


@dataclass(frozen=True)
class MessageSpan:
    """Message ``index`` (role ``role``) occupies characters [start, end) of the rendered text."""

    index: int
    role: str
    start: int
    end: int


@dataclass(frozen=True)
class Spans:
    """Where the messages lie in a rendered text.

    bounds: N + 1 character positions (N messages): ``bounds[0]`` the start of the first message (after the
      template's preamble), ``bounds[k]`` the end of ``messages[:k]``; None where not found.
    how: per bound, "prefix" (a prefix render), "probe" (a probe render), "skipped" (not asked for, see
      ``message_spans(only=...)``) or None (not found).
    spans: per message, its MessageSpan, or None when one of its bounds is unknown.
    unresolved: indices of the messages whose span was asked for and could not be found.
    generation_start: where the generation prompt starts (``bounds[N]``) when the text has one, else None.
    roles: the messages' roles.
    """

    bounds: tuple[int | None, ...]
    how: tuple[str | None, ...]
    spans: tuple[MessageSpan | None, ...]
    unresolved: tuple[int, ...]
    generation_start: int | None
    roles: tuple[str, ...]

    def wire(self) -> list[dict]:
        """The ``tokenize`` op's ``messages``: ``[{"role", "start", "end"}]`` (start/end null when unresolved)."""
        out = []
        for i, role in enumerate(self.roles):
            s = self.spans[i]
            out.append({"role": role, "start": s.start if s else None, "end": s.end if s else None})
        return out

    def message_at(self, char: int) -> MessageSpan | None:
        """The span containing character ``char`` (None: before the first message, in the generation prompt, or
        in an unresolved span)."""
        for s in self.spans:
            if s is not None and s.start <= char < s.end:
                return s
        return None


def _lcp(a: str, b: str) -> int:
    """Length of the longest common prefix of `a` and `b` (characters)."""
    d = first_divergence(a, b)
    return len(a) if d is None else d


def _content_within(message: dict, text: str, lo: int, hi: int) -> bool:
    """Whether the (stripped, non-empty) string content of ``message`` lies in ``text[lo:hi]``."""
    content = message.get("content")
    if not isinstance(content, str) or not content.strip():
        return False
    return text.find(content.strip(), lo, hi) >= 0


def detect_marker(template: Any) -> str | None:
    """The message-start marker of a template family, found in its source (``template.source``), or None."""
    source = getattr(template, "source", "") or ""
    return next((m for m in MARKERS if m in source), None)


class _Bounds:
    """Finds bound k (the end of ``messages[:k]``; bound 0: the start of the first message) in a rendered text."""

    def __init__(self, template: Renderer, messages: list[dict], text: str, tools, add_generation_prompt: bool,
                 marker: str | None, template_kwargs: dict):
        self.template, self.messages, self.text, self.tools = template, messages, text, tools
        self.gen = add_generation_prompt
        self.marker = detect_marker(template) if marker == "auto" else marker
        self.kw = template_kwargs

    def render(self, msgs: list[dict]) -> str | None:
        try:
            return self.template.render(msgs, tools=self.tools, add_generation_prompt=False, **self.kw)
        except Exception:  # noqa: BLE001 — a template refusing a partial conversation is expected (Qwen3.5)
            return None

    def probe(self, k: int, lo: int) -> int | None:
        marker, text = self.marker, self.text
        if marker is None:
            return None
        for role in ("user", "assistant"):
            rendered = self.render(self.messages[:k] + [{"role": role, "content": PROBE_CONTENT}])
            if rendered is None:
                continue
            stop = _lcp(rendered, text)
            if stop >= len(rendered):
                continue             # the whole probe render is in the text: it tells nothing
            at = text.rfind(marker, lo, stop)
            if k == 0:
                if at >= 0:
                    return at
                continue
            if at > lo and not _content_within(self.messages[k - 1], text, at, stop):
                return at
            if stop > lo and _content_within(self.messages[k - 1], text, max(at, lo), stop):
                # the last marker is message k-1's own start (grouped tool results share one block): the two
                # messages part where the renders part
                return stop
        return None

    def find(self, k: int, lo: int) -> tuple[int | None, str | None]:
        """(bound k, how) — how "prefix" or "probe"; (None, None) when not found. lo: a known lower bound (the
        previous message's start or end), below which the bound cannot lie."""
        text, n = self.text, len(self.messages)
        if k == 0:
            b = self.probe(0, 0) if n else None
            return (b, "probe") if b is not None else (None, None)
        rendered = self.render(self.messages[:k])
        if rendered is not None and text.startswith(rendered) and len(rendered) >= lo \
                and (k < n or not self.gen or len(rendered) < len(text)):
            return len(rendered), "prefix"
        b = self.probe(k, lo)
        if b is None and k == n and self.gen and self.marker is not None:
            at = text.rfind(self.marker, lo)
            b = at if at >= lo else None
        return (b, "probe") if b is not None and b >= lo else (None, None)


def message_spans(template: Renderer, messages: Sequence[dict], text: str | None = None, *,
                  tools: list[dict] | None = None, add_generation_prompt: bool = True, marker: str | None = "auto",
                  only: str | Iterable[int] | None = None, **template_kwargs) -> Spans:
    """Character spans of each message in ``text`` = ``template.render(messages, tools, add_generation_prompt,
    **template_kwargs)`` (rendered here when None). See the module docstring for the method.

    marker: the message-start marker used by the probe ("auto": ``detect_marker(template)``; None: the probe is not
    used, only prefix renders locate boundaries). Template errors while probing are caught (that bound is then
    unresolved); an error rendering ``text`` itself propagates.

    only: which bounds to find — None: all (N + 1 renders or more, each of up to the whole conversation: fine for the
    ``tokenize`` op, slow for hundreds of messages); "cuts": bounds 0, 1 and N, all that ``cut_points`` reads (a few
    renders whatever the conversation's length: the request path); or an iterable of bound indices. Bounds not asked
    for are None with ``how`` "skipped", and the messages they border are not counted as unresolved. To name the
    message holding one character (``diverged_at``), ``message_at_char`` needs O(log N) renders.
    """
    messages = list(messages)
    if text is None:
        text = template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt, **template_kwargs)
    n = len(messages)
    finder = _Bounds(template, messages, text, tools, add_generation_prompt, marker, template_kwargs)
    want = set(range(n + 1)) if only is None else ({0, 1, n} if only == "cuts" else {int(k) for k in only})
    bounds: list[int | None] = [None] * (n + 1)
    how: list[str | None] = [None if k in want else "skipped" for k in range(n + 1)]
    prev = 0
    for k in range(n + 1):
        if k not in want:
            continue
        b, h = finder.find(k, prev)
        if b is not None:
            bounds[k], how[k] = b, h
            prev = b
    spans: list[MessageSpan | None] = []
    for i, m in enumerate(messages):
        a, b = bounds[i], bounds[i + 1]
        spans.append(MessageSpan(i, str(m.get("role")), a, b) if a is not None and b is not None and a <= b else None)
    unresolved = tuple(i for i, s in enumerate(spans) if s is None and i in want and i + 1 in want)
    gen = bounds[n] if n and add_generation_prompt and bounds[n] is not None and bounds[n] < len(text) else None
    return Spans(tuple(bounds), tuple(how), tuple(spans), unresolved, gen, tuple(str(m.get("role")) for m in messages))


def message_at_char(template: Renderer, messages: Sequence[dict], text: str, char: int, *,
                    tools: list[dict] | None = None, add_generation_prompt: bool = True,
                    marker: str | None = "auto", **template_kwargs) -> MessageSpan | None:
    """The span of the message holding character ``char`` of ``text`` (as ``message_spans`` would find it), by a
    binary search over the bounds: O(log N) renders. None when ``char`` lies before the first message, in the
    generation prompt, or a bound on the way could not be found."""
    messages = list(messages)
    n = len(messages)
    if not n:
        return None
    finder = _Bounds(template, messages, text, tools, add_generation_prompt, marker, template_kwargs)
    known: dict[int, int] = {}

    def bound(k: int) -> int | None:
        if k not in known:
            lo = max((v for j, v in known.items() if j < k), default=0)
            b, _ = finder.find(k, lo)
            if b is None:
                return None
            known[k] = b
        return known[k]

    first, last = bound(0), bound(n)
    if first is None or last is None or not first <= char < last:
        return None
    lo, hi = 0, n                    # bound(lo) <= char < bound(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        b = bound(mid)
        if b is None:
            return None
        if b <= char:
            lo = mid
        else:
            hi = mid
    start, end = bound(lo), bound(hi)
    return MessageSpan(lo, str(messages[lo].get("role")), start, end)
