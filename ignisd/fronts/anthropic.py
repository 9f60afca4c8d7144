"""The Anthropic Messages front: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (DESIGN §5, HTTP fronts).

The body is mapped onto the socket's `chat` op (``ignisd.fronts.anthropic_request``) and validated by the same
parser. The reply is a ``message`` object — content blocks ``thinking`` (the reasoning), ``text``, ``tool_use`` (the
parsed tool calls, ``input`` an object), ``stop_reason`` end_turn | max_tokens | stop_sequence | tool_use (with
``stop_sequence`` the stop string that ended it) — or, streamed, the events ``message_start``,
``content_block_start`` / ``content_block_delta`` (``thinking_delta``, ``text_delta``, ``input_json_delta``) /
``content_block_stop`` per block, ``message_delta`` (stop_reason and the final usage) and ``message_stop``.

Usage, always all four: ``input_tokens`` (prompt tokens not restored), ``output_tokens``, ``cache_read_input_tokens``
(the prompt tokens restored, DESIGN §4.7) and ``cache_creation_input_tokens`` (0: keeping state costs the client
nothing); input + cache_read = the prompt's tokens. ``message_start`` carries the split as known when it is sent
(``Generation.cached_tokens``): the stream starts at the first token or after a second (sse.FIRST_EVENT_WAIT_S),
and by then a request that got a lane has its reuse planned (the engine's AdmittedEvent), even when its prefill
runs longer; only one still queued for a lane a second in starts with cache_read 0 and input_tokens the whole
prompt. ``message_delta`` carries the final counts, which the SDKs take. The ``ignis`` object
(reuse, timings, finish_reason) rides on the message and on ``message_delta``.

``count_tokens`` answers ``{"input_tokens": n}``, n = the rendered prompt's tokens (the `tokenize` op's count).
Errors: ``{"type": "error", "error": {"type", "message", "ignis": {"code", "field"}}}`` with the HTTP status of the
wire code; in a stream, an ``error`` event. †: imports no torch.
"""
from __future__ import annotations

import orjson
from aiohttp import web
from ignis_client import protocol as P

from ignisd.edge_events import EdgeDelta, EdgeDone, EdgeError
from ignisd.fronts.anthropic_request import check_output_format, remap, to_chat
from ignisd.fronts.ndjson import reuse_object, timings_object
from ignisd.fronts.openai import model_name
from ignisd.fronts.sse import (STATUS, answer, dumps, error_headers, new_id, parse_op, read_json, request_id,
                               sse_event)
from ignisd.log import get_logger
from ignisd.request import FinishReason

log = get_logger("srv")
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
               503: "overloaded_error"}
ID_HEADER = "request-id"
"""The reply header naming the request (Anthropic's; ignisd.fronts.sse.request_id)."""


def error(status: int, code: str, message: str, field: str | None) -> web.Response:
    """Anthropic's error object with `status`."""
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(status, "invalid_request_error"), "message": message,
                                       "ignis": {"code": code, "field": field}}}
    return web.Response(body=dumps(body), status=status, content_type="application/json", headers=error_headers(status))


def usage_object(ev: EdgeDone) -> dict:
    """The Messages usage (see the module docstring)."""
    u = ev.usage
    return {"input_tokens": u.prompt_tokens - u.cached_tokens, "output_tokens": u.completion_tokens,
            "cache_read_input_tokens": u.cached_tokens, "cache_creation_input_tokens": 0}


def tool_use_id(call_id: str) -> str:
    """A tool call's id as Anthropic spells it (``toolu_`` + the call's 24 hex digits): the output parser names calls
    OpenAI's way (``call_…``); clients that check the prefix, as Anthropic's own tooling does, see the right one."""
    return "toolu_" + call_id.removeprefix("call_")


def _input(arguments: str) -> dict:
    try:
        v = orjson.loads(arguments) if arguments.strip() else {}
    except orjson.JSONDecodeError:
        log.warning("tool_input_not_json", arguments=arguments[:200])
        return {}
    return v if isinstance(v, dict) else {}


