"""The OpenAI Responses front: ``POST /v1/responses`` (DESIGN §5, HTTP fronts), what Codex CLI speaks.

The body is mapped onto the socket's `chat` op (``ignisd.fronts.responses_request``) and validated by the same parser.
The reply is a ``response`` object whose ``output`` holds, in order, a ``reasoning`` item (the reasoning, as one
``reasoning_text`` part), a ``message`` item (one ``output_text`` part) and a ``function_call`` item per parsed tool
call (``call_id``, ``name``, ``arguments`` JSON string); ``status`` completed, or incomplete
(``incomplete_details.reason`` max_output_tokens) when the reply hit its token cap, or cancelled. Usage:
``{input_tokens, input_tokens_details: {cached_tokens}, output_tokens, output_tokens_details: {reasoning_tokens},
total_tokens}`` (cached = the prompt tokens restored, DESIGN §4.7; reasoning = the output tokens of the reasoning,
``<think>`` / ``</think>`` included, a tool call made inside it not: ``ignisd.edge_events.Usage``); ``ignis`` (reuse,
timings) rides along.

Streamed, every event carries ``type`` and ``sequence_number``: ``response.created``, ``response.in_progress``; per
item ``response.output_item.added`` … ``response.output_item.done``, with ``response.reasoning_text.delta`` / ``.done``
(reasoning), ``response.content_part.added``, ``response.output_text.delta`` / ``.done``,
``response.content_part.done`` (message), ``response.function_call_arguments.delta`` / ``.done`` (tool call); then
``response.completed`` (or ``response.incomplete``) with the whole response and its usage. An engine error after the
stream began is ``response.failed``. Errors before it are OpenAI error objects (``ignisd.fronts.openai.error``).
†: imports no torch.
"""
from __future__ import annotations

import time

from aiohttp import web
from ignis_client import protocol as P

from ignisd.edge_events import EdgeDelta, EdgeDone, EdgeError
from ignisd.fronts import openai
from ignisd.fronts.ndjson import reuse_object, timings_object
from ignisd.fronts.responses_request import remap, to_chat
from ignisd.fronts.sse import answer, new_id, parse_op, read_json, request_id, sse_event
from ignisd.request import FinishReason


