"""Generated text → OpenAI-shaped reply: ``content``, ``reasoning_content`` (``<think>…</think>``) and
``tool_calls``, streamed as deltas and summed up as the final message.

Usage (one parser per request; pieces as ``StreamDecoder.push`` returns them, split anywhere)::

    parser = make_output_parser(family, tools, starts_in_reasoning=prompt_starts_in_reasoning(prompt))
    for piece in pieces:
        delta = parser.feed(piece)      # {} or a subset of {"content", "reasoning_content", "tool_calls"}
    out = parser.finish()               # out.delta: what the end released; out.message(); out.has_tool_calls

Families: "qwen3_5" (Qwen3.5: XML tool calls) and "qwen3" (Qwen3 / Qwen3-Next, alias "qwen3_next": JSON tool
calls) parse the same way: both call forms are recognised whichever the family (tool_calls.py). "none" (e.g.
SmolLM2): everything is content, verbatim.

For the Qwen families the reply is split in regions:

* Reasoning: from the start when ``starts_in_reasoning`` (Qwen3.5's generation prompt ends with ``<think>\\n``),
  or when the output opens with ``<think>`` (after optional whitespace; with ``starts_in_reasoning`` such a
  repeated ``<think>`` is skipped), up to ``</think>``; unclosed, it runs to the end. ``<think>`` anywhere later
  is content.
* Tool calls: ``<tool_call>…</tool_call>``, outside reasoning and inside it too (Qwen3.5 often calls a tool before
  closing its reasoning, vLLM #39056): after the call the region it interrupted goes on. A malformed or unclosed
  call falls back to text of the region it was in (its raw text, ``<tool_call>`` included).
* Content: the rest, concatenated.

``ParsedOutput.reasoning_spans`` are the character spans ``[start, end)`` of the reasoning in the text fed (the
concatenation of the pieces): from the start of the reply, or from a ``<think>`` that opens it, through its
``</think>`` (both tags included: they are hidden output of the reasoning, as OpenAI counts reasoning tokens), to
the end when unclosed; a tool call made inside the reasoning (``<tool_call>`` through ``</tool_call>``) is not in
them, it is visible output. ``count_in_spans`` counts the generated tokens whose text starts inside them: the
``reasoning_tokens`` of the usage objects.

``reasoning_content`` and ``content`` are trimmed of whitespace at both ends (the chat template trims both when
it renders the turn back), so the separators around ``</think>`` and tool calls disappear. Streaming holds back
any text that could be the start of ``<think>``, ``</think>`` or ``<tool_call>``, and trailing whitespace, until
the next piece decides it; so a delta never shows part of a tag or of a tool call as content.

Invariants: the final message depends only on the whole text, never on how it was split. The deltas,
accumulated (strings concatenated, tool-call pieces merged by index), equal the final message, except when a
tool call whose header was already streamed turns out malformed or is cut off: its pieces cannot be taken
back, and the final message shows its text as content (the stream then also gets that text as content).
No torch here.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Callable

from ignisd.text.tool_calls import TOOL_OPEN, ToolCallParser, held_suffix, parameter_types

FAMILIES = ("qwen3_5", "qwen3", "none")
_ALIASES = {"qwen3_next": "qwen3"}
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def prompt_starts_in_reasoning(prompt: str) -> bool:
    """Whether a rendered prompt leaves generation inside an open ``<think>`` block: its last turn (from the
    last ``<|im_start|>``) has a ``<think>`` after its last ``</think>``. True for Qwen3.5's default opener
    ``<|im_start|>assistant\\n<think>\\n``; False with ``enable_thinking=false`` (``<think>\\n\\n</think>\\n\\n``)
    and for openers without ``<think>``."""
    tail = prompt[max(prompt.rfind("<|im_start|>"), 0):]
    return tail.rfind(THINK_OPEN) > tail.rfind(THINK_CLOSE)


class _Verbatim:
    """A text stream kept as it comes."""

    def __init__(self):
        self._parts: list[str] = []

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def add(self, s: str) -> str:
        if s:
            self._parts.append(s)
        return s


class _Trimmed(_Verbatim):
    """A text stream trimmed at both ends: leading whitespace dropped, trailing whitespace held until more
    text follows it (and dropped at the end)."""

    def __init__(self):
        super().__init__()
        self._ws = ""

    def add(self, s: str) -> str:
        core = s.rstrip()
        if not core:
            if self._parts:
                self._ws += s
            return ""
        out = self._ws + core if self._parts else core.lstrip()
        self._ws = s[len(core):]
        self._parts.append(out)
        return out


class _Delta:
    """Collects one ``feed``'s output; tool-call pieces of the same index are merged."""

    def __init__(self):
        self.content = ""
        self.reasoning = ""
        self.calls: list[dict] = []

    def tool(self, pieces: list[dict]) -> None:
        for p in pieces:
            if self.calls and self.calls[-1]["index"] == p["index"]:
                self.calls[-1]["function"]["arguments"] += p["function"]["arguments"]
            else:
                self.calls.append(p)

    def out(self) -> dict:
        d: dict = {}
        if self.content:
            d["content"] = self.content
        if self.reasoning:
            d["reasoning_content"] = self.reasoning
        if self.calls:
            d["tool_calls"] = self.calls
        return d


