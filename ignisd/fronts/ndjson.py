"""The NDJSON front: the socket protocol's ops answered through the edge, its events rendered as reply lines
(DESIGN §5; the shapes are ignis_client.protocol's `delta`, `done`, `result` and `error`).

One method per op. A connection (``ignisd.server.Connection``) gives each request its engine key and writes the
replies (`send`); a request error raises ProtocolError, which the connection answers. †: imports no torch.
"""
from __future__ import annotations

from ignis_client import protocol as P
from ignis_client.wire import _shown

from ignisd.edge import Edge
from ignisd.edge_events import EdgeDelta, EdgeDone, EdgeError, Timings, TokenLogprob, ToolCall, ToolCallPiece
from ignisd.prompt import Reuse

MODEL_OPS = frozenset({"chat", "completion", "tokenize", "detokenize"})   # ops that need the model loaded


def logprob_entry(lp: TokenLogprob) -> dict:
    """A generated token's logprobs entry: token, token_id, logprob, top_logprobs [{token, token_id, logprob}]."""
    return {"token": lp.token, "token_id": lp.token_id, "logprob": lp.logprob,
            "top_logprobs": [{"token": t.token, "token_id": t.token_id, "logprob": t.logprob} for t in lp.top]}


def tool_call_piece(p: ToolCallPiece) -> dict:
    """OpenAI's streamed tool-call shape: the first piece names the call, later ones add arguments."""
    if p.id is None:
        return {"index": p.index, "function": {"arguments": p.arguments}}
    return {"index": p.index, "id": p.id, "type": "function", "function": {"name": p.name, "arguments": p.arguments}}


def tool_call(c: ToolCall) -> dict:
    """A finished tool call in OpenAI's shape."""
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}


def reuse_object(r: Reuse) -> dict:
    """The `ignis.reuse` object. Raises ValueError for a tier, kind or reason outside the wire literals."""
    best = div = None
    if r.best_candidate is not None:
        b = r.best_candidate
        best = {"kind": b.kind, "tier": b.tier, "tokens": b.tokens}
    if r.diverged_at is not None:
        d = r.diverged_at
        div = {"token": d.token, "message_index": d.message_index, "role": d.role, "char_offset": d.char_offset,
               "ours": d.ours, "theirs": d.theirs}
    return P.reuse(tier=r.tier, kind=r.kind, cached_tokens=r.cached_tokens, reason=r.reason, best_candidate=best,
                   diverged_at=div)


def delta_reply(rid: str, ev: EdgeDelta) -> dict:
    """A `delta` line: text, and logprobs / reasoning_content / tool_calls when the event has them."""
    return P.delta(rid, ev.text, logprobs=[logprob_entry(lp) for lp in ev.logprobs] if ev.logprobs else None,
                   reasoning_content=ev.reasoning_content,
                   tool_calls=[tool_call_piece(p) for p in ev.tool_calls] if ev.tool_calls else None)


def timings_object(t: Timings) -> dict:
    """The `timings` object, rounded: ms to 3 decimals, rates to 2."""
    return P.timings(queue_ms=round(t.queue_ms, 3), load_ms=t.load_ms, ttft_ms=round(t.ttft_ms, 3),
                     prefill_tokens_per_s=round(t.prefill_tokens_per_s, 2),
                     decode_tokens_per_s=round(t.decode_tokens_per_s, 2))


def usage_object(ev: EdgeDone, chat: bool = False) -> dict:
    """OpenAI's usage (token counts) with prompt_tokens_details.cached_tokens; a chat reply's also with
    completion_tokens_details.reasoning_tokens (the completion tokens of the reasoning, ``</think>`` included:
    ignisd.edge_events.Usage). The socket's `done` and the chat completions front both answer with it."""
    u = ev.usage
    out = P.usage(u.prompt_tokens, u.completion_tokens, u.cached_tokens)
    if chat:
        out["completion_tokens_details"] = {"reasoning_tokens": u.reasoning_tokens}
    return out


def done_reply(rid: str, ev: EdgeDone) -> dict:
    """The `done` line: usage (a chat's also with completion_tokens_details.reasoning_tokens, the completion tokens
    of the reasoning: ignisd.edge_events.Usage), timings (rounded: ms to 3 decimals, rates to 2), ignis.reuse, and
    the chat message, logprobs and prompt_logprobs when present."""
    timings = timings_object(ev.timings)
    message = None
    if ev.message is not None:
        m = ev.message
        message = P.chat_message(m.content, m.reasoning_content,
                                 [tool_call(c) for c in m.tool_calls] if m.tool_calls else None)
    return P.done(rid, ev.text, ev.finish_reason.value, usage_object(ev, chat=message is not None), timings,
                  reuse_object(ev.reuse), message=message,
                  logprobs=[logprob_entry(lp) for lp in ev.logprobs] if ev.logprobs is not None else None,
                  prompt_logprobs=ev.prompt_logprobs)


