"""The ignis wire protocol (DESIGN §5): the single source of framing, request parsing and reply shapes.

One JSON object per line (UTF-8, ``\\n``-terminated) in both directions. The daemon's server and the clients both
import this module; it uses only the standard library and orjson (†: no torch).

Requests: ``decode_line`` (bytes → dict, framing errors) then ``parse_request`` (dict → one of the ``*Op``
dataclasses, validation errors). Every failure raises ``ProtocolError(code, message, field)``; its ``reply()`` is
the error object to send. Replies: ``delta``, ``done``, ``result``, ``error`` build dicts, ``encode`` frames one.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Union

import orjson

OPS = ("chat", "completion", "cancel", "tokenize", "detokenize", "health", "status", "metrics", "reset")
SIMPLE_OPS = ("health", "status", "metrics", "reset")
ERROR_CODES = ("bad_json", "bad_request", "unknown_op", "duplicate_id", "too_long", "context_length", "auth", "busy",
               "model_unsupported", "internal")
FINISH_REASONS = ("stop", "length", "cancelled", "tool_calls")
ROLES = ("system", "user", "assistant", "tool", "developer")
PRIORITIES = ("interactive", "agent")
TIERS = ("device", "ram", "disk")
KINDS = ("prefix", "checkpoint")
REUSE_REASONS = ("miss", "short", "below_page", "stamp_mismatch", "reuse_off", "prompt_logprobs", "no_slot",
                 "cut_unaligned")
DEFAULT_MAX_LINE_BYTES = 16 * 2**20
MAX_ID_CHARS = 128
MAX_STOP = 16
MAX_TOP_LOGPROBS = 20
MAX_TOKENS_LIMIT = 2**31 - 1
SYSTEM_SOCKET_PATH = "/run/ignis/ignisd.sock"


class ProtocolError(Exception):
    """A request that cannot be served as sent. code: one of ERROR_CODES; field: path such as ``messages[2].role``;
    id: the request id once the envelope parsed (None for framing errors)."""

    def __init__(self, code: str, message: str, field: str | None = None, id: str | None = None):
        if code not in ERROR_CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code, self.message, self.field, self.id = code, message, field, id

    def reply(self) -> dict:
        """The ``error`` reply object for this failure."""
        return error(self.id, self.code, self.message, self.field)


def _bad(field: str, message: str) -> ProtocolError:
    return ProtocolError("bad_request", f"{field}: {message}", field)


# ---------------------------------------------------------------- framing

def decode_line(line: bytes, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> dict:
    """Parse one request line (bytes without its ``\\n``; a trailing ``\\r`` is JSON whitespace) into a dict.

    Raises ProtocolError with id None: ``too_long`` when len(line) > max_line_bytes; ``bad_json`` for invalid
    UTF-8, invalid JSON, or JSON that is not an object. The caller keeps the connection in every case.
    """
    if len(line) > max_line_bytes:
        raise ProtocolError("too_long", f"line of {len(line)} bytes exceeds the limit of {max_line_bytes} bytes "
                                        "(server.max_line_bytes)")
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        raise ProtocolError("bad_json", f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("bad_json", f"a request must be a JSON object, got {_json_type(obj)}")
    return obj


def encode(obj: Any) -> bytes:
    """Serialise one reply or request as a framed line: compact UTF-8 JSON + ``b"\\n"``."""
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "an array"
    return "an object"


# ---------------------------------------------------------------- field checkers

def _int(v: Any, f: str, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        raise _bad(f, f"must be an integer {rng}, got {v!r}")
    return v


def _num(v: Any, f: str, lo: float, hi: float, lo_open: bool = False) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v > hi or v < lo or (lo_open and v == lo):
        raise _bad(f, f"must be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def _bool(v: Any, f: str) -> bool:
    if not isinstance(v, bool):
        raise _bad(f, f"must be true or false, got {v!r}")
    return v


def _str(v: Any, f: str) -> str:
    if not isinstance(v, str):
        raise _bad(f, f"must be a string, got {_json_type(v)}")
    return v


def _obj(v: Any, f: str) -> dict:
    if not isinstance(v, dict):
        raise _bad(f, f"must be an object, got {_json_type(v)}")
    return v


def _list(v: Any, f: str) -> list:
    if not isinstance(v, list):
        raise _bad(f, f"must be an array, got {_json_type(v)}")
    return v


def _choice(v: Any, f: str, options: tuple[str, ...]) -> str:
    if not isinstance(v, str) or v not in options:
        raise _bad(f, f"must be one of {', '.join(options)}; got {v!r}")
    return v


def _opt(obj: dict, key: str, default: Any, check, *args) -> Any:
    v = obj.get(key)
    return default if v is None else check(v, key, *args)


def _token_ids(v: Any, f: str, non_empty: bool) -> list[int]:
    _list(v, f)
    if non_empty and not v:
        raise _bad(f, "must not be empty")
    for i, t in enumerate(v):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise _bad(f"{f}[{i}]", f"must be a non-negative integer token id, got {t!r}")
    return v


# ---------------------------------------------------------------- ops

@dataclass(frozen=True)
class Sampling:
    """Sampling fields shared by chat and completion. temperature 0 = greedy; top_k 0 = off; seed None = random;
    max_tokens None = the server's default_max_tokens; stop: up to 16 non-empty strings."""
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class ChatOp:
    """``chat``: messages are the validated OpenAI message dicts, passed through unmodified (tool_calls arguments
    may still be JSON strings; content may be a list of parts)."""
    op: ClassVar[str] = "chat"
    id: str
    messages: list[dict]
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    sampling: Sampling = field(default_factory=Sampling)
    stream: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    chat_template_kwargs: dict = field(default_factory=dict)
    priority: str = "interactive"
    cache_prompt: bool = True
    api_key: str | None = None


