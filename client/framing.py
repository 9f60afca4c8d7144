"""What the ignisd clients share (``Client`` in ``sync_client``, ``AsyncClient`` in ``async_client``): request
framing (ids, the api_key, the max_line_bytes check), reply decoding, and the errors ``IgnisError`` and
``DaemonNotRunning``.

Standard library + orjson only (no torch). Re-exported by ``ignis_client.client``.
"""
from __future__ import annotations

import itertools
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


def _raise_error(ev: dict) -> None:
    err = ev.get("error") or {}
    raise IgnisError(err.get("code", "internal"), err.get("message", ""), err.get("field"), ev.get("id"))


def _messages(messages: Any) -> Any:
    return [{"role": "user", "content": messages}] if isinstance(messages, str) else messages


class _Base:
    def __init__(self, socket_path: str | None, timeout: float | None, api_key: str | None, max_line_bytes: int):
        self.socket_path = socket_path or resolve_socket_path()
        self.timeout, self.api_key, self.max_line_bytes = timeout, api_key, max_line_bytes
        self._ids = (f"{secrets.token_hex(3)}-{n}" for n in itertools.count(1))

    def _body(self, op: str, fields: dict) -> tuple[str, bytes]:
        """The request line for ``op``: a fresh id, the fields (None values left out) and the api key.

        Raises ValueError when ``fields`` sets ``id``, ``op`` or ``api_key`` (the client owns them: one id per request
        routes its replies), and IgnisError ``bad_request`` when a value cannot be written as JSON (a lone
        surrogate in a string, an object of no JSON type) or ``too_long`` over max_line_bytes."""
        owned = sorted({"id", "op", "api_key"} & fields.keys())
        if owned:
            raise ValueError(f"{', '.join(owned)}: set by the client (a fresh id per request, the op from the method, "
                             "api_key from the constructor); do not pass it as a field")
        rid = next(self._ids)
        body = {"id": rid, "op": op, **{k: v for k, v in fields.items() if v is not None}}
        if self.api_key is not None and op != "health":
            body["api_key"] = self.api_key
        try:
            line = encode(body)
        except orjson.JSONEncodeError as e:
            raise IgnisError("bad_request", f"the request cannot be written as JSON: {e}", None, rid) from None
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