class NdjsonFront:
    """Answers the socket protocol's ops with `edge` (ignisd.edge.Edge); `answer` picks the op's method.

    strip_billing_header: server.strip_billing_header, for `tokenize` of an Anthropic body (as the HTTP front maps
    it). request_log: ignisd.request_log.RequestLog or None; every chat and completion op is recorded there (front
    ``socket``)."""

    def __init__(self, edge: Edge, strip_billing_header: bool = True, request_log=None):
        self.edge = edge
        self.strip_billing_header = strip_billing_header
        self.request_log = request_log
        self._ops = {"chat": self.chat, "completion": self.completion, "tokenize": self.tokenize,
                     "detokenize": self.detokenize, "cancel": self.cancel, "health": self.health,
                     "status": self.status, "metrics": self.metrics, "reset": self.reset}

    async def answer(self, conn, op) -> None:
        """Answer `op` (a parsed ignis_client.protocol op) on `conn`. Raises ProtocolError for request errors."""
        method = self._ops.get(op.op)
        if method is None:
            raise P.ProtocolError("unknown_op", f"unknown op {_shown(op.op)}", "op")
        if op.op in MODEL_OPS:
            await self.edge.ready()     # waits while the model loads (the wait is the reply's timings.load_ms)
            if conn.closed:             # the client left meanwhile: submit nothing for it
                return
        await method(conn, op)

    async def _generate(self, conn, op, gen) -> None:
        conn.rids[op.id] = gen.request.rid   # with the first step of the stream (the submit): no await between
        async for ev in self.edge.stream(gen):
            if isinstance(ev, EdgeDelta):
                await conn.send(delta_reply(op.id, ev))
            elif isinstance(ev, EdgeDone):
                await conn.send(done_reply(op.id, ev))
            else:
                assert isinstance(ev, EdgeError)
                await conn.send(P.error(op.id, ev.code, ev.message, ev.field))

    def log_request(self, obj: dict, op) -> None:
        """Record a parsed chat or completion request line `obj` (its envelope id and api_key left out) in the
        request log, when one is configured; other ops are not recorded. Never blocks (RequestLog.record)."""
        if self.request_log is not None and op.op in ("chat", "completion"):
            self.request_log.record("socket", {k: v for k, v in obj.items() if k not in ("api_key", "id")})

    async def chat(self, conn, op) -> None:
        """`chat`: stream deltas when asked, then `done` (or an `error` from the engine)."""
        await self._generate(conn, op, self.edge.prepare_chat(op, conn.rid(op.id)))

    async def completion(self, conn, op) -> None:
        """`completion`: as chat, with plain text deltas and optional prompt_logprobs."""
        await self._generate(conn, op, self.edge.prepare_completion(op, conn.rid(op.id)))

    async def tokenize(self, conn, op) -> None:
        """`tokenize` → tokens, offsets, text (and message spans and cut points for a chat body; and the mapped
        chat body for an HTTP front's body, ``api`` + ``body``)."""
        if op.api is not None:
            await conn.send(P.result(op.id, self.edge.tokenize(op, self.strip_billing_header)))
        else:
            await conn.send(P.result(op.id, self.edge.tokenize(op)))

    async def detokenize(self, conn, op) -> None:
        """`detokenize` → text."""
        await conn.send(P.result(op.id, {"text": self.edge.detokenize(op.tokens)}))

    async def cancel(self, conn, op) -> None:
        """`cancel` a request of this connection → whether it was in flight."""
        await conn.send(P.result(op.id, {"cancelled": self.edge.cancel(conn.rids.get(op.target))}))

    async def health(self, conn, op) -> None:
        """`health` → ok, the model's name, and (from the daemon's host) state and the reason it is not ok."""
        await conn.send(P.result(op.id, self.edge.health()))

    async def status(self, conn, op) -> None:
        """`status` → the DESIGN §5 status object."""
        await conn.send(P.result(op.id, self.edge.status()))

    async def metrics(self, conn, op) -> None:
        """`metrics` → the Prometheus exposition text."""
        await conn.send(P.result(op.id, {"text": self.edge.metrics_text()}))

    async def reset(self, conn, op) -> None:
        """`reset` → how many retained states were dropped."""
        await conn.send(P.result(op.id, {"dropped": self.edge.reset()}))