@dataclass(frozen=True)
class CompletionOp:
    """``completion``: prompt is text or a non-empty list of token ids; prompt_logprobs K (0..20) or None."""
    op: ClassVar[str] = "completion"
    id: str
    prompt: str | list[int]
    sampling: Sampling = field(default_factory=Sampling)
    stream: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: int | None = None
    priority: str = "interactive"
    cache_prompt: bool = True
    api_key: str | None = None


@dataclass(frozen=True)
class CancelOp:
    """``cancel``: target is the id of an in-flight request of the same connection."""
    op: ClassVar[str] = "cancel"
    id: str
    target: str
    api_key: str | None = None


@dataclass(frozen=True)
class TokenizeOp:
    """``tokenize``: exactly one of text (tokenize as is) or chat (a chat body to render with the template)."""
    op: ClassVar[str] = "tokenize"
    id: str
    text: str | None = None
    chat: ChatOp | None = None
    add_generation_prompt: bool = True
    api_key: str | None = None


@dataclass(frozen=True)
class DetokenizeOp:
    """``detokenize``: tokens → text."""
    op: ClassVar[str] = "detokenize"
    id: str
    tokens: list[int]
    api_key: str | None = None


@dataclass(frozen=True)
class SimpleOp:
    """``health`` / ``status`` / ``metrics`` / ``reset``: no fields besides the envelope."""
    id: str
    op: str
    api_key: str | None = None


Op = Union[ChatOp, CompletionOp, CancelOp, TokenizeOp, DetokenizeOp, SimpleOp]