@dataclass(frozen=True)
class ParsedOutput:
    """The end of a reply.

    Attributes:
        content: the visible text; None when empty and the reply made tool calls.
        reasoning_content: the thinking; None when empty.
        tool_calls: ``[{"id", "type": "function", "function": {"name", "arguments": JSON string}}]`` or None.
        delta: the last delta (text held back until the end: a possible tag start, a cut-off call), {} if none.
        reasoning_spans: character spans ``[start, end)`` of the reasoning in the text fed, in order and disjoint
            (see the module docstring); () when the reply has no reasoning.
    """

    content: str | None
    reasoning_content: str | None
    tool_calls: list[dict] | None
    delta: dict = field(default_factory=dict)
    reasoning_spans: tuple[tuple[int, int], ...] = ()

    @property
    def has_tool_calls(self) -> bool:
        """The reply made a tool call: its finish_reason is "tool_calls"."""
        return bool(self.tool_calls)

    def message(self) -> dict:
        """``done.message``: ``{"role": "assistant", "content", "reasoning_content", "tool_calls"}``."""
        return {"role": "assistant", "content": self.content, "reasoning_content": self.reasoning_content,
                "tool_calls": self.tool_calls}


def _random_call_id(index: int) -> str:
    return "call_" + secrets.token_hex(12)


class OutputParser:
    """Streaming parser of one reply; see the module docstring. Build it with ``make_output_parser``."""

    def __init__(self, family: str, tools: list | None = None, starts_in_reasoning: bool = False,
                 make_id: Callable[[int], str] | None = None, calls: bool = True):
        family = _ALIASES.get(family, family)
        if family not in FAMILIES:
            raise ValueError(f"unknown output family {family!r}; expected one of {', '.join(FAMILIES)}")
        self.family = family
        self._parse = family != "none"
        self._calls_on = calls and self._parse     # False (tool_choice "none"): ``<tool_call>`` is plain text
        self._holds = (THINK_CLOSE, TOOL_OPEN) if self._calls_on else (THINK_CLOSE,)
        self._mode = "start" if self._parse else "content"
        self._after_start = "reasoning" if starts_in_reasoning else "content"
        self._types = parameter_types(tools) if self._parse else {}
        self._make_id = make_id or _random_call_id
        self._buf = ""
        self._reasoning = _Trimmed()
        self._content = _Trimmed() if self._parse else _Verbatim()
        self._call: ToolCallParser | None = None
        self._call_region = "content"   # the region an open call interrupted (it goes on after the call)
        self._calls: list[dict] = []
        self._n_indices = 0
        self._result: ParsedOutput | None = None
        self._fed = 0                   # characters fed so far; the unparsed ``_buf`` is always their suffix
        self._spans: list[tuple[int, int]] = []   # closed reasoning spans
        self._span_from: int | None = None        # start of the open one
        self._call_at = 0               # offset of the open call's ``<tool_call>``

    def _at(self, i: int = 0) -> int:
        """The offset in the text fed of ``_buf[i]``."""
        return self._fed - len(self._buf) + i

    def _enter_reasoning(self, at: int) -> None:
        if self._spans and self._spans[-1][1] == at:   # goes on where it stopped (a call that failed)
            at = self._spans.pop()[0]
        self._span_from = at

    def _leave_reasoning(self, at: int) -> None:
        if at > self._span_from:
            self._spans.append((self._span_from, at))
        self._span_from = None

    def _allocate(self) -> tuple[int, str]:
        index = self._n_indices
        self._n_indices += 1
        return index, self._make_id(index)

    def feed(self, text: str) -> dict:
        """Add a generated piece; return its delta: {} or some of ``content`` (str), ``reasoning_content``
        (str), ``tool_calls`` (``[{"index", "id", "type", "function": {"name", "arguments"}}]`` for a call's
        first piece, ``[{"index", "function": {"arguments"}}]`` for later ones)."""
        if self._result is not None:
            raise RuntimeError("feed after finish")
        delta = _Delta()
        if text:
            self._buf += text
            self._fed += len(text)
            self._run(delta, final=False)
        return delta.out()

    def finish(self) -> ParsedOutput:
        """End of generation: release held text, turn an unclosed call into content, return the result
        (the same object on later calls)."""
        if self._result is None:
            delta = _Delta()
            self._run(delta, final=True)
            if self._span_from is not None:   # unclosed: the reasoning runs to the end
                self._leave_reasoning(self._fed)
            calls = self._calls or None
            content = self._content.text
            self._result = ParsedOutput(content=None if (not content and calls) else content,
                                        reasoning_content=self._reasoning.text or None,
                                        tool_calls=calls, delta=delta.out(), reasoning_spans=tuple(self._spans))
        return self._result

    def _run(self, delta: _Delta, final: bool) -> None:
        while True:
            mode, buf = self._mode, self._buf
            if mode == "start":  # a reply may open with <think> (skipped when the prompt opened it already)
                s = buf.lstrip()
                if s.startswith(THINK_OPEN):
                    self._enter_reasoning(self._at())
                    self._mode, self._buf = "reasoning", s[len(THINK_OPEN):]
                    continue
                if not final and THINK_OPEN.startswith(s):
                    return
                self._mode = self._after_start
                if self._mode == "reasoning":
                    self._enter_reasoning(self._at())
            elif mode == "reasoning":
                end, start = buf.find(THINK_CLOSE), buf.find(TOOL_OPEN) if self._calls_on else -1
                if start >= 0 and (end < 0 or start < end):   # a call inside the reasoning is a call
                    delta.reasoning += self._reasoning.add(buf[:start])
                    self._leave_reasoning(self._at(start))
                    self._open_call(buf[start + len(TOOL_OPEN):], "reasoning")
                    continue
                if end >= 0:
                    delta.reasoning += self._reasoning.add(buf[:end])
                    self._leave_reasoning(self._at(end + len(THINK_CLOSE)))
                    self._mode, self._buf = "content", buf[end + len(THINK_CLOSE):]
                    continue
                keep = 0 if final else held_suffix(buf, self._holds)
                delta.reasoning += self._reasoning.add(buf[:len(buf) - keep])
                self._buf = buf[len(buf) - keep:]
                return
            elif mode == "content":
                start = buf.find(TOOL_OPEN) if self._calls_on else -1
                if start >= 0:
                    delta.content += self._content.add(buf[:start])
                    self._open_call(buf[start + len(TOOL_OPEN):], "content")
                    continue
                keep = 0 if (final or not self._calls_on) else held_suffix(buf, (TOOL_OPEN,))
                delta.content += self._content.add(buf[:len(buf) - keep])
                self._buf = buf[len(buf) - keep:]
                return
            else:  # "tool": the open call takes everything
                call = self._call
                delta.tool(call.feed(buf))
                self._buf = ""
                if call.status == "open" and final:
                    call.finish()
                back = self._call_region
                if call.status == "done":
                    self._calls.append(call.call())
                    self._mode, self._buf, self._call = back, call.rest, None
                    if back == "reasoning":
                        self._enter_reasoning(self._at())
                elif call.status == "failed":  # its text is the region's; what follows <tool_call> is parsed again
                    if back == "reasoning":
                        delta.reasoning += self._reasoning.add(TOOL_OPEN)
                        self._enter_reasoning(self._call_at)
                    else:
                        delta.content += self._content.add(TOOL_OPEN)
                    self._mode, self._buf, self._call = back, call.body, None
                else:
                    return

    def _open_call(self, rest: str, region: str) -> None:
        """A ``<tool_call>`` opened in `region` ("content" or "reasoning"): the call takes `rest` next."""
        self._call_at = self._fed - len(rest) - len(TOOL_OPEN)
        self._call = ToolCallParser(self._allocate, self._types)
        self._call_region = region
        self._mode, self._buf = "tool", rest


