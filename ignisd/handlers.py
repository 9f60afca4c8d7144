"""Op handlers: what each wire op does, at the edge (DESIGN §2, §5).

Chat templates, tokenization, detokenization and stop strings live here and never in the engine: a chat or
completion op becomes token ids and a Request; the engine's token events come back through a StreamDecoder
(UTF-8-safe, stop-string-aware) and leave as `delta` / `done` replies. †: imports no torch.
"""
from __future__ import annotations


from dataclasses import dataclass

from ignis_client import protocol as P
from ignis_client.divergence import diverged_at
from ignisd.log import get_logger
from ignisd.request import (DoneEvent, ErrorEvent, FinishReason, Priority, Request, ReuseInfo, SamplingParams,
                            TokenEvent)
from ignisd.text.segments import CutPoints, cut_points
from ignisd.text.spans import message_at_char, message_spans
from ignisd.text.chat_template import prepare_messages
from ignisd.text.output_parser import make_output_parser, prompt_starts_in_reasoning
from ignisd.text.stream import StreamDecoder

log = get_logger("srv")


@dataclass
class Prompt:
    """A rendered, tokenized prompt with what reuse needs of it: text and per-token character offsets (None for a
    token-id completion prompt), the messages, tools and template kwargs it was rendered from (chat only), and its
    cut points."""

    ids: list[int]
    text: str | None = None
    offsets: list | None = None
    messages: list | None = None
    tools: list | None = None
    kwargs: dict | None = None
    cuts: CutPoints | None = None


