"""The edge between the fronts and the engine (DESIGN §2): prepare a request, stream its edge events.

A front (the NDJSON socket in ``ignisd.fronts.ndjson``; HTTP APIs later) parses its wire body into an op, then:

* ``Edge.prepare_chat(op, rid)`` / ``Edge.prepare_completion(op, rid)`` → a ``Generation``: the engine submission
  (``ignisd.request.Request``), the output parser and the stream decoder (stop strings, UTF-8). Request errors raise
  ``ProtocolError`` before anything is submitted.
* ``Edge.stream(gen)``: an async iterator of typed edge events — zero or more ``EdgeDelta`` (only when the request
  streams), then one ``EdgeDone`` or one ``EdgeError``. It submits on the first step; stop strings end the request
  there (the engine is told to stop). The ``done`` log line and the request metrics are emitted here, once per
  request, whatever the front.
* The front renders each event in its own wire shape.

The other ops (tokenize, detokenize, cancel, health, status, metrics, reset) are one method each. The events are
plain dataclasses: no wire dicts. †: imports no torch.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ignis_client import protocol as P

from ignisd.edge_events import (ChatMessage, EdgeDelta, EdgeDone, EdgeError, EdgeEvent, Timings, TokenLogprob,
                                TopLogprob, ToolCall, ToolCallPiece, Usage)
from ignisd.log import get_logger
from ignisd.prompt import Prompt, Prompts
from ignisd.request import (AdmittedEvent, DoneEvent, ErrorEvent, FinishReason, Priority, Request, ReuseInfo,
                            SamplingParams, TokenEvent, context_message)
from ignisd.text.output_parser import OutputParser, count_in_spans, make_output_parser, prompt_starts_in_reasoning
from ignisd.text.tool_choice import AUTO, ToolChoice, resolve_tool_choice
from ignisd.text.stream import StreamDecoder

log = get_logger("srv")


@dataclass
class Generation:
    """A prepared chat or completion request: what to submit and how its tokens become text.

    client_id: the front's id of the request (the `done` log line names it). parser: the chat OutputParser (content
    / reasoning / tool calls), None for completion. stream: the request wants EdgeDelta events. logprobs: it asked
    for the generated tokens' logprobs.
    """

    client_id: str
    request: Request
    prompt: Prompt
    decoder: StreamDecoder
    parser: OutputParser | None = None
    stream: bool = False
    logprobs: bool = False
    stop_hit: bool = field(default=False, init=False)
    cached_tokens: int | None = field(default=None, init=False)
    """The prompt tokens restored (DESIGN §4.7), known once the request has a lane (AdmittedEvent: as planned), then
    as done (the first TokenEvent's cached_tokens, then the DoneEvent's); None while it waits for a lane."""


def _pieces(calls) -> tuple[ToolCallPiece, ...] | None:
    """The parser's OpenAI-shaped tool-call delta pieces as ToolCallPiece records."""
    if not calls:
        return None
    return tuple(ToolCallPiece(c["index"], c["function"]["arguments"], c.get("id"), c["function"].get("name"))
                 for c in calls)


def _message(parsed) -> ChatMessage:
    calls = parsed.tool_calls
    return ChatMessage(parsed.content, parsed.reasoning_content,
                       tuple(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls)
                       if calls else None)


def _merge(a: dict, b: dict) -> dict:
    """Concatenate two parser deltas (strings joined, tool-call pieces appended)."""
    out = dict(a)
    for k, v in (b or {}).items():
        if k == "tool_calls":
            out[k] = list(out.get(k) or []) + list(v)
        elif v:
            out[k] = (out.get(k) or "") + v
    return out