def usage_object(ev: EdgeDone) -> dict:
    """The Responses usage (token counts; reasoning_tokens: ignisd.edge_events.Usage, the ``</think>`` tag included)."""
    u = ev.usage
    return {"input_tokens": u.prompt_tokens, "input_tokens_details": {"cached_tokens": u.cached_tokens},
            "output_tokens": u.completion_tokens, "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def _status(ev: EdgeDone) -> tuple[str, dict | None]:
    if ev.finish_reason is FinishReason.LENGTH:
        return "incomplete", {"reason": "max_output_tokens"}
    if ev.finish_reason is FinishReason.CANCELLED:
        return "cancelled", None
    return "completed", None


class _Render:
    """Per-request renderer of a Responses reply (see ignisd.fronts.sse)."""


    def __init__(self, rid: str, model: str, body: dict):
        self.rid, self.model, self.body = rid, model, body
        self.created = int(time.time())
        self.seq = 0
        self.items: list[dict] = []     # finished output items
        self.item: dict | None = None   # the open one
        self.acc = ""                   # its text or arguments so far

    def _response(self, status: str, output: list, usage=None, incomplete=None, error=None) -> dict:
        b = self.body
        return {"id": self.rid, "object": "response", "created_at": self.created, "status": status,
                "model": self.model, "output": output, "error": error, "incomplete_details": incomplete,
                "instructions": b.get("instructions"), "max_output_tokens": b.get("max_output_tokens"),
                "parallel_tool_calls": b.get("parallel_tool_calls", True), "previous_response_id": None,
                "reasoning": b.get("reasoning"), "temperature": b.get("temperature"), "top_p": b.get("top_p"),
                "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [],
                "text": {"format": {"type": "text"}}, "truncation": "disabled", "store": False, "metadata": {},
                "usage": usage}

    def _ev(self, name: str, **fields) -> bytes:
        self.seq += 1
        return sse_event(name, {"type": name, "sequence_number": self.seq - 1, **fields})

    # ---- stream ----
    def head(self) -> bytes:
        r = self._response("in_progress", [])
        return self._ev("response.created", response=r) + self._ev("response.in_progress", response=r)

    def _where(self) -> dict:
        return {"item_id": self.item["id"], "output_index": len(self.items)}

    def _open(self, item: dict) -> bytes:
        out = self._close()
        self.item, self.acc = item, ""
        out += self._ev("response.output_item.added", output_index=len(self.items), item=item)
        if item["type"] == "message":
            out += self._ev("response.content_part.added", **self._where(), content_index=0,
                            part={"type": "output_text", "text": "", "annotations": []})
        return out

    def _close(self, status: str = "completed") -> bytes:
        """End the open output item with `status` ("completed"; "incomplete" when generation was cut)."""
        it = self.item
        if it is None:
            return b""
        w, text = self._where(), self.acc
        if it["type"] == "reasoning":
            out = self._ev("response.reasoning_text.done", **w, content_index=0, text=text)
            it = {**it, "content": [{"type": "reasoning_text", "text": text}]}
        elif it["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            out = self._ev("response.output_text.done", **w, content_index=0, text=text, logprobs=[])
            out += self._ev("response.content_part.done", **w, content_index=0, part=part)
            it = {**it, "status": status, "content": [part]}
        else:
            out = self._ev("response.function_call_arguments.done", **w, arguments=text)
            it = {**it, "status": status, "arguments": text}
        out += self._ev("response.output_item.done", output_index=len(self.items), item=it)
        self.items.append(it)
        self.item = None
        return out

    def delta(self, ev: EdgeDelta) -> bytes:
        out = b""
        if ev.reasoning_content:
            if self.item is None or self.item["type"] != "reasoning":
                out += self._open({"type": "reasoning", "id": new_id("rs_"), "summary": [], "content": []})
            self.acc += ev.reasoning_content
            out += self._ev("response.reasoning_text.delta", **self._where(), content_index=0,
                            delta=ev.reasoning_content)
        if ev.text:
            if self.item is None or self.item["type"] != "message":
                out += self._open({"type": "message", "id": new_id("msg_"), "status": "in_progress",
                                   "role": "assistant", "content": []})
            self.acc += ev.text
            out += self._ev("response.output_text.delta", **self._where(), content_index=0, delta=ev.text,
                            logprobs=[])
        for p in ev.tool_calls or ():
            if p.id is not None:
                out += self._open({"type": "function_call", "id": new_id("fc_"), "call_id": p.id, "name": p.name,
                                   "arguments": "", "status": "in_progress"})
            if p.arguments:
                self.acc += p.arguments
                out += self._ev("response.function_call_arguments.delta", **self._where(), delta=p.arguments)
        return out

    def done(self, ev: EdgeDone) -> bytes:
        status, incomplete = _status(ev)
        out = self._close("completed" if status == "completed" else "incomplete")
        r = {**self._response(status, self.items, usage_object(ev), incomplete), "ignis": self._ignis(ev)}
        return out + self._ev("response.completed" if status == "completed" else "response.incomplete", response=r)

    def fail(self, ev: EdgeError) -> bytes:
        out = self._close()
        r = self._response("failed", self.items, error={"code": ev.code, "message": ev.message})
        return out + self._ev("response.failed", response=r)

    # ---- whole ----
    @staticmethod
    def _ignis(ev: EdgeDone) -> dict:
        return {"reuse": reuse_object(ev.reuse), "timings": timings_object(ev.timings),
                "finish_reason": ev.finish_reason.value}

    def final(self, ev: EdgeDone) -> dict:
        m = ev.message
        status, incomplete = _status(ev)
        item_status = "completed" if status == "completed" else "incomplete"   # the last item was cut
        output: list[dict] = []
        if m.reasoning_content:
            output.append({"type": "reasoning", "id": new_id("rs_"), "summary": [],
                           "content": [{"type": "reasoning_text", "text": m.reasoning_content}]})
        if m.content:
            output.append({"type": "message", "id": new_id("msg_"), "status": "completed", "role": "assistant",
                           "content": [{"type": "output_text", "text": m.content, "annotations": []}]})
        for c in m.tool_calls or ():
            output.append({"type": "function_call", "id": new_id("fc_"), "call_id": c.id, "name": c.name,
                           "arguments": c.arguments, "status": "completed"})
        if output and "status" in output[-1]:
            output[-1]["status"] = item_status
        return {**self._response(status, output, usage_object(ev), incomplete), "ignis": self._ignis(ev)}


class ResponsesFront:
    """The Responses route of `http` (ignisd.fronts.http.HttpFront: its edge and body limit)."""

    def __init__(self, http):
        self.http = http

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/responses: the `chat` op, answered as a response object or its event stream."""
        edge = self.http.edge
        resp_id = new_id("resp_")
        rid = request_id(request, resp_id, openai.ID_HEADER)
        body = await read_json(request, self.http.max_body_bytes)
        self.http.log_request("responses", request, body, rid)
        chat, paths = to_chat(body)
        try:
            gen = edge.prepare_chat(parse_op(chat, "chat", rid), "h:" + resp_id)
        except P.ProtocolError as e:
            raise remap(e, paths) from None
        return await answer(request, edge, gen, _Render(resp_id, openai.model_name(body, edge), body))