def parse_envelope(obj: dict) -> tuple[str, str]:
    """Check ``id`` (string of 1..128 chars) and ``op`` (a known op) and return them.

    Raises ProtocolError bad_request field "id" (id None) or, with the id, bad_request/unknown_op field "op".
    """
    rid = obj.get("id")
    if not isinstance(rid, str) or not 1 <= len(rid) <= MAX_ID_CHARS:
        what = "missing" if rid is None else f"got {_json_type(rid)}" if not isinstance(rid, str) \
            else f"got {len(rid)} characters"
        raise ProtocolError("bad_request", f"id: must be a string of 1 to {MAX_ID_CHARS} characters; {what}", "id")
    op = obj.get("op")
    if not isinstance(op, str):
        raise ProtocolError("bad_request", f"op: must be a string naming the operation, one of {', '.join(OPS)}",
                            "op", rid)
    if op not in OPS:
        raise ProtocolError("unknown_op", f"op: unknown operation {op[:64]!r}; known: {', '.join(OPS)}", "op", rid)
    return rid, op


def parse_request(obj: dict) -> Op:
    """Validate a decoded request and return its op dataclass. Unknown fields are ignored.

    Raises ProtocolError (bad_request / unknown_op) naming the field path; its id is the request's id when the
    envelope was valid.
    """
    rid, op = parse_envelope(obj)
    try:
        key = obj.get("api_key")
        api_key = None if key is None else _str(key, "api_key")
        if op == "chat":
            return _parse_chat(rid, obj, api_key)
        if op == "completion":
            return _parse_completion(rid, obj, api_key)
        if op == "cancel":
            t = obj.get("target")
            if not isinstance(t, str) or not 1 <= len(t) <= MAX_ID_CHARS:
                raise _bad("target", f"must be the id (string of 1 to {MAX_ID_CHARS} characters) of an in-flight "
                                     f"request, got {t!r}")
            return CancelOp(rid, t, api_key)
        if op == "tokenize":
            return _parse_tokenize(rid, obj, api_key)
        if op == "detokenize":
            if "tokens" not in obj:
                raise _bad("tokens", "required (a list of token ids)")
            return DetokenizeOp(rid, _token_ids(obj["tokens"], "tokens", non_empty=False), api_key)
        return SimpleOp(rid, op, api_key)
    except ProtocolError as e:
        e.id = rid
        raise


def parse_sampling(obj: dict) -> Sampling:
    """The sampling fields of a chat or completion body (``max_completion_tokens`` is OpenAI's newer name)."""
    mt = _opt(obj, "max_tokens", None, _int, 1, MAX_TOKENS_LIMIT)
    mct = _opt(obj, "max_completion_tokens", None, _int, 1, MAX_TOKENS_LIMIT)
    if mt is not None and mct is not None and mt != mct:
        raise _bad("max_completion_tokens", f"conflicts with max_tokens ({mct} != {mt}); send one of them")
    if "n" in obj and obj["n"] is not None and obj["n"] != 1:
        raise _bad("n", f"only n=1 is supported, got {obj['n']!r}")
    stop = obj.get("stop")
    if stop is None:
        stops: list[str] = []
    elif isinstance(stop, str):
        if not stop:
            raise _bad("stop", "must not be an empty string")
        stops = [stop]
    else:
        _list(stop, "stop")
        if len(stop) > MAX_STOP:
            raise _bad("stop", f"at most {MAX_STOP} stop strings, got {len(stop)}")
        for i, s in enumerate(stop):
            if not isinstance(s, str) or not s:
                raise _bad(f"stop[{i}]", f"must be a non-empty string, got {s!r}")
        stops = list(stop)
    return Sampling(
        max_tokens=mt if mt is not None else mct,
        temperature=_opt(obj, "temperature", 1.0, _num, 0.0, 2.0),
        top_p=_opt(obj, "top_p", 1.0, _num, 0.0, 1.0, True),
        top_k=_opt(obj, "top_k", 0, _int, 0, MAX_TOKENS_LIMIT),
        min_p=_opt(obj, "min_p", 0.0, _num, 0.0, 1.0),
        seed=_opt(obj, "seed", None, _int, -(2**63), 2**64 - 1),
        stop=stops,
    )


