"""Prompts at the edge: chat bodies rendered with the model's template, tokenized with offsets and cut (DESIGN §2,
§4.3); completion prompts; the `tokenize` op; and the `ignis.reuse` report located in a prompt (DESIGN §5).

Front-independent: every front (the NDJSON socket, HTTP later) builds its prompts here. Request errors raise
`ignis_client.protocol.ProtocolError` naming the field. †: imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ignis_client import protocol as P
from ignis_client.divergence import diverged_at

from ignisd.log import get_logger
from ignisd.request import ReuseInfo
from ignisd.text.chat_template import prepare_messages
from ignisd.text.segments import CutPoints, cut_points
from ignisd.text.spans import message_at_char, message_spans
from ignisd.text.tool_canon import canonical_tools

log = get_logger("srv")


@dataclass
class Prompt:
    """A rendered, tokenized prompt with what reuse needs of it: text and per-token character offsets (None for a
    token-id completion prompt), the messages, tools and template kwargs it was rendered from (chat only), and its
    cut points."""

    ids: list[int]
    text: str | None = None
    offsets: list | None = None
    messages: list | None = None
    tools: list | None = None
    kwargs: dict | None = None
    cuts: CutPoints | None = None


@dataclass(frozen=True)
class Candidate:
    """`ignis.reuse.best_candidate`: the best retained state the prompt diverges from (tokens: its length)."""

    kind: str | None
    tier: str | None
    tokens: int


@dataclass(frozen=True)
class Divergence:
    """`ignis.reuse.diverged_at`: the first differing token and character of the prompt against the candidate,
    the message it lies in (index, role; None when not located) and ±40 characters of each side."""

    token: int | None
    message_index: int | None
    role: str | None
    char_offset: int
    ours: str
    theirs: str


@dataclass(frozen=True)
class Reuse:
    """`ignis.reuse` (DESIGN §5): where and what the request resumed from (None on a miss), the tokens restored, why
    it missed (a reason literal; None on a hit), the best diverging candidate and where it diverged."""

    tier: str | None
    kind: str | None
    cached_tokens: int
    reason: str | None
    best_candidate: Candidate | None = None
    diverged_at: Divergence | None = None


class Prompts:
    """Builds prompts for one tokenizer and chat template.

    tokenizer: ignisd.text.tokenizer.Tokenizer. template: ChatTemplate, or None when the model has none.
    developer_policy: server.developer_message_policy. canonicalize_tools: server.canonicalize_tools (tools sorted by
    name and schema keys sorted before rendering: ignisd.text.tool_canon); both may change while serving (SIGHUP).
    """

    def __init__(self, tokenizer, template, developer_policy: str, canonicalize_tools: bool = False):
        self.tok = tokenizer
        self.template = template
        self.developer_policy = developer_policy
        self.canonicalize_tools = canonicalize_tools

    def tools(self, op) -> list | None:
        """The tools of a chat op as the template gets them (canonical under server.canonicalize_tools); None for
        none."""
        tools = op.tools or None
        return canonical_tools(tools) if self.canonicalize_tools else tools

    def _messages(self, op) -> list[dict]:
        if self.template is None:
            raise P.ProtocolError("model_unsupported", "the model has no chat template; use the completion op",
                                  "messages")
        try:
            msgs = prepare_messages(op.messages, self.developer_policy)
        except ValueError as e:
            field, _, msg = str(e).partition(": ")
            raise P.ProtocolError(getattr(e, "code", "bad_request"), msg or str(e),
                                  field if msg else "messages") from None
        if op.tools and not self.template.uses("tools"):
            raise P.ProtocolError("model_unsupported", "this model's chat template does not render tools", "tools")
        if not self.template.reads("tool_calls"):
            for i, m in enumerate(op.messages):
                if m.get("tool_calls"):
                    raise P.ProtocolError("model_unsupported", "this model's chat template does not render an "
                                          "assistant message's tool_calls", f"messages[{i}].tool_calls")
        return msgs

    def render(self, op, add_generation_prompt: bool = True) -> tuple[list[dict], dict, str]:
        """(messages as the template got them, template kwargs, rendered text) of a chat body. An assistant
        `content: null` (OpenAI's, beside tool_calls) is rendered as "" when the template cannot take it."""
        msgs = self._messages(op)
        kwargs = dict(op.chat_template_kwargs or {})
        try:
            text = self._render(msgs, op, add_generation_prompt, kwargs)
        except P.ProtocolError:
            nulls = [i for i, m in enumerate(msgs) if m.get("role") == "assistant" and m.get("content") is None]
            if not nulls:
                raise
            msgs = [dict(m, content="") if i in nulls else m for i, m in enumerate(msgs)]
            text = self._render(msgs, op, add_generation_prompt, kwargs)
        return msgs, kwargs, text

    def _render(self, msgs, op, add_generation_prompt: bool, kwargs: dict) -> str:
        try:
            return self.template.render(msgs, tools=self.tools(op), add_generation_prompt=add_generation_prompt,
                                        **kwargs)
        except Exception as e:  # jinja2 raise_exception() and template errors are the request's fault
            raise P.ProtocolError("bad_request", f"chat template: {e}", "messages") from None

    def _spans(self, msgs, text, tools, kwargs, only, add_generation_prompt: bool = True):
        try:
            return message_spans(self.template, msgs, text, tools=tools, only=only,
                                 add_generation_prompt=add_generation_prompt, **kwargs)
        except Exception as e:  # a template that cannot be probed leaves the prompt without cut points
            log.warning("message_spans_failed", error=repr(e))
            return None

    def chat(self, op) -> Prompt:
        """Render, tokenize with offsets, and find the cut points (DESIGN §4.3) of a chat body."""
        msgs, kwargs, text = self.render(op)
        ids, offsets = self.tok.encode_with_offsets(text)
        tools = self.tools(op)
        spans = self._spans(msgs, text, tools, kwargs, "cuts")
        cuts = cut_points(text, ids, offsets, spans) if spans is not None else None
        return Prompt(ids, text, offsets, msgs, tools, kwargs, cuts)

    def check_ids(self, ids, field: str) -> None:
        """Raise ProtocolError naming `field[i]` for the first token id outside the vocabulary."""
        v = self.tok.vocab_size
        for i, t in enumerate(ids):
            if not 0 <= t < v:
                raise P.ProtocolError("bad_request", f"token id {t} is outside the vocabulary [0, {v})",
                                      f"{field}[{i}]")

    def completion(self, op) -> Prompt:
        """A completion prompt: text is tokenized without special-token insertion; token ids are checked."""
        if isinstance(op.prompt, str):
            return Prompt(self.tok.encode(op.prompt), text=op.prompt)
        self.check_ids(op.prompt, "prompt")
        return Prompt(list(op.prompt))

    def tokenize(self, op) -> dict:
        """The `tokenize` op's result: tokens, offsets, text, and for chat bodies message spans and cut points."""
        if op.text is not None:
            text = op.text
        else:
            msgs, kwargs, text = self.render(op.chat, op.add_generation_prompt)
        ids, offsets = self.tok.encode_with_offsets(text)
        out = {"tokens": ids, "offsets": [list(o) for o in offsets], "text": text}
        if op.text is None:
            spans = self._spans(msgs, text, self.tools(op.chat), kwargs, None, op.add_generation_prompt)
            if spans is None:
                out["messages"] = [{"role": str(m.get("role")), "start": None, "end": None} for m in msgs]
                out["cut_points"] = {"publish": 0, "opener": None}
            else:
                out["messages"] = spans.wire()
                out["cut_points"] = cut_points(text, ids, offsets, spans).wire()
        return out

    def reuse(self, ri: ReuseInfo, cached_tokens: int, prompt: Prompt) -> Reuse:
        """The request's reuse report from the engine's ReuseInfo; diverged_at is located in the prompt's rendered
        text and messages (best effort: a failure to locate it leaves it None)."""
        best = div = None
        if ri.candidate_tokens is not None:
            cand = list(ri.candidate_tokens)
            best = Candidate(ri.candidate_kind, ri.candidate_tier, len(cand))
            try:
                theirs = prompt.text if prompt.text is not None else self.tok.decode(prompt.ids)
                d = diverged_at(cand, prompt.ids, self.tok.decode(cand), theirs, prompt.offsets,
                                token=ri.candidate_common)
                if d is not None and prompt.messages:
                    span = message_at_char(self.template, prompt.messages, prompt.text, d["char_offset"],
                                           tools=prompt.tools, **(prompt.kwargs or {}))
                    d["message_index"] = span.index if span else None
                    d["role"] = span.role if span else None
                div = Divergence(**d) if d is not None else None
            except Exception as e:  # the report is best effort; never fail a finished request over it
                log.warning("diverged_at_failed", error=repr(e))
                div = None
        hit = ri.kind is not None and cached_tokens > 0
        return Reuse(tier=ri.tier if hit else None, kind=ri.kind if hit else None, cached_tokens=cached_tokens,
                     reason=None if hit else (ri.reason or "miss"), best_candidate=best, diverged_at=div)
