"""The typed edge events (DESIGN §2): what ``ignisd.edge.Edge.stream`` yields and every front renders in its own
wire shape — ``EdgeDelta`` (streamed output), then one ``EdgeDone`` (text, finish reason, ``Usage``, ``Timings``,
reuse report, chat message, logprobs) or one ``EdgeError`` — and the records they carry. Plain frozen dataclasses,
no wire dicts. †: imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ignisd.prompt import Reuse
from ignisd.request import FinishReason


@dataclass(frozen=True)
class TopLogprob:
    """One alternative of a generated token: its text, id and log-probability."""

    token: str
    token_id: int
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's text, id, log-probability (raw logits, fp32 log-softmax) and its best alternatives."""

    token: str
    token_id: int
    logprob: float | None
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class ToolCallPiece:
    """A streamed piece of tool call `index`: its first piece carries `id` and `name`, later ones only more of the
    JSON `arguments` string (id and name None)."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class ToolCall:
    """A finished tool call: id, function name, arguments as a JSON string."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatMessage:
    """The assistant message of a chat reply: content (None when empty and the reply made tool calls), the
    reasoning (None when empty) and the tool calls (None when none)."""

    content: str | None
    reasoning_content: str | None
    tool_calls: tuple[ToolCall, ...] | None


@dataclass(frozen=True)
class EdgeDelta:
    """Newly generated output of a streaming request: visible text (may be ""), reasoning, tool-call pieces and
    the logprobs of the tokens consumed since the previous delta (None where there is none or none was asked)."""

    text: str
    reasoning_content: str | None = None
    tool_calls: tuple[ToolCallPiece, ...] | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclass(frozen=True)
class Usage:
    """Token counts of a finished request (DESIGN §4.7): cached_tokens are the prompt tokens restored;
    reasoning_tokens, of the completion_tokens, those whose text starts in the reply's reasoning as the chat output
    parser splits it (``ParsedOutput.reasoning_spans``: the ``<think>``…``</think>`` block, its tags included, a tool
    call made inside it not); 0 for a completion and for models without reasoning."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    reasoning_tokens: int = 0


@dataclass(frozen=True)
class Timings:
    """Times of a finished request: milliseconds, and tokens per second (unrounded)."""

    queue_ms: float
    load_ms: float
    ttft_ms: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float


@dataclass(frozen=True)
class EdgeDone:
    """The end of a request: the full generated text, why it ended, usage, timings, the reuse report, the chat
    message (None for completion), the generated tokens' logprobs and the prompt's (None unless asked)."""

    text: str
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    reuse: Reuse
    message: ChatMessage | None = None
    logprobs: tuple[TokenLogprob, ...] | None = None
    prompt_logprobs: list | None = None


@dataclass(frozen=True)
class EdgeError:
    """The engine refused or failed the request: a wire error code (DESIGN §5), a message, the field it names."""

    code: str
    message: str
    field: str | None = None


EdgeEvent = EdgeDelta | EdgeDone | EdgeError