def _logprob_fields(obj: dict, legacy_int: bool) -> tuple[bool, int]:
    lp = obj.get("logprobs")
    top = _opt(obj, "top_logprobs", None, _int, 0, MAX_TOP_LOGPROBS)
    if legacy_int and isinstance(lp, int) and not isinstance(lp, bool):  # legacy completions: logprobs = top count
        n = _int(lp, "logprobs", 0, MAX_TOP_LOGPROBS)
        return True, n if top is None else top
    logprobs = False if lp is None else _bool(lp, "logprobs")
    if top and not logprobs:
        raise _bad("top_logprobs", "requires logprobs: true")
    return logprobs, top or 0


def _common(obj: dict) -> dict:
    return dict(stream=_opt(obj, "stream", False, _bool),
                priority=_opt(obj, "priority", "interactive", _choice, PRIORITIES),
                cache_prompt=_opt(obj, "cache_prompt", True, _bool))


def parse_messages(v: Any) -> list[dict]:
    """Validate an OpenAI ``messages`` array (field paths ``messages[i].role`` etc.) and return it unchanged."""
    if v is None:
        raise _bad("messages", "required (a non-empty array of messages)")
    _list(v, "messages")
    if not v:
        raise _bad("messages", "must not be empty")
    for i, m in enumerate(v):
        p = f"messages[{i}]"
        _obj(m, p)
        role = m.get("role")
        if role is None:
            raise _bad(f"{p}.role", f"required; one of {', '.join(ROLES)}")
        _choice(role, f"{p}.role", ROLES)
        tool_calls = m.get("tool_calls")
        if tool_calls is not None:
            if role != "assistant":
                raise _bad(f"{p}.tool_calls", "only assistant messages carry tool_calls")
            _check_tool_calls(tool_calls, f"{p}.tool_calls")
        content = m.get("content")
        if content is None:
            if not (role == "assistant" and tool_calls):
                raise _bad(f"{p}.content", "required (a string or a list of content parts); may be null only for "
                                           "an assistant message with tool_calls")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                q = f"{p}.content[{j}]"
                _obj(part, q)
                _str(part.get("type"), f"{q}.type")
                if part["type"] == "text":
                    _str(part.get("text"), f"{q}.text")
        elif not isinstance(content, str):
            raise _bad(f"{p}.content", f"must be a string, a list of content parts or null, got {_json_type(content)}")
        for k in ("name", "tool_call_id", "reasoning_content"):
            if m.get(k) is not None:
                _str(m[k], f"{p}.{k}")
    return v


def _check_tool_calls(v: Any, p: str) -> None:
    _list(v, p)
    for j, tc in enumerate(v):
        q = f"{p}[{j}]"
        _obj(tc, q)
        fn = _obj(tc.get("function"), f"{q}.function")
        _str(fn.get("name"), f"{q}.function.name")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = orjson.loads(args) if args.strip() else {}
            except orjson.JSONDecodeError as e:
                raise _bad(f"{q}.function.arguments", f"is a string but not valid JSON: {e}") from None
        if args is not None and not isinstance(args, dict):
            raise _bad(f"{q}.function.arguments", "must be a JSON object or a string holding one")


def _parse_tools(obj: dict) -> list[dict] | None:
    tools = obj.get("tools")
    if tools is None:
        return None
    _list(tools, "tools")
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        _obj(t, p)
        if t.get("type", "function") != "function":
            raise _bad(f"{p}.type", f"must be \"function\", got {t.get('type')!r}")
        fn = _obj(t.get("function"), f"{p}.function")
        _str(fn.get("name"), f"{p}.function.name")
        if fn.get("parameters") is not None:
            _obj(fn["parameters"], f"{p}.function.parameters")
    return tools


def _parse_chat(rid: str, obj: dict, api_key: str | None) -> ChatOp:
    messages = parse_messages(obj.get("messages"))
    tools = _parse_tools(obj)
    tc = obj.get("tool_choice")
    if tc is not None and not (isinstance(tc, str) and tc in ("none", "auto", "required")):
        fn = _obj(tc, "tool_choice").get("function")
        _str(_obj(fn, "tool_choice.function").get("name"), "tool_choice.function.name")
    logprobs, top = _logprob_fields(obj, legacy_int=False)
    return ChatOp(id=rid, messages=messages, tools=tools, tool_choice=tc, sampling=parse_sampling(obj),
                  logprobs=logprobs, top_logprobs=top,
                  chat_template_kwargs=_opt(obj, "chat_template_kwargs", {}, _obj), api_key=api_key, **_common(obj))