def make_output_parser(family: str, tools: list | None = None, starts_in_reasoning: bool = False,
                       make_id: Callable[[int], str] | None = None, calls: bool = True) -> OutputParser:
    """A parser for one reply.

    Args:
        family: "qwen3_5" | "qwen3" (alias "qwen3_next") | "none".
        tools: the request's ``tools`` (OpenAI shape); their parameter schemas type Qwen3.5's XML values.
        starts_in_reasoning: the prompt ends inside ``<think>`` (see ``prompt_starts_in_reasoning``).
        make_id: index → tool-call id (default ``call_`` + 24 random hex digits).
        calls: recognise tool calls (False for ``tool_choice: "none"``: a ``<tool_call>`` is left in the text).
    Raises:
        ValueError: unknown family.
    """
    return OutputParser(family, tools, starts_in_reasoning, make_id, calls)


def count_in_spans(offsets: list[int], spans) -> int:
    """How many of `offsets` (character offsets, ascending: where each generated token's text starts in the text fed
    to the parser) fall inside one of `spans` (``ParsedOutput.reasoning_spans``: ``[start, end)``, ascending,
    disjoint): the reply's reasoning tokens. O(len(offsets) + len(spans))."""
    n, i = 0, 0
    for start, end in spans:
        while i < len(offsets) and offsets[i] < start:
            i += 1
        while i < len(offsets) and offsets[i] < end:
            n, i = n + 1, i + 1
    return n


def parse_output(text: str, family: str, tools: list | None = None, starts_in_reasoning: bool = False,
                 make_id: Callable[[int], str] | None = None) -> ParsedOutput:
    """Parse a whole reply at once (a non-streamed request)."""
    parser = make_output_parser(family, tools, starts_in_reasoning, make_id)
    parser.feed(text)
    return parser.finish()
