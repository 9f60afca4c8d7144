"""Reply builders of the ignis wire protocol (DESIGN §5): ``delta``, ``done`` and its parts, ``result``, ``error``,
``empty_status``. Each returns the plain dict to frame with ``encode``.

Re-exported by ``protocol``, the one import point. Standard library only (†: no torch).
"""
from __future__ import annotations

from .wire import FINISH_REASONS, KINDS, REUSE_REASONS, TIERS, error  # noqa: F401  (error: built beside ProtocolError)


# ---------------------------------------------------------------- replies

def delta(id: str, text: str, logprobs: list | None = None, reasoning_content: str | None = None,
          tool_calls: list | None = None) -> dict:
    """A streamed ``delta`` event; optional keys appear only when given."""
    out: dict = {"id": id, "type": "delta", "text": text}
    if logprobs is not None:
        out["logprobs"] = logprobs
    if reasoning_content is not None:
        out["reasoning_content"] = reasoning_content
    if tool_calls is not None:
        out["tool_calls"] = tool_calls
    return out


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """The OpenAI ``usage`` object (total = prompt + completion; cached_tokens ≤ prompt_tokens, §4.7)."""
    if not 0 <= cached_tokens <= prompt_tokens:
        raise ValueError(f"cached_tokens {cached_tokens} outside [0, prompt_tokens={prompt_tokens}]")
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


TIMING_KEYS = ("queue_ms", "load_ms", "ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s")


def timings(queue_ms: float = 0.0, load_ms: float = 0.0, ttft_ms: float = 0.0, prefill_tokens_per_s: float = 0.0,
            decode_tokens_per_s: float = 0.0) -> dict:
    """The ``timings`` object of ``done`` (milliseconds and tokens per second)."""
    return {"queue_ms": queue_ms, "load_ms": load_ms, "ttft_ms": ttft_ms,
            "prefill_tokens_per_s": prefill_tokens_per_s, "decode_tokens_per_s": decode_tokens_per_s}


def reuse(tier: str | None = None, kind: str | None = None, cached_tokens: int = 0, reason: str | None = "miss",
          best_candidate: dict | None = None, diverged_at: dict | None = None) -> dict:
    """The ``ignis.reuse`` object (§5). Raises ValueError for a tier/kind/reason outside the literals."""
    if tier is not None and tier not in TIERS or kind is not None and kind not in KINDS:
        raise ValueError(f"bad reuse tier/kind {tier!r}/{kind!r}")
    if reason is not None and reason not in REUSE_REASONS:
        raise ValueError(f"bad reuse reason {reason!r}")
    return {"tier": tier, "kind": kind, "cached_tokens": cached_tokens, "reason": reason,
            "best_candidate": best_candidate, "diverged_at": diverged_at}


def empty_reuse(reason: str = "miss") -> dict:
    """``ignis.reuse`` for a request that restored nothing: tier/kind null, cached_tokens 0."""
    return reuse(reason=reason)


def chat_message(content: str | None, reasoning_content: str | None = None, tool_calls: list | None = None) -> dict:
    """The assistant ``message`` of a chat ``done``."""
    return {"role": "assistant", "content": content, "reasoning_content": reasoning_content, "tool_calls": tool_calls}


def done(id: str, text: str, finish_reason: str, usage: dict, timings: dict, reuse: dict,
         message: dict | None = None, logprobs: list | None = None, prompt_logprobs: list | None = None) -> dict:
    """The final ``done`` reply. message: chat only; logprobs / prompt_logprobs only when asked.
    Raises ValueError on a finish_reason outside FINISH_REASONS or an incomplete usage/timings/reuse object."""
    if finish_reason not in FINISH_REASONS:
        raise ValueError(f"bad finish_reason {finish_reason!r}")
    if "cached_tokens" not in usage.get("prompt_tokens_details", {}) or "total_tokens" not in usage:
        raise ValueError(f"incomplete usage {usage!r}")
    if any(k not in timings for k in TIMING_KEYS) or "reason" not in reuse:
        raise ValueError("incomplete timings or reuse object")
    out: dict = {"id": id, "type": "done", "text": text, "finish_reason": finish_reason, "usage": usage,
                 "timings": timings, "ignis": {"reuse": reuse}}
    if message is not None:
        out["message"] = message
    if logprobs is not None:
        out["logprobs"] = logprobs
    if prompt_logprobs is not None:
        out["prompt_logprobs"] = prompt_logprobs
    return out


def result(id: str, result: dict) -> dict:
    """The one reply of a non-generating op."""
    return {"id": id, "type": "result", "result": result}


def empty_status() -> dict:
    """The ``status`` result with every field of §5 present and zero; the server fills in what exists."""
    return {"model": {"name": "", "arch": "", "kv_format": "", "context_tokens": 0, "page_tokens": 0,
                      "page_bytes": 0, "state_bytes": 0, "prefill_tokens_per_s": 0.0},
            "lanes": {"total": 0, "prefill": 0, "decode": 0, "evicted": 0},
            "queue": {"waiting": 0},
            "kv_pool": {"pages_total": 0, "pages_free": 0, "pages_live": 0, "pages_retained": 0},
            "slots": {"device_total": 0, "device_free": 0, "host_total": 0, "host_free": 0},
            "tiers": [], "retained": [], "requests": []}