def _parse_completion(rid: str, obj: dict, api_key: str | None) -> CompletionOp:
    prompt = obj.get("prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise _bad("prompt", "must not be empty")
    elif isinstance(prompt, list):
        _token_ids(prompt, "prompt", non_empty=True)
    else:
        raise _bad("prompt", "required: a non-empty string or a non-empty list of token ids"
                   + ("" if prompt is None else f", got {_json_type(prompt)}"))
    logprobs, top = _logprob_fields(obj, legacy_int=True)
    return CompletionOp(id=rid, prompt=prompt, sampling=parse_sampling(obj), logprobs=logprobs, top_logprobs=top,
                        prompt_logprobs=_opt(obj, "prompt_logprobs", None, _int, 0, MAX_TOP_LOGPROBS),
                        api_key=api_key, **_common(obj))


def _parse_tokenize(rid: str, obj: dict, api_key: str | None) -> TokenizeOp:
    text, messages = obj.get("text"), obj.get("messages")
    if text is not None and messages is not None:
        raise _bad("text", "give either text or messages (a chat body), not both")
    agp = _opt(obj, "add_generation_prompt", True, _bool)
    if text is not None:
        return TokenizeOp(rid, text=_str(text, "text"), add_generation_prompt=agp, api_key=api_key)
    if messages is None:
        raise _bad("text", "required: text, or messages (a chat body)")
    return TokenizeOp(rid, chat=_parse_chat(rid, obj, api_key), add_generation_prompt=agp, api_key=api_key)


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


def error(id: str | None, code: str, message: str, field: str | None = None) -> dict:
    """An ``error`` reply; id None when the line did not parse. Raises ValueError on an unknown code."""
    if code not in ERROR_CODES:
        raise ValueError(f"unknown error code {code!r}")
    return {"id": id, "type": "error", "error": {"code": code, "message": message, "field": field}}


def empty_status() -> dict:
    """The ``status`` result with every field of §5 present and zero; the server fills in what exists."""
    return {"model": {"name": "", "arch": "", "kv_format": "", "context_tokens": 0, "page_tokens": 0,
                      "page_bytes": 0, "state_bytes": 0},
            "lanes": {"total": 0, "prefill": 0, "decode": 0, "evicted": 0},
            "queue": {"waiting": 0},
            "kv_pool": {"pages_total": 0, "pages_free": 0, "pages_live": 0, "pages_retained": 0},
            "slots": {"device_total": 0, "device_free": 0, "host_total": 0, "host_free": 0},
            "tiers": [], "retained": [], "requests": []}


# ---------------------------------------------------------------- socket path

def resolve_socket_path(env: Mapping[str, str] | None = None, system_path: str = SYSTEM_SOCKET_PATH) -> str:
    """The daemon's socket path (DESIGN §6), resolved identically by daemon and clients:
    $IGNIS_SOCKET, else $RUNTIME_DIRECTORY/ignisd.sock (first entry), else system_path if it exists, else
    $XDG_RUNTIME_DIR/ignis/ignisd.sock, else /tmp/ignis-$UID/ignisd.sock (UID of this process)."""
    env = os.environ if env is None else env
    if env.get("IGNIS_SOCKET"):
        return env["IGNIS_SOCKET"]
    if env.get("RUNTIME_DIRECTORY"):
        return os.path.join(env["RUNTIME_DIRECTORY"].split(":")[0], "ignisd.sock")
    if os.path.exists(system_path):
        return system_path
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "ignis", "ignisd.sock")
    return f"/tmp/ignis-{os.getuid()}/ignisd.sock"