class _Render:
    """Per-request renderer of a Messages reply (see ignisd.fronts.sse)."""


    def __init__(self, mid: str, model: str, gen):
        self.mid, self.model, self.gen = mid, model, gen
        self.index = -1          # the open block's index
        self.open: str | None = None   # its type: thinking | text | tool_use

    def _stop(self, ev: EdgeDone) -> tuple[str, str | None]:
        f = ev.finish_reason
        if f is FinishReason.TOOL_CALLS:
            return "tool_use", None
        if f is FinishReason.LENGTH:
            return "max_tokens", None
        if self.gen.stop_hit:
            return "stop_sequence", self.gen.decoder.stop_string
        return "end_turn", None

    def _ignis(self, ev: EdgeDone) -> dict:
        return {"reuse": reuse_object(ev.reuse), "timings": timings_object(ev.timings),
                "finish_reason": ev.finish_reason.value}

    def _message(self, content: list, stop_reason, stop_sequence, usage: dict) -> dict:
        return {"id": self.mid, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": usage}

    # ---- stream ----
    def head(self) -> bytes:
        n, cached = len(self.gen.request.prompt_ids), self.gen.cached_tokens or 0
        usage = {"input_tokens": n - cached, "output_tokens": 0, "cache_read_input_tokens": cached,
                 "cache_creation_input_tokens": 0}
        return sse_event("message_start", {"type": "message_start", "message": self._message([], None, None, usage)})

    def keepalive(self) -> bytes:
        """Anthropic's own keepalive, the ``ping`` event (its stream sends them too)."""
        return sse_event("ping", {"type": "ping"})

    def _close(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        return sse_event("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _start(self, kind: str, block: dict) -> bytes:
        out = self._close()
        self.index += 1
        self.open = kind
        return out + sse_event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                       "content_block": block})

    def _delta(self, delta: dict) -> bytes:
        return sse_event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def delta(self, ev: EdgeDelta) -> bytes:
        out = b""
        if ev.reasoning_content:
            if self.open != "thinking":
                out += self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out += self._delta({"type": "thinking_delta", "thinking": ev.reasoning_content})
        if ev.text:
            if self.open != "text":
                out += self._start("text", {"type": "text", "text": ""})
            out += self._delta({"type": "text_delta", "text": ev.text})
        for p in ev.tool_calls or ():
            if p.id is not None:
                out += self._start("tool_use", {"type": "tool_use", "id": tool_use_id(p.id), "name": p.name,
                                                  "input": {}})
            if p.arguments:
                out += self._delta({"type": "input_json_delta", "partial_json": p.arguments})
        return out

    def done(self, ev: EdgeDone) -> bytes:
        stop_reason, stop_sequence = self._stop(ev)
        return self._close() + sse_event("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": usage_object(ev), "ignis": self._ignis(ev)}) + sse_event("message_stop", {"type": "message_stop"})

    def fail(self, ev: EdgeError) -> bytes:
        status = STATUS.get(ev.code, 500)
        return self._close() + sse_event("error", {"type": "error", "error": {
            "type": ERROR_TYPES.get(status, "api_error"), "message": ev.message,
            "ignis": {"code": ev.code, "field": ev.field}}})

    # ---- whole ----
    def final(self, ev: EdgeDone) -> dict:
        m = ev.message
        content: list[dict] = []
        if m.reasoning_content:
            content.append({"type": "thinking", "thinking": m.reasoning_content, "signature": ""})
        if m.content:
            content.append({"type": "text", "text": m.content})
        for c in m.tool_calls or ():
            content.append({"type": "tool_use", "id": tool_use_id(c.id), "name": c.name,
                            "input": _input(c.arguments)})
        stop_reason, stop_sequence = self._stop(ev)
        return {**self._message(content, stop_reason, stop_sequence, usage_object(ev)), "ignis": self._ignis(ev)}


class AnthropicFront:
    """The Messages routes of `http` (ignisd.fronts.http.HttpFront: its edge, body limit, billing-header switch)."""

    def __init__(self, http):
        self.http = http

    async def _chat(self, request: web.Request, op_name: str, rid: str):
        """(body, op, paths): the request body, its chat (or tokenize) op and the Anthropic path of each message.
        A generation (op chat) needs max_tokens, as the Messages API requires it (ProtocolError bad_request)."""
        body = await read_json(request, self.http.max_body_bytes)
        if op_name == "chat" and isinstance(body, dict) and body.get("max_tokens") is None:
            raise P.ProtocolError("bad_request", "max_tokens: required (the Messages API has no default: the most "
                                  "tokens to generate, an integer >= 1)", "max_tokens")
        chat, paths = to_chat(body, self.http.strip_billing_header)
        if op_name == "chat":
            check_output_format(body)
        try:
            return body, parse_op(chat, op_name, rid), paths
        except P.ProtocolError as e:
            raise remap(e, paths) from None

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/messages: the `chat` op, answered as a message or its event stream."""
        edge = self.http.edge
        mid = new_id("msg_")
        rid = request_id(request, mid, ID_HEADER)
        body, op, paths = await self._chat(request, "chat", rid)
        self.http.log_request("anthropic", request, body, rid)
        try:
            gen = edge.prepare_chat(op, "h:" + mid)
        except P.ProtocolError as e:
            raise remap(e, paths) from None
        return await answer(request, edge, gen, _Render(mid, model_name(body, edge), gen))

    async def count_tokens(self, request: web.Request) -> web.Response:
        """POST /v1/messages/count_tokens: the rendered prompt's token count, as the `tokenize` op counts it."""
        _, op, paths = await self._chat(request, "tokenize", request_id(request, new_id("count_"), ID_HEADER))
        try:
            n = len(self.http.edge.tokenize(op)["tokens"])
        except P.ProtocolError as e:
            raise remap(e, paths) from None
        return web.Response(body=dumps({"input_tokens": n}), content_type="application/json")