class Edge:
    """Prepares and streams requests for one loaded model, and answers the other ops.

    engine: ignisd.engine.Engine. tokenizer: ignisd.text.tokenizer.Tokenizer. template: ChatTemplate or None.
    model_info: the `status.model` object. context_tokens: prompt + generation cap (tokens).
    default_max_tokens: used when a request gives none (capped at what the context, and the KV pool of
    `pool_tokens` tokens when given, leave after the prompt).
    developer_policy: server.developer_message_policy. metrics: ignisd.metrics.Metrics or None.
    output_family: how chat output is split into content / reasoning / tool calls ("qwen3_5", "qwen3", "none").
    canonicalize_tools: server.canonicalize_tools (ignisd.prompt.Prompts).
    """

    def __init__(self, engine, tokenizer, template, *, model_info: dict, context_tokens: int,
                 default_max_tokens: int, developer_policy: str, metrics=None, output_family: str = "none",
                 canonicalize_tools: bool = False, pool_tokens: int | None = None):
        self.engine = engine
        self.pool_tokens = pool_tokens
        self.tok = tokenizer
        self.prompts = Prompts(tokenizer, template, developer_policy, canonicalize_tools)
        self.model_info = model_info
        self.context_tokens = context_tokens
        self.default_max_tokens = default_max_tokens
        self.metrics = metrics
        self.output_family = output_family

    # ---- prepare ----
    def prepare_chat(self, op, rid: str, fits: bool = True) -> Generation:
        """A chat op (ignis_client.protocol.ChatOp or the same fields) as a Generation with engine key `rid`.
        fits: refuse a prompt that fills the context (context_length); False for the reuse probe, which answers
        for such a prompt too. Raises ProtocolError for request errors."""
        prompt = self.prompts.chat(op)
        in_reasoning = prompt_starts_in_reasoning(prompt.text)
        choice = resolve_tool_choice(getattr(op, "tool_choice", None), op.tools, self.output_family, self.tok,
                                     in_reasoning)
        parser = make_output_parser(self.output_family, op.tools, starts_in_reasoning=in_reasoning,
                                    calls=choice.calls)
        return self._generation(op, rid, prompt, parser, fits, choice)

    def prepare_completion(self, op, rid: str) -> Generation:
        """A completion op as a Generation with engine key `rid`. Raises ProtocolError for request errors."""
        return self._generation(op, rid, self.prompts.completion(op), None)

    def _sampling(self, op, prompt_len: int, choice: ToolChoice = AUTO) -> SamplingParams:
        s = op.sampling
        max_tokens = s.max_tokens
        if max_tokens is None:     # the default never asks for more than the context or the whole KV pool holds
            room = min(self.context_tokens, self.pool_tokens or self.context_tokens) - prompt_len
            max_tokens = max(1, min(self.default_max_tokens, room))
        return SamplingParams(
            max_tokens=max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, min_p=s.min_p,
            seed=s.seed, stop_token_ids=frozenset() if s.ignore_eos else frozenset(self.tok.stop_token_ids),
            logprobs=bool(op.logprobs), top_logprobs=op.top_logprobs or 0,
            banned_token_ids=choice.banned, forced_token_ids=choice.forced,
            logit_bias=self._logit_bias(s.logit_bias), presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty)

    def _logit_bias(self, bias: dict[int, float]) -> tuple[tuple[int, float], ...]:
        """The request's logit_bias as (id, bias) pairs; a token id outside the vocabulary is refused naming it."""
        for t in bias:
            if t >= self.tok.vocab_size:
                raise P.ProtocolError("bad_request", f"logit_bias.{t}: token id {t} is not in the vocabulary of "
                                      f"{self.tok.vocab_size} tokens", f"logit_bias.{t}")
        return tuple(sorted(bias.items()))

    def _generation(self, op, rid: str, prompt: Prompt, parser, fits: bool = True,
                    choice: ToolChoice = AUTO) -> Generation:
        ids, cuts, msgs = prompt.ids, prompt.cuts, prompt.messages or []
        if fits and len(ids) >= self.context_tokens:
            # the prompt alone fills the context: name the prompt, not max_tokens (no max_tokens would fit)
            where = "prompt" if op.op == "completion" else "messages"
            raise P.ProtocolError("context_length", context_message(len(ids), self.context_tokens), where)
        req = Request(rid=rid, prompt_ids=ids, sampling=self._sampling(op, len(ids), choice),
                      priority=Priority(op.priority), prompt_logprobs=getattr(op, "prompt_logprobs", None),
                      cache_prompt=op.cache_prompt,
                      publish=cuts.publish if cuts else 0, opener=cuts.opener if cuts else None,
                      cut_reason=cuts.reason if cuts else None,
                      after_user=bool(msgs) and msgs[-1].get("role") == "user", client_id=op.id)
        return Generation(op.id, req, prompt, StreamDecoder(self.tok, list(op.sampling.stop)), parser,
                          stream=bool(op.stream), logprobs=bool(op.logprobs))

    # ---- stream ----
    def _logprob(self, ev: TokenEvent) -> TokenLogprob:
        return TokenLogprob(self.tok.decode([ev.token_id]), ev.token_id, ev.logprob,
                            tuple(TopLogprob(self.tok.decode([t]), t, lp) for t, lp in (ev.top or [])))

    @staticmethod
    def _delta(gen: Generation, piece: str, logprobs: list, final: bool = False) -> EdgeDelta | None:
        """The delta of one step: plain text for completion; for chat, the parser's content / reasoning / tool-call
        pieces (nothing while it holds back text that may be part of a tag). final: flush the parser."""
        lps = tuple(logprobs) or None
        if gen.parser is None:
            return EdgeDelta(piece, logprobs=lps) if piece or logprobs else None
        d = gen.parser.feed(piece) if piece else {}
        if final:
            d = _merge(d, gen.parser.finish().delta)
        if not d and not logprobs:
            return None
        return EdgeDelta(d.get("content") or "", d.get("reasoning_content"), _pieces(d.get("tool_calls")), lps)

    async def stream(self, gen: Generation) -> AsyncIterator[EdgeEvent]:
        """Submit `gen` to the engine and yield its edge events: EdgeDelta pieces (when gen.stream), then EdgeDone
        or EdgeError. A stop string ends the text there and tells the engine to stop. Iterate it to the end: the
        `done` log line and metrics are emitted before EdgeDone."""
        req, decoder = gen.request, gen.decoder
        queue = self.engine.submit(req)
        consumed = 0
        starts: list[int] = []     # per consumed token: where its text starts in decoder.text (chat only)
        logprobs: list[TokenLogprob] = []
        pending: list[TokenLogprob] = []
        while True:
            ev = await queue.get()
            if isinstance(ev, ErrorEvent):
                yield EdgeError(ev.code, ev.message, ev.field)
                return
            if isinstance(ev, DoneEvent):
                gen.cached_tokens = ev.cached_tokens
                break
            if isinstance(ev, AdmittedEvent):     # reuse known before the first token (its prefill may be long)
                gen.cached_tokens = ev.cached_tokens
                continue
            assert isinstance(ev, TokenEvent)
            if ev.cached_tokens is not None:
                gen.cached_tokens = ev.cached_tokens
            if gen.stop_hit:
                continue
            consumed += 1
            if gen.parser is not None:
                starts.append(decoder.decoded_chars)
            piece = decoder.push(ev.token_id)
            if gen.logprobs:
                entry = self._logprob(ev)
                logprobs.append(entry)
                pending.append(entry)
            if decoder.stopped:
                gen.stop_hit = True
                self.engine.cancel(req.rid, FinishReason.STOP)
            if gen.stream and (piece or pending):
                delta = self._delta(gen, piece, pending)
                pending = []
                if delta is not None:
                    yield delta
        tail = "" if gen.stop_hit else decoder.flush()
        if gen.stream:
            delta = self._delta(gen, tail, [], final=True)
            if delta is not None:
                yield delta
        yield self._done(gen, ev, consumed, logprobs, starts)

    def _done(self, gen: Generation, ev: DoneEvent, consumed: int, logprobs: list, starts: list[int]) -> EdgeDone:
        parser = gen.parser
        if parser is not None and not gen.stream:
            parser.feed(gen.decoder.text)
        parsed = parser.finish() if parser is not None else None
        finish = FinishReason.STOP if gen.stop_hit else ev.finish_reason
        generated = consumed if gen.stop_hit else ev.generated_tokens
        reuse = self.prompts.reuse(ev.reuse or ReuseInfo(), ev.cached_tokens, gen.prompt)
        message = None
        if parsed is not None:
            message = _message(parsed)
            if parsed.has_tool_calls and finish is FinishReason.STOP:
                finish = FinishReason.TOOL_CALLS
        if self.metrics is not None:
            self.metrics.requests_total.labels(finish_reason=finish.value).inc()
        log.info("done", id=gen.client_id, prompt=ev.prompt_tokens, cached=ev.cached_tokens,
                 prefilled=ev.prefilled_tokens, generated=generated, tier=reuse.tier, kind=reuse.kind,
                 reason=reuse.reason, ttft_ms=f"{ev.ttft_ms:.1f}", tok_s=f"{ev.decode_tokens_per_s:.1f}",
                 finish=finish.value)
        reasoning = count_in_spans(starts, parsed.reasoning_spans) if parsed is not None else 0
        return EdgeDone(gen.decoder.text, finish, Usage(ev.prompt_tokens, generated, ev.cached_tokens, reasoning),
                        Timings(ev.queue_ms, 0.0, ev.ttft_ms, ev.prefill_tokens_per_s, ev.decode_tokens_per_s),
                        reuse, message, tuple(logprobs) if gen.logprobs else None, ev.prompt_logprobs)

    # ---- the other ops ----
    def tokenize(self, op, strip_billing: bool = True) -> dict:
        """The `tokenize` op's result (see Prompts.tokenize); an op with ``api`` + ``body`` (an HTTP front's body)
        is mapped as that front maps it (ignisd.fronts.bodies; strip_billing: server.strip_billing_header)."""
        if getattr(op, "api", None) is not None:
            from ignisd.fronts.bodies import tokenize_body
            return tokenize_body(self.prompts, op.api, op.body, strip_billing, op.add_generation_prompt, op.id)
        return self.prompts.tokenize(op)

    def detokenize(self, ids: list[int], field: str = "tokens") -> str:
        """The text of token ids. Raises ProtocolError naming `field[i]` for an id outside the vocabulary."""
        self.prompts.check_ids(ids, field)
        return self.tok.decode(list(ids))

    def cancel(self, rid: str | None, reason: FinishReason = FinishReason.CANCELLED) -> bool:
        """End the request with engine key `rid` at the next round; whether it was in flight."""
        return rid is not None and bool(self.engine.cancel(rid, reason))

    async def ready(self) -> float:
        """A front awaits this before preparing a request that needs the model; returns the milliseconds it
        waited. This edge serves a loaded model: 0 at once (the daemon's ignisd.lifecycle.ModelHost waits while
        its model loads)."""
        return 0.0

    def health(self) -> dict:
        """The `health` result of a loaded edge: ok and the model's name (the daemon answers with
        ignisd.lifecycle.ModelHost.health, which also says when the engine stalls or no model is loaded)."""
        return {"ok": True, "model": self.model_info["name"]}

    def status(self) -> dict:
        """The full `status` object of DESIGN §5 (zeros where a feature does not exist yet)."""
        st = self.engine.status()
        return {"model": self.model_info, **{k: st[k] for k in ("lanes", "queue", "kv_pool", "slots", "tiers",
                                                                 "retained", "requests", "live_states")}}

    def metrics_text(self) -> str:
        """Prometheus exposition of the daemon's metrics ("" without metrics)."""
        return self.metrics.render() if self.metrics is not None else ""

    def reset(self) -> int:
        """Drop every retained state not pinned by a running restore; how many were dropped."""
        n = self.engine.reset()
        log.info("reset", dropped=n)
        return n