class Handlers:
    """Answers ops for one loaded model.

    engine: ignisd.engine.Engine. tokenizer: ignisd.text.tokenizer.Tokenizer. template: ChatTemplate or None.
    model_info: the `status.model` object. context_tokens: prompt + generation cap (tokens).
    default_max_tokens: used when a request gives none (capped at what the context leaves).
    developer_policy: server.developer_message_policy. metrics: ignisd.metrics.Metrics or None.
    output_family: how chat output is split into content / reasoning / tool calls ("qwen3_5", "qwen3", "none").
    """

    def __init__(self, engine, tokenizer, template, *, model_info: dict, context_tokens: int,
                 default_max_tokens: int, developer_policy: str, metrics=None, slots_info: dict | None = None,
                 output_family: str = "none"):
        self.output_family = output_family
        self.engine = engine
        self.tok = tokenizer
        self.template = template
        self.model_info = model_info
        self.context_tokens = context_tokens
        self.default_max_tokens = default_max_tokens
        self.developer_policy = developer_policy
        self.metrics = metrics
        self.slots_info = slots_info or {"device_total": 0, "device_free": 0, "host_total": 0, "host_free": 0}

    async def handle(self, conn, op) -> None:
        """Answer `op` on `conn`. Raises ProtocolError for request errors (the caller replies with it)."""
        kind = type(op).__name__
        if kind == "ChatOp":
            prompt = self.chat_prompt(op)
            parser = make_output_parser(self.output_family, op.tools,
                                        starts_in_reasoning=prompt_starts_in_reasoning(prompt.text))
            await self.generate(conn, op, prompt.ids, parser, prompt)
        elif kind == "CompletionOp":
            ids = self.completion_ids(op)
            await self.generate(conn, op, ids, None,
                                Prompt(ids, text=op.prompt if isinstance(op.prompt, str) else None))
        elif kind == "TokenizeOp":
            await conn.send(P.result(op.id, self.tokenize(op)))
        elif kind == "DetokenizeOp":
            self._check_ids(op.tokens, "tokens")
            await conn.send(P.result(op.id, {"text": self.tok.decode(list(op.tokens))}))
        elif kind == "CancelOp":
            rid = conn.rids.get(op.target)
            ok = rid is not None and self.engine.cancel(rid)
            await conn.send(P.result(op.id, {"cancelled": bool(ok)}))
        elif op.op == "health":
            await conn.send(P.result(op.id, {"ok": True, "model": self.model_info["name"]}))
        elif op.op == "status":
            await conn.send(P.result(op.id, self.status()))
        elif op.op == "metrics":
            await conn.send(P.result(op.id, {"text": self.metrics.render() if self.metrics else ""}))
        elif op.op == "reset":
            n = self.engine.reset()
            log.info("reset", dropped=n)
            await conn.send(P.result(op.id, {"dropped": n}))
        else:
            raise P.ProtocolError("unknown_op", f"unknown op {op.op!r}", "op")

    # ---- prompts ----
    def _messages(self, op) -> list[dict]:
        if self.template is None:
            raise P.ProtocolError("model_unsupported", "the model has no chat template; use the completion op",
                                  "messages")
        try:
            msgs = prepare_messages(op.messages, self.developer_policy)
        except ValueError as e:
            field, _, msg = str(e).partition(": ")
            raise P.ProtocolError(getattr(e, "code", "bad_request"), msg or str(e),
                                  field if msg else "messages") from None
        if op.tools and not self.template.uses("tools"):
            raise P.ProtocolError("model_unsupported", "this model's chat template does not render tools", "tools")
        return msgs

    def render_text(self, op) -> str:
        """The chat body rendered with the model's template (ending in the generation opener)."""
        return self._render(op)[2]

    def _render(self, op, add_generation_prompt: bool = True) -> tuple[list[dict], dict, str]:
        msgs = self._messages(op)
        kwargs = dict(op.chat_template_kwargs or {})
        try:
            text = self.template.render(msgs, tools=op.tools or None, add_generation_prompt=add_generation_prompt,
                                        **kwargs)
        except Exception as e:  # jinja2 raise_exception() and template errors are the request's fault
            raise P.ProtocolError("bad_request", f"chat template: {e}", "messages") from None
        return msgs, kwargs, text

    def _spans(self, msgs, text, tools, kwargs, only, add_generation_prompt: bool = True):
        try:
            return message_spans(self.template, msgs, text, tools=tools, only=only,
                                 add_generation_prompt=add_generation_prompt, **kwargs)
        except Exception as e:  # a template that cannot be probed leaves the prompt without cut points
            log.warning("message_spans_failed", error=repr(e))
            return None

    def chat_prompt(self, op) -> Prompt:
        """Render, tokenize with offsets, and find the cut points (DESIGN §4.3) of a chat body."""
        msgs, kwargs, text = self._render(op)
        ids, offsets = self.tok.encode_with_offsets(text)
        tools = op.tools or None
        spans = self._spans(msgs, text, tools, kwargs, "cuts")
        cuts = cut_points(text, ids, offsets, spans) if spans is not None else None
        return Prompt(ids, text, offsets, msgs, tools, kwargs, cuts)

    def _check_ids(self, ids, field: str) -> None:
        v = self.tok.vocab_size
        for i, t in enumerate(ids):
            if not 0 <= t < v:
                raise P.ProtocolError("bad_request", f"token id {t} is outside the vocabulary [0, {v})",
                                      f"{field}[{i}]")

    def completion_ids(self, op) -> list[int]:
        """Token ids of a completion prompt (text is tokenized without special-token insertion)."""
        if isinstance(op.prompt, str):
            return self.tok.encode(op.prompt)
        self._check_ids(op.prompt, "prompt")
        return list(op.prompt)

    def tokenize(self, op) -> dict:
        """The `tokenize` op's result: tokens, offsets, text, and for chat bodies message spans and cut points."""
        if op.text is not None:
            text = op.text
        else:
            msgs, kwargs, text = self._render(op.chat, op.add_generation_prompt)
        ids, offsets = self.tok.encode_with_offsets(text)
        out = {"tokens": ids, "offsets": [list(o) for o in offsets], "text": text}
        if op.text is None:
            spans = self._spans(msgs, text, op.chat.tools or None, kwargs, None, op.add_generation_prompt)
            if spans is None:
                out["messages"] = [{"role": str(m.get("role")), "start": None, "end": None} for m in msgs]
                out["cut_points"] = {"publish": 0, "opener": None}
            else:
                out["messages"] = spans.wire()
                out["cut_points"] = cut_points(text, ids, offsets, spans).wire()
        return out

    # ---- generation ----
    def _sampling(self, op, prompt_len: int) -> SamplingParams:
        s = op.sampling
        max_tokens = s.max_tokens
        if max_tokens is None:
            max_tokens = max(1, min(self.default_max_tokens, self.context_tokens - prompt_len))
        return SamplingParams(
            max_tokens=max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
            seed=s.seed, stop_token_ids=frozenset(self.tok.stop_token_ids),
            logprobs=bool(op.logprobs), top_logprobs=op.top_logprobs or 0)

    def _logprob_entry(self, ev: TokenEvent) -> dict:
        return {"token": self.tok.decode([ev.token_id]), "token_id": ev.token_id, "logprob": ev.logprob,
                "top_logprobs": [{"token": self.tok.decode([t]), "token_id": t, "logprob": lp}
                                 for t, lp in (ev.top or [])]}

    async def generate(self, conn, op, ids: list[int], parser=None, prompt: Prompt | None = None) -> None:
        """Run one chat/completion request through the engine and stream its replies on `conn`.

        parser: for chat, the OutputParser that splits text into content / reasoning_content / tool_calls deltas;
        None for completion (text deltas only). prompt: the rendered prompt with its cut points (reuse).
        """
        prompt_logprobs = getattr(op, "prompt_logprobs", None)
        prompt = prompt or Prompt(ids)
        cuts = prompt.cuts
        msgs = prompt.messages or []
        req = Request(rid=conn.rid(op.id), prompt_ids=ids, sampling=self._sampling(op, len(ids)),
                      priority=Priority(op.priority), prompt_logprobs=prompt_logprobs,
                      cache_prompt=op.cache_prompt,
                      publish=cuts.publish if cuts else 0, opener=cuts.opener if cuts else None,
                      cut_reason=cuts.reason if cuts else None,
                      after_user=bool(msgs) and msgs[-1].get("role") == "user")
        decoder = StreamDecoder(self.tok, list(op.sampling.stop))
        queue = self.engine.submit(req)
        conn.rids[op.id] = req.rid
        consumed = 0
        logprobs: list[dict] = []
        pending_lp: list[dict] = []
        stop_hit = False
        while True:
            ev = await queue.get()
            if isinstance(ev, ErrorEvent):
                raise P.ProtocolError(ev.code, ev.message, ev.field)
            if isinstance(ev, TokenEvent):
                if stop_hit:
                    continue
                consumed += 1
                piece = decoder.push(ev.token_id)
                if op.logprobs:
                    entry = self._logprob_entry(ev)
                    logprobs.append(entry)
                    pending_lp.append(entry)
                if decoder.stopped:
                    stop_hit = True
                    self.engine.cancel(req.rid, FinishReason.STOP)
                if op.stream and (piece or pending_lp) and not conn.closed:
                    await self._send_delta(conn, op.id, piece, parser, pending_lp)
                    pending_lp = []
                continue
            assert isinstance(ev, DoneEvent)
            break
        tail = "" if stop_hit else decoder.flush()
        if op.stream and not conn.closed:
            await self._send_delta(conn, op.id, tail, parser, [], final=True)
        if parser is not None and not op.stream:
            parser.feed(decoder.text)
        parsed = parser.finish() if parser is not None else None
        finish = FinishReason.STOP if stop_hit else ev.finish_reason
        generated = consumed if stop_hit else ev.generated_tokens
        text = decoder.text
        usage = {"prompt_tokens": ev.prompt_tokens, "completion_tokens": generated,
                 "total_tokens": ev.prompt_tokens + generated,
                 "prompt_tokens_details": {"cached_tokens": ev.cached_tokens}}
        timings = {"queue_ms": round(ev.queue_ms, 3), "load_ms": 0.0, "ttft_ms": round(ev.ttft_ms, 3),
                   "prefill_tokens_per_s": round(ev.prefill_tokens_per_s, 2),
                   "decode_tokens_per_s": round(ev.decode_tokens_per_s, 2)}
        reuse = self.reuse_reply(ev.reuse or ReuseInfo(), ev.cached_tokens, prompt)
        message = None
        if parsed is not None:
            message = parsed.message()
            if parsed.has_tool_calls and finish is FinishReason.STOP:
                finish = FinishReason.TOOL_CALLS
        if self.metrics is not None:
            self.metrics.requests_total.labels(finish_reason=finish.value).inc()
        log.info("done", id=op.id, prompt=ev.prompt_tokens, cached=ev.cached_tokens, prefilled=ev.prefilled_tokens,
                 generated=generated, tier=reuse["tier"], kind=reuse["kind"], reason=reuse["reason"],
                 ttft_ms=f"{ev.ttft_ms:.1f}",
                 tok_s=f"{ev.decode_tokens_per_s:.1f}", finish=finish.value)
        await conn.send(P.done(op.id, text, finish.value, usage, timings, reuse, message=message,
                               logprobs=logprobs if op.logprobs else None,
                               prompt_logprobs=ev.prompt_logprobs))

    def reuse_reply(self, ri: ReuseInfo, cached_tokens: int, prompt: Prompt) -> dict:
        """The `ignis.reuse` object (DESIGN §5) from the engine's ReuseInfo; diverged_at is located in the request's
        rendered text and messages."""
        best = div = None
        if ri.candidate_tokens is not None:
            cand = list(ri.candidate_tokens)
            best = {"kind": ri.candidate_kind, "tier": ri.candidate_tier, "tokens": len(cand)}
            try:
                theirs = prompt.text if prompt.text is not None else self.tok.decode(prompt.ids)
                div = diverged_at(cand, prompt.ids, self.tok.decode(cand), theirs, prompt.offsets,
                                  token=ri.candidate_common)
                if div is not None and prompt.messages:
                    span = message_at_char(self.template, prompt.messages, prompt.text, div["char_offset"],
                                           tools=prompt.tools, **(prompt.kwargs or {}))
                    div["message_index"] = span.index if span else None
                    div["role"] = span.role if span else None
            except Exception as e:  # the report is best effort; never fail a finished request over it
                log.warning("diverged_at_failed", error=repr(e))
                div = None
        hit = ri.kind is not None and cached_tokens > 0
        return P.reuse(tier=ri.tier if hit else None, kind=ri.kind if hit else None,
                       cached_tokens=cached_tokens, reason=None if hit else (ri.reason or "miss"),
                       best_candidate=best, diverged_at=div)

    async def _send_delta(self, conn, rid: str, piece: str, parser, logprobs: list, final: bool = False) -> None:
        """Send one streamed delta: plain text for completion; for chat, the parser's content / reasoning_content /
        tool_calls pieces (nothing while it holds text back that may be part of a tag). final: flush the parser."""
        if parser is None:
            if piece or logprobs:
                await conn.send(P.delta(rid, piece, logprobs=logprobs or None))
            return
        d = parser.feed(piece) if piece else {}
        if final:
            d = _merge(d, parser.finish().delta)
        if d or logprobs:
            await conn.send(P.delta(rid, d.get("content") or "", logprobs=logprobs or None,
                                    reasoning_content=d.get("reasoning_content"), tool_calls=d.get("tool_calls")))

    def status(self) -> dict:
        """The full `status` object of DESIGN §5 (zeros where a feature does not exist yet)."""
        st = self.engine.status()
        return {"model": self.model_info, **{k: st[k] for k in ("lanes", "queue", "kv_pool", "slots", "tiers",
                                                                 "retained", "requests", "live_states")}}


def _merge(a: dict, b: dict) -> dict:
    """Concatenate two parser deltas (strings joined, tool-call pieces appended)."""
    out = dict(a)
    for k, v in (b or {}).items():
        if k == "tool_calls":
            out[k] = list(out.get(k) or []) + list(v)
        elif v:
            out[k] = (out.get(k) or "") + v
    return out
