"""The base of the ignis wire protocol (DESIGN §5): the literals, ``ProtocolError``, line framing and the field
checkers that request parsing is built from.

Imported by ``ops`` and ``replies`` and re-exported by ``protocol`` (the one import point); it imports neither, so
there is no import cycle. Standard library and orjson only (†: no torch).
"""
from __future__ import annotations

import math
from typing import Any

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


def error(id: str | None, code: str, message: str, field: str | None = None) -> dict:
    """An ``error`` reply; id None when the line did not parse. Raises ValueError on an unknown code."""
    if code not in ERROR_CODES:
        raise ValueError(f"unknown error code {code!r}")
    return {"id": id, "type": "error", "error": {"code": code, "message": message, "field": field}}


def _bad(field: str, message: str) -> ProtocolError:
    return ProtocolError("bad_request", f"{field}: {message}", field)


# ---------------------------------------------------------------- framing

def decode_line(line: bytes, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, what: str = "line") -> dict:
    """Parse one request line (bytes without its ``\\n``; a trailing ``\\r`` is JSON whitespace) into a dict.
    ``what`` names the bytes in the messages: "line" on the socket, "body" for an HTTP request body.

    Raises ProtocolError with id None: ``too_long`` when len(line) > max_line_bytes; ``bad_json`` for invalid
    UTF-8, invalid JSON, or JSON that is not an object. The caller keeps the connection in every case.
    """
    if len(line) > max_line_bytes:
        raise ProtocolError("too_long", f"{what} of {len(line)} bytes exceeds the limit of {max_line_bytes} bytes "
                                        "(server.max_line_bytes)")
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as e:
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as u:
            raise ProtocolError("bad_json", f"the {what} is not valid UTF-8 (byte {u.start}: {u.reason})") from None
        raise ProtocolError("bad_json", f"invalid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("bad_json", f"a request must be a JSON object, got {_json_type(obj)}")
    return obj


def encode(obj: Any, int_keys: bool = False) -> bytes:
    """Serialise one reply or request as a framed line: compact UTF-8 JSON + ``b"\\n"``. int_keys: write int object
    keys as their decimal strings (a client's ``logit_bias={12: -100}``, as json.dumps does); other non-str keys
    still raise orjson.JSONEncodeError. Objects with only str keys take the plain path (no walk of the object)."""
    try:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
    except orjson.JSONEncodeError:
        if not int_keys or _odd_keys(obj):
            raise
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS) + b"\n"


def _odd_keys(v: Any) -> bool:
    """Whether an object under `v` has a key other than a str or an int (OPT_NON_STR_KEYS would write it)."""
    if isinstance(v, dict):
        return any(not isinstance(k, (str, int)) or isinstance(k, bool) or _odd_keys(x) for k, x in v.items())
    return isinstance(v, (list, tuple)) and any(_odd_keys(x) for x in v)


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

def _shown(v: Any, limit: int = 80) -> str:
    """`v` as JSON spells it (true, null, "text"), cut to `limit` characters with "…": the value a client sent,
    in its own language. Python's repr where JSON has no spelling (a non-finite float from a Python caller)."""
    if isinstance(v, float) and not math.isfinite(v):      # orjson would write null
        text = repr(v)
    else:
        try:
            text = orjson.dumps(v).decode()
        except TypeError:
            text = repr(v)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _int(v: Any, f: str, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f"between {lo} and {hi}" if hi is not None else f">= {lo}"
        if isinstance(v, float) and math.isfinite(v) and v.is_integer() and abs(v) >= 2**64:
            # the JSON parser reads an integer literal past 64 bits as a float: say what was sent
            raise _bad(f, f"must be an integer {rng}, got an integer too large for 64 bits (about {v:.3g})")
        raise _bad(f, f"must be an integer {rng}, got {_shown(v)}")
    return v


def _num(v: Any, f: str, lo: float, hi: float, lo_open: bool = False) -> float:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v > hi or v < lo or (lo_open and v == lo):
        raise _bad(f, f"must be a number in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {_shown(v)}")
    return float(v)


def _bool(v: Any, f: str) -> bool:
    if not isinstance(v, bool):
        raise _bad(f, f"must be true or false, got {_shown(v)}")
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
        raise _bad(f, f"must be one of {', '.join(options)}; got {_shown(v)}")
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
            raise _bad(f"{f}[{i}]", f"must be a non-negative integer token id, got {_shown(t)}")
    return v
