"""Traces for ``ignis lint``: JSON lines of request bodies as a harness sent them, or the daemon's request log
(``server.request_log``). Standard library + orjson only (†: no torch).

``read_trace(path)`` → ``(entries, errors)``: one ``TraceEntry`` per usable line and one ``TraceError`` per line that
cannot be used (lint reports it and goes on with the rest). A line is one of:

* a request-log line ``{"ts", "front": "socket" | "openai" | "anthropic" | "responses", "path"?, "id"?, "body"}``: the
  body's shape is the front's (a socket body is an OpenAI-shaped chat op body; ``completion`` bodies, which have a
  ``prompt`` and no messages, are skipped with a note);
* a bare body, whose shape is detected (``detect_shape``): ``responses`` (``input`` or ``instructions``, no
  ``messages``), ``anthropic`` (a top-level ``system``, ``stop_sequences`` or ``thinking``; ``input_schema`` tools;
  or content blocks of type ``tool_use`` / ``tool_result`` / ``thinking``) or ``openai`` (any other body with
  ``messages``: chat.completions).

Each error names the line (1-based) and the field: ``line 7: body: not valid JSON (…)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import orjson

SHAPES = ("openai", "anthropic", "responses")
FRONT_SHAPES = {"socket": "openai", "openai": "openai", "anthropic": "anthropic", "responses": "responses"}
_ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking"})


@dataclass(frozen=True)
class TraceEntry:
    """A request of the trace: its 1-based line number, body shape (one of SHAPES), body, and the front it came by
    (request-log lines: "socket" / "openai" / "anthropic" / "responses"; None for a bare body)."""

    line: int
    shape: str
    body: dict
    front: str | None = None


@dataclass(frozen=True)
class TraceError:
    """A trace line lint cannot use: its 1-based line number, the field at fault and why."""

    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field}: {self.message}"


class ShapeError(ValueError):
    """A body whose shape cannot be told: `field` names what was missing or wrong."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _anthropic_blocks(messages: list) -> bool:
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in _ANTHROPIC_BLOCKS
                                             for b in content):
            return True
    return False


def detect_shape(body: dict) -> str:
    """The body's shape (one of SHAPES), per the module docstring. Raises ShapeError naming the field."""
    messages = body.get("messages")
    if messages is None:
        if "input" in body or "instructions" in body:
            return "responses"
        raise ShapeError("messages", "unknown body shape: no `messages` (OpenAI chat, Anthropic Messages) nor "
                                     "`input` / `instructions` (Responses)")
    if not isinstance(messages, list):
        raise ShapeError("messages", "must be a list of messages")
    if any(k in body for k in ("system", "stop_sequences", "thinking")) or _anthropic_blocks(messages):
        return "anthropic"
    tools = body.get("tools")
    if isinstance(tools, list) and any(isinstance(t, dict) and "input_schema" in t for t in tools):
        return "anthropic"
    return "openai"


def parse_line(raw: bytes, line: int) -> TraceEntry | TraceError | None:
    """One trace line → its entry, its error, or None (a blank line, or a completion in a request log)."""
    if not raw.strip():
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        return TraceError(line, "body", f"not valid JSON ({e})")
    if not isinstance(obj, dict):
        return TraceError(line, "body", f"must be a JSON object, got {type(obj).__name__}")
    front = None
    if "front" in obj and "body" in obj:   # a request-log line
        front, body = obj["front"], obj["body"]
        if front not in FRONT_SHAPES:
            return TraceError(line, "front", f"unknown front {front!r}; known: {', '.join(FRONT_SHAPES)}")
        if not isinstance(body, dict):
            return TraceError(line, "body", "must be a JSON object")
        if "prompt" in body and "messages" not in body:
            return None   # a completion request: no messages to compare
        return TraceEntry(line, FRONT_SHAPES[front], body, front)
    try:
        return TraceEntry(line, detect_shape(obj), obj)
    except ShapeError as e:
        return TraceError(line, e.field, str(e))


def read_lines(lines) -> tuple[list[TraceEntry], list[TraceError]]:
    """Parse an iterable of byte lines (see parse_line)."""
    entries, errors = [], []
    for i, raw in enumerate(lines, 1):
        got = parse_line(raw, i)
        if isinstance(got, TraceEntry):
            entries.append(got)
        elif isinstance(got, TraceError):
            errors.append(got)
    return entries, errors


def read_trace(path: str) -> tuple[list[TraceEntry], list[TraceError]]:
    """Read a trace file (see the module docstring). Raises OSError when it cannot be read."""
    with open(path, "rb") as f:
        return read_lines(f)
