"""The OpenAI front: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models`` (DESIGN §5, HTTP
fronts).

The bodies are the socket's `chat` and `completion` ops (the same parser, fields, checks and error codes), answered
in OpenAI's shapes: ``chat.completion`` / ``text_completion`` objects, or server-sent events (``data: {chunk}``
frames, then ``data: [DONE]``). Usage is ``{prompt_tokens, completion_tokens, total_tokens,
prompt_tokens_details: {cached_tokens}}`` (cached = prompt tokens restored, DESIGN §4.7), for chat also
``completion_tokens_details: {reasoning_tokens}`` (the completion tokens of the reasoning, ``<think>`` / ``</think>``
included, a tool call made inside it not: ``ignisd.edge_events.Usage``); a stream carries it in a last
chunk with empty ``choices`` when ``stream_options.include_usage`` is true. Each reply carries the ``ignis`` object
(``reuse``, ``timings``; on a stream, on the chunk with the finish_reason). Chat replies carry parsed ``tool_calls``
and ``reasoning_content``; finish_reason is ``stop`` | ``length`` | ``tool_calls`` | ``cancelled``.

Errors: ``{"error": {"message", "type", "param", "code", "ignis": {"code", "field"}}}`` with the HTTP status of the
wire code (``ignisd.fronts.sse.STATUS``); ``code`` is the ignis wire code. †: imports no torch.
"""
from __future__ import annotations

import time

from aiohttp import web
from ignis_client import protocol as P

from ignisd.edge_events import EdgeDelta, EdgeDone, EdgeError, TokenLogprob
from ignisd.fronts.ndjson import reuse_object, timings_object, tool_call, tool_call_piece, usage_object
from ignisd.fronts.sse import (STATUS, answer, dumps, error_headers, new_id, parse_op, read_json, request_id,
                               sse_data)

ID_HEADER = "x-request-id"
"""The reply header naming the request (OpenAI's; ignisd.fronts.sse.request_id)."""
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
               500: "server_error", 503: "server_error"}
DONE_FRAME = b"data: [DONE]\n\n"
CODES = {"context_length": "context_length_exceeded"}
"""Wire codes OpenAI spells otherwise (its own ``code``; ``ignis.code`` keeps the wire's)."""


def error(status: int, code: str, message: str, field: str | None) -> web.Response:
    """OpenAI's error object with `status`."""
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"), "param": field,
                      "code": CODES.get(code, code), "ignis": {"code": code, "field": field}}}
    return web.Response(body=dumps(body), status=status, content_type="application/json", headers=error_headers(status))


def error_object(ev: EdgeError) -> dict:
    """An engine error inside a stream (after the response started): ``{"error": {...}}``."""
    status = STATUS.get(ev.code, 500)
    return {"error": {"message": ev.message, "type": ERROR_TYPES[status], "param": ev.field,
                      "code": CODES.get(ev.code, ev.code)}}


def ignis_object(ev: EdgeDone) -> dict:
    """The `ignis` extension: the reuse report and the timings (as on the socket's `done`)."""
    return {"reuse": reuse_object(ev.reuse), "timings": timings_object(ev.timings)}


def model_name(body: dict, edge) -> str:
    """The request's `model` when it is a string (accepted and ignored, echoed back), else the served model's."""
    m = body.get("model")
    return m if isinstance(m, str) and m else edge.model_info["name"]


def _chat_logprobs(lps: tuple[TokenLogprob, ...] | None) -> dict | None:
    if lps is None:
        return None

    def one(token: str, logprob):
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8", "replace"))}
    return {"content": [{**one(lp.token, lp.logprob), "top_logprobs": [one(t.token, t.logprob) for t in lp.top]}
                        for lp in lps]}


def _completion_logprobs(lps: tuple[TokenLogprob, ...] | None, offset: int = 0) -> dict | None:
    """The legacy completions shape: tokens, token_logprobs, top_logprobs ({token: logprob}), text_offset."""
    if lps is None:
        return None
    offsets = []
    for lp in lps:
        offsets.append(offset)
        offset += len(lp.token)
    return {"tokens": [lp.token for lp in lps], "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{t.token: t.logprob for t in lp.top} for lp in lps], "text_offset": offsets}


def _include_usage(body: dict) -> bool:
    so = body.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict):
        raise P.ProtocolError("bad_request", "stream_options: must be an object", "stream_options")
    v = so.get("include_usage", False)
    if not isinstance(v, bool):
        raise P.ProtocolError("bad_request", "stream_options.include_usage: must be true or false",
                              "stream_options.include_usage")
    return v


