"""What the ignisd clients share (``Client`` in ``sync_client``, ``AsyncClient`` in ``async_client``): request
framing (ids, the api_key, the max_line_bytes check), reply decoding, and the errors ``IgnisError``,
``DaemonNotRunning`` and ``ReplyTimeout``.

Standard library + orjson only (no torch). Re-exported by ``ignis_client.client``.
"""
from __future__ import annotations

import itertools
import math
import secrets
from typing import Any

import orjson

from .protocol import encode, resolve_socket_path

TERMINAL = ("done", "result", "error")


class IgnisError(Exception):
    """An ``error`` reply: code (protocol.ERROR_CODES), message, field (path such as ``messages[0].role``)."""

    def __init__(self, code: str, message: str, field: str | None = None, id: str | None = None):
        super().__init__(f"{code}: {message}" + (f" (field {field})" if field else ""))
        self.code, self.message, self.field, self.id = code, message, field, id


class DaemonNotRunning(ConnectionError):
    """Nothing listens on socket_path (missing file or connection refused)."""

    def __init__(self, socket_path: str, reason: str):
        super().__init__(f"no ignisd listening on {socket_path} ({reason})")
        self.socket_path = socket_path


class ReplyTimeout(TimeoutError):
    """The connection is open and the request sent, but no reply line came within the client's timeout (seconds)."""

    def __init__(self, timeout: float):
        super().__init__(f"ignisd did not answer within {timeout:g} s")
        self.timeout = timeout


def _raise_error(ev: dict) -> None:
    err = ev.get("error") or {}
    raise IgnisError(err.get("code", "internal"), err.get("message", ""), err.get("field"), ev.get("id"))


def _terminal(ev: dict) -> bool:
    """Whether `ev` ends its request (``done`` / ``result``); raises IgnisError for an ``error`` reply."""
    if ev.get("type") == "error":
        _raise_error(ev)
    return ev.get("type") in TERMINAL


def _unwritable(v: Any, path: str, text: bool) -> tuple[str, str] | None:
    """The first value under `v` that a JSON request cannot carry faithfully, as (field path, why), else None:
    a non-finite float; with ``text`` (after orjson refused the request), also a str or object key that is not valid
    UTF-8 (a lone surrogate), an int outside JSON's 64-bit range, an object key other than a str or an int, and a
    value of no JSON type (bytes, a set). Paths look like the daemon's: ``messages[0].content``."""
    if isinstance(v, float):
        return None if math.isfinite(v) else (path, f"must be a finite number, got {v}")
    if isinstance(v, str):
        if text:
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as e:
                return path, f"is not valid UTF-8 text (a lone surrogate at character {e.start})"
        return None
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return (path, f"integer {v} is outside the 64-bit range JSON carries") \
            if text and not -2 ** 63 <= v < 2 ** 64 else None
    if not isinstance(v, (dict, list, tuple)):
        return (path or "request", f"a {type(v).__name__} has no JSON form") if text else None
    items = v.items() if isinstance(v, dict) else enumerate(v)
    for k, x in items:
        if text and isinstance(v, dict):
            key = _unwritable(k, path or "request", text) if isinstance(k, str) else None
            if key:
                return key[0], f"an object key {key[1]}"
            if not isinstance(k, (str, int)) or isinstance(k, bool):
                return (path or "request"), f"key {k!r} is not a str or an int (a JSON object key)"
        sub = f"{path}[{k}]" if isinstance(k, int) else (f"{path}.{k}" if path else str(k))
        found = _unwritable(x, sub, text)
        if found:
            return found
    return None


def _messages(messages: Any) -> Any:
    return [{"role": "user", "content": messages}] if isinstance(messages, str) else messages


MAX_TIMEOUT_S = 10**9       # a socket timeout overflows time_t near 9.2e9 s; None waits without a limit


def check_timeout(timeout: Any) -> float | None:
    """The client's reply timeout in seconds: None (no limit) or a real number above 0 and at most MAX_TIMEOUT_S.

    Raises ValueError naming ``timeout`` and the limit otherwise (0, a negative, NaN, infinity, a bool, a string)."""
    if timeout is None:
        return None
    ok = isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and 0 < timeout <= MAX_TIMEOUT_S
    if not ok:
        raise ValueError(f"timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_S:,}, or None to wait "
                         f"without a limit; got {timeout!r}")
    return float(timeout)


def check_max_line_bytes(n: Any) -> int:
    """The longest request line the client sends, in bytes: an int of at least 1 (the daemon's own limit is
    protocol.DEFAULT_MAX_LINE_BYTES unless its config says otherwise). Raises ValueError naming ``max_line_bytes``."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"max_line_bytes must be an int of at least 1 (bytes); got {n!r}")
    return n


class _Base:
    def __init__(self, socket_path: str | None, timeout: float | None, api_key: str | None, max_line_bytes: int):
        timeout, max_line_bytes = check_timeout(timeout), check_max_line_bytes(max_line_bytes)
        self.socket_path = socket_path or resolve_socket_path()
        self.timeout, self.api_key, self.max_line_bytes = timeout, api_key, max_line_bytes
        self._ids = (f"{secrets.token_hex(3)}-{n}" for n in itertools.count(1))

    def _body(self, op: str, fields: dict) -> tuple[str, bytes]:
        """The request line for ``op``: a fresh id, the fields (None values left out) and the api key.

        Raises ValueError when ``fields`` sets ``id``, ``op`` or ``api_key`` (the client owns them: one id per request
        routes its replies), and IgnisError ``bad_request`` naming the field when a value cannot be written as JSON
        faithfully (NaN or inf, a lone surrogate in a string, an int past 64 bits, an object of no JSON type), or
        ``too_long`` over max_line_bytes."""
        owned = sorted({"id", "op", "api_key"} & fields.keys())
        if owned:
            raise ValueError(f"{', '.join(owned)}: set by the client (a fresh id per request, the op from the method, "
                             "api_key from the constructor); do not pass it as a field")
        rid = next(self._ids)
        fields = {k: v for k, v in fields.items() if v is not None}
        bad = _unwritable(fields, "", text=False)       # NaN / inf would go out as null and silently take defaults
        try:
            line = None if bad else encode({"id": rid, "op": op, **fields,
                                            **({"api_key": self.api_key} if self.api_key is not None
                                               and op != "health" else {})}, int_keys=True)
        except (orjson.JSONEncodeError, TypeError) as e:
            bad = _unwritable(fields, "", text=True) or ("", f"cannot be written as JSON: {e}")
        if bad:
            raise IgnisError("bad_request", f"{bad[0] or 'request'}: {bad[1]}", bad[0] or None, rid)
        if len(line) - 1 > self.max_line_bytes:
            raise IgnisError("too_long", f"request of {len(line) - 1} bytes exceeds max_line_bytes "
                                         f"({self.max_line_bytes})", None, rid)
        return rid, line

    @staticmethod
    def _decode(line: bytes) -> dict:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise ConnectionError(f"daemon sent invalid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ConnectionError("daemon sent a line that is not a JSON object")
        return obj

    def _connect_error(self, e: OSError) -> Exception:
        if isinstance(e, (FileNotFoundError, ConnectionRefusedError)):
            return DaemonNotRunning(self.socket_path, e.strerror or type(e).__name__)
        return e
