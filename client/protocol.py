"""The ignis wire protocol (DESIGN §5): the single source of framing, request parsing and reply shapes.

One JSON object per line (UTF-8, ``\\n``-terminated) in both directions. The daemon's server and the clients both
import this module; it uses only the standard library and orjson (†: no torch).

Requests: ``decode_line`` (bytes → dict, framing errors) then ``parse_request`` (dict → one of the ``*Op``
dataclasses, validation errors). Every failure raises ``ProtocolError(code, message, field)``; its ``reply()`` is
the error object to send. Replies: ``delta``, ``done``, ``result``, ``error`` build dicts, ``encode`` frames one.

The module is the single import point of the wire format; its parts live beside it and are re-exported here:
``wire`` (literals, ProtocolError, framing, field checkers), ``ops`` (request dataclasses and parsing),
``sampling_fields`` (their sampling fields) and ``replies`` (reply builders). The socket path resolution stays here.
"""
from __future__ import annotations

import os
from typing import Mapping

from .ops import (BODY_APIS, CancelOp, ChatOp, CompletionOp, DetokenizeOp, Op, SimpleOp, TokenizeOp, parse_envelope,
                  parse_messages, parse_request)
from .sampling_fields import Sampling, check_response_format, parse_sampling
from .replies import (TIMING_KEYS, chat_message, delta, done, empty_reuse, empty_status, result, reuse, timings,
                      usage)
from .wire import (DEFAULT_MAX_LINE_BYTES, ERROR_CODES, FINISH_REASONS, KINDS, MAX_ID_CHARS, MAX_STOP,
                   MAX_TOKENS_LIMIT, MAX_TOP_LOGPROBS, OPS, PRIORITIES, REUSE_REASONS, ROLES, SIMPLE_OPS,
                   SYSTEM_SOCKET_PATH, TIERS, ProtocolError, decode_line, encode, error)

__all__ = [
    # wire
    "OPS", "SIMPLE_OPS", "ERROR_CODES", "FINISH_REASONS", "ROLES", "PRIORITIES", "TIERS", "KINDS", "REUSE_REASONS",
    "DEFAULT_MAX_LINE_BYTES", "MAX_ID_CHARS", "MAX_STOP", "MAX_TOP_LOGPROBS", "MAX_TOKENS_LIMIT", "SYSTEM_SOCKET_PATH",
    "ProtocolError", "decode_line", "encode", "error",
    # ops
    "BODY_APIS", "Sampling", "ChatOp", "CompletionOp", "CancelOp", "TokenizeOp", "DetokenizeOp", "SimpleOp", "Op",
    "parse_envelope", "parse_request", "parse_sampling", "parse_messages", "check_response_format",
    # replies
    "delta", "usage", "TIMING_KEYS", "timings", "reuse", "empty_reuse", "chat_message", "done", "result",
    "empty_status",
    # socket path
    "resolve_socket_path",
]


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