class _Render:
    """Per-request renderer of a chat or completion reply (see ignisd.fronts.sse)."""

    def __init__(self, cid: str, model: str, include_usage: bool, chat: bool):
        self.cid, self.model, self.include_usage, self.is_chat = cid, model, include_usage, chat
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.chunk_object = "chat.completion.chunk" if chat else "text_completion"
        self.text_offset = 0


    def _chunk(self, choice: dict | None, **extra) -> bytes:
        obj = {"id": self.cid, "object": self.chunk_object, "created": self.created, "model": self.model,
               "choices": [choice] if choice is not None else [], **extra}
        return sse_data(obj)

    def head(self) -> bytes:
        if not self.is_chat:
            return b""
        return self._chunk({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None})

    def delta(self, ev: EdgeDelta) -> bytes:
        if not self.is_chat:
            lps = _completion_logprobs(ev.logprobs, self.text_offset)
            self.text_offset += len(ev.text)
            return self._chunk({"index": 0, "text": ev.text, "logprobs": lps, "finish_reason": None})
        d: dict = {}
        if ev.reasoning_content:
            d["reasoning_content"] = ev.reasoning_content
        if ev.text:
            d["content"] = ev.text
        if ev.tool_calls:
            d["tool_calls"] = [tool_call_piece(p) for p in ev.tool_calls]
        return self._chunk({"index": 0, "delta": d, "logprobs": _chat_logprobs(ev.logprobs), "finish_reason": None})

    def done(self, ev: EdgeDone) -> bytes:
        finish = ev.finish_reason.value
        choice = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish} if self.is_chat else \
            {"index": 0, "text": "", "logprobs": None, "finish_reason": finish}
        out = self._chunk(choice, ignis=ignis_object(ev))
        if self.include_usage:
            out += self._chunk(None, usage=usage_object(ev, self.is_chat))
        return out + DONE_FRAME

    def fail(self, ev: EdgeError) -> bytes:
        return sse_data(error_object(ev)) + DONE_FRAME

    def final(self, ev: EdgeDone) -> dict:
        finish = ev.finish_reason.value
        if self.is_chat:
            m = ev.message
            msg = {"role": "assistant", "content": m.content, "reasoning_content": m.reasoning_content}
            if m.tool_calls:
                msg["tool_calls"] = [tool_call(c) for c in m.tool_calls]
            choice = {"index": 0, "message": msg, "logprobs": _chat_logprobs(ev.logprobs), "finish_reason": finish}
        else:
            choice = {"index": 0, "text": ev.text, "logprobs": _completion_logprobs(ev.logprobs),
                      "finish_reason": finish}
            if ev.prompt_logprobs is not None:
                choice["prompt_logprobs"] = ev.prompt_logprobs
        return {"id": self.cid, "object": self.object, "created": self.created, "model": self.model,
                "choices": [choice], "usage": usage_object(ev, self.is_chat), "ignis": ignis_object(ev)}


class OpenAIFront:
    """The OpenAI routes of `http` (ignisd.fronts.http.HttpFront: its edge and body limit)."""

    def __init__(self, http):
        self.http = http

    async def _generate(self, request: web.Request, op_name: str, prefix: str) -> web.StreamResponse:
        edge = self.http.edge
        cid = new_id(prefix)
        rid = request_id(request, cid, ID_HEADER)
        body = await read_json(request, self.http.max_body_bytes)
        self.http.log_request("openai", request, body, rid)
        op = parse_op(body, op_name, rid)
        include_usage = _include_usage(body)
        chat = op_name == "chat"
        gen = edge.prepare_chat(op, "h:" + cid) if chat else edge.prepare_completion(op, "h:" + cid)
        return await answer(request, edge, gen, _Render(cid, model_name(body, edge), include_usage, chat))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/chat/completions: the `chat` op."""
        return await self._generate(request, "chat", "chatcmpl-")

    async def completion(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions: the `completion` op (prompt text or token ids; prompt_logprobs)."""
        return await self._generate(request, "completion", "cmpl-")

    def _model(self) -> dict:
        info = self.http.edge.model_info
        return {"id": info["name"], "object": "model", "created": 0, "owned_by": "ignis", "ignis": info}

    async def models(self, request: web.Request) -> web.Response:
        """GET /v1/models: the one served model (any model name is accepted in requests)."""
        return web.Response(body=dumps({"object": "list", "data": [self._model()]}), content_type="application/json")

    async def model(self, request: web.Request) -> web.Response:
        """GET /v1/models/{model}: the served model, whatever name is asked (requests accept any)."""
        return web.Response(body=dumps(self._model()), content_type="application/json")
