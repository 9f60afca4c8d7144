"""Requests, sampling parameters, finish reasons, and the commands/events between server and engine.

†: imports no torch. The server turns a wire op into a `Request` (token ids, never text: templates, tokenization
and stop strings live at the edge, DESIGN §2) and talks to the engine only through these types.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field


class FinishReason(str, enum.Enum):
    """Why a request ended; the values are the wire literals of DESIGN §5."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    TOOL_CALLS = "tool_calls"


class Priority(str, enum.Enum):
    """Request priority class (DESIGN §4.4): interactive ranks above agent."""

    INTERACTIVE = "interactive"
    AGENT = "agent"


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it before softmax.
    top_k: keep the k most likely tokens (0 = off). top_p: nucleus mass in (0, 1]. min_p: drop tokens whose
    probability is below min_p × the top probability (0 = off). seed: the request's own generator seed (None: random).
    max_tokens: generated-token cap (tokens). stop_token_ids: generation ends after emitting one of these.
    logprobs / top_logprobs: return the chosen token's log-probability and the K best alternatives (K ≤ 20).
    banned_token_ids: never sampled (their logits are −inf before the warpers). forced_token_ids: the first generated
    tokens, in order, taken instead of sampling (ignisd.text.tool_choice; logprobs still from the raw logits).
    logit_bias: (token id, bias) pairs added to the logits; presence_penalty / frequency_penalty: OpenAI's penalties
    on the tokens generated so far (ignisd.sampling.adjust_logits).
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    logprobs: bool = False
    top_logprobs: int = 0
    banned_token_ids: frozenset[int] = frozenset()
    forced_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    @property
    def penalized(self) -> bool:
        """The sampler needs the tokens generated so far (a presence or frequency penalty)."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax (temperature 0)."""
        return self.temperature == 0.0


@dataclass
class Request:
    """One generation request as the engine sees it.

    rid: engine-wide unique key (the server prefixes the client's id with its connection number). client_id: the
    front's id of the request, the one its log lines name (the socket op's id, an HTTP reply's id or the client's
    X-Request-Id); None for the daemon's own requests (the warm-up).
    prompt_ids: the rendered, tokenized prompt (token ids). prompt_logprobs: K for per-prompt-token logprobs
    (None: off).
    arrival: time.monotonic() seconds at submission (queue_ms counts from here).
    """

    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    priority: Priority = Priority.INTERACTIVE
    prompt_logprobs: int | None = None
    cache_prompt: bool = True
    arrival: float = field(default_factory=time.monotonic)
    # cut points (DESIGN §4.3): publish (page multiple, 0 = none) and opener (None = none) token positions;
    # cut_reason: why a cut is missing (ignis.reuse.reason literal) or None; after_user: the last message is a
    # real user message (the checkpoint then is the one "right after its last user message")
    publish: int = 0
    opener: int | None = None
    cut_reason: str | None = None
    after_user: bool = False
    client_id: str | None = None


# ---- commands (server -> engine) ----
@dataclass(frozen=True)
class Submit:
    """Queue `request` for admission."""

    request: Request


@dataclass(frozen=True)
class Cancel:
    """End request `rid` at the next round boundary with `reason` (cancelled, or stop when the edge saw a stop
    string)."""

    rid: str
    reason: FinishReason = FinishReason.CANCELLED


# ---- events (engine -> server) ----
@dataclass(frozen=True)
class TokenEvent:
    """One generated token. logprob: log p(token) from the raw logits (fp32 log-softmax), when asked.
    top: [(token_id, logprob)] × top_logprobs, descending. cached_tokens: on a request's first generated token only,
    the prompt tokens restored rather than prefilled (DESIGN §4.7; the DoneEvent's count, unless a preemption later
    makes the sequence recompute), so a stream's first event can report reuse; None on every other token."""

    rid: str
    token_id: int
    logprob: float | None = None
    top: list[tuple[int, float]] | None = None
    cached_tokens: int | None = None


@dataclass(frozen=True)
class AdmittedEvent:
    """Request `rid` was given a lane: cached_tokens of its prompt are restored rather than prefilled (DESIGN §4.7),
    as planned at admission (the DoneEvent's count, unless a restore fails or a preemption later makes the sequence
    recompute). Sent once, before the round that starts its prefill runs, so a front can report reuse before the
    first token (whose prefill may take seconds)."""

    rid: str
    cached_tokens: int


@dataclass(frozen=True)
class DoneEvent:
    """The request ended. Token counts are tokens; times are milliseconds.

    prompt_logprobs: one entry per prompt token (entry 0 None) when asked, else None.
    """

    rid: str
    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int
    prefilled_tokens: int
    generated_tokens: int
    queue_ms: float
    ttft_ms: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    prompt_logprobs: list | None = None
    reuse: "ReuseInfo | None" = None


@dataclass(frozen=True)
class ReuseInfo:
    """What the engine did about prompt reuse for one request (the engine side of ``ignis.reuse``, DESIGN §5).

    tier / kind: where and what it resumed from (None on a miss). cached_tokens: tokens restored. reason: None on a
    hit, else a wire reason literal. candidate_tokens / candidate_kind / candidate_tier / candidate_common: the best
    diverging retained state (its tokens, for ``diverged_at``) and how many tokens it shares with the prompt.
    """

    tier: str | None = None
    kind: str | None = None
    cached_tokens: int = 0
    reason: str | None = "miss"
    candidate_tokens: tuple[int, ...] | None = None
    candidate_kind: str | None = None
    candidate_tier: str | None = None
    candidate_common: int = 0


@dataclass(frozen=True)
class ErrorEvent:
    """The engine refused or failed the request; code is a wire error code (DESIGN §5)."""

    rid: str
    code: str
    message: str
    field: str | None = None


def context_message(prompt_tokens: int, context_tokens: int, max_tokens: int | None = None) -> str:
    """The message of a ``context_length`` refusal, worded with the phrases clients look for to trim or compact a
    conversation: OpenAI's "this model's maximum context length is N tokens" (litellm's ContextWindowExceededError)
    and Anthropic's "prompt is too long: N tokens > M maximum" (a prompt alone too long) or "input length and
    max_tokens exceed context limit: N + M > L" (with max_tokens). Tokens throughout."""
    if max_tokens is None:
        return (f"prompt is too long: {prompt_tokens} tokens > {context_tokens - 1} maximum (this model's maximum "
                f"context length is {context_tokens} tokens, one of which must be left to generate)")
    return (f"input length and max_tokens exceed context limit: {prompt_tokens} + {max_tokens} > {context_tokens} "
            f"(this model's maximum context length is {context_tokens} tokens); lower max_tokens or shorten the "
            "prompt")
