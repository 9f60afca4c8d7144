"""The edge without a model: a scripted engine feeds token events to `Edge.stream`, which yields typed edge events
(no wire dicts); the NDJSON front renders them in the shapes of DESIGN §5. Real SmolLM2 tokenizer and template."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from ignis_client import protocol as P
from text_corpus import ignis_smollm_tokenizer

from ignisd.edge import Edge
from ignisd.edge_events import ChatMessage, EdgeDelta, EdgeDone, EdgeError, TokenLogprob, ToolCall, ToolCallPiece, Usage
from ignisd.fronts.ndjson import NdjsonFront
from ignisd.request import DoneEvent, ErrorEvent, FinishReason, ReuseInfo, TokenEvent
from ignisd.text.chat_template import ChatTemplate

MSGS = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def tok():
    return ignis_smollm_tokenizer()


class ScriptedEngine:
    """Answers every submit with the token ids of `text` (logprobs when asked), then a DoneEvent or `error`."""

    def __init__(self, tok, text: str = "", finish=FinishReason.LENGTH, error=None, reuse=None):
        self.ids = tok.encode(text)
        self.finish, self.error, self.reuse = finish, error, reuse
        self.submitted, self.cancels = [], []

    def submit(self, req):
        self.submitted.append(req)
        q = asyncio.Queue()
        if self.error:
            q.put_nowait(ErrorEvent(req.rid, *self.error))
            return q
        for t in self.ids:
            q.put_nowait(TokenEvent(req.rid, t, -0.5, [(t, -0.5), (7, -3.0)]) if req.sampling.logprobs
                         else TokenEvent(req.rid, t))
        q.put_nowait(DoneEvent(req.rid, self.finish, len(req.prompt_ids), 0, len(req.prompt_ids), len(self.ids),
                               1.23456, 2.5, 100.123, 50.456, reuse=self.reuse))
        return q

    def cancel(self, rid, reason=FinishReason.CANCELLED):
        self.cancels.append((rid, reason))
        return True

    def status(self):
        return {"lanes": {}, "queue": {}, "kv_pool": {}, "slots": {}, "tiers": [], "retained": [], "requests": [],
                "live_states": 0}

    def reset(self):
        return 2


class Conn:
    def __init__(self):
        self.out, self.rids, self.closed = [], {}, False

    def rid(self, cid):
        return f"c1:{cid}"

    async def send(self, obj):
        self.out.append(obj)


def _edge(tok, engine, family="none"):
    tpl = ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token)
    return Edge(engine, tok, tpl, model_info={"name": "m"}, context_tokens=2048, default_max_tokens=64,
                developer_policy="into-system", output_family=family)


def _events(edge, gen):
    async def go():
        return [ev async for ev in edge.stream(gen)]
    return asyncio.run(go())


def test_stream_yields_typed_deltas_then_done(tok):
    eng = ScriptedEngine(tok, "Paris is sunny")
    edge = _edge(tok, eng)
    op = P.parse_request({"id": "a", "op": "completion", "prompt": "The capital", "stream": True, "logprobs": True})
    gen = edge.prepare_completion(op, "c1:a")
    assert not eng.submitted                       # prepare submits nothing
    evs = _events(edge, gen)
    assert eng.submitted == [gen.request]
    *deltas, done = evs
    assert deltas and all(type(d) is EdgeDelta for d in deltas) and type(done) is EdgeDone
    assert "".join(d.text for d in deltas) == done.text == "Paris is sunny"
    assert all(isinstance(lp, TokenLogprob) for d in deltas for lp in d.logprobs)
    assert done.usage == Usage(len(gen.request.prompt_ids), len(eng.ids), 0)
    assert done.finish_reason is FinishReason.LENGTH and done.message is None
    assert len(done.logprobs) == len(eng.ids) and done.logprobs[0].top[1].token_id == 7


def test_not_streaming_yields_only_done(tok):
    edge = _edge(tok, ScriptedEngine(tok, "Paris is sunny"))
    op = P.parse_request({"id": "a", "op": "completion", "prompt": [1, 2, 3]})
    evs = _events(edge, edge.prepare_completion(op, "c1:a"))
    assert [type(e) for e in evs] == [EdgeDone] and evs[0].text == "Paris is sunny" and evs[0].logprobs is None


def test_stop_string_ends_the_text_and_stops_the_engine(tok):
    eng = ScriptedEngine(tok, "one two STOP three four five")
    edge = _edge(tok, eng)
    op = P.parse_request({"id": "s", "op": "completion", "prompt": "x", "stop": [" STOP"], "stream": True})
    *deltas, done = _events(edge, edge.prepare_completion(op, "c1:s"))
    assert done.text == "one two" == "".join(d.text for d in deltas)
    assert done.finish_reason is FinishReason.STOP
    assert eng.cancels == [("c1:s", FinishReason.STOP)]
    assert done.usage.completion_tokens < len(eng.ids)       # tokens after the stop string are not counted


def test_engine_error_is_an_edge_error(tok):
    edge = _edge(tok, ScriptedEngine(tok, error=("busy", "queue full", None)))
    op = P.parse_request({"id": "e", "op": "chat", "messages": MSGS, "stream": True})
    assert _events(edge, edge.prepare_chat(op, "c1:e")) == [EdgeError("busy", "queue full", None)]


def test_chat_tool_call_events_and_their_ndjson(tok):
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    eng = ScriptedEngine(tok, text, finish=FinishReason.STOP)
    front = NdjsonFront(_edge(tok, eng, family="qwen3"))
    conn = Conn()
    op = P.parse_request({"id": "t", "op": "chat", "messages": MSGS, "stream": True})
    gen = front.edge.prepare_chat(op, "c1:t")
    evs = _events(front.edge, gen)
    pieces = [p for e in evs if type(e) is EdgeDelta for p in (e.tool_calls or ())]
    assert pieces and all(isinstance(p, ToolCallPiece) for p in pieces) and pieces[0].name == "get_weather"
    done = evs[-1]
    assert done.finish_reason is FinishReason.TOOL_CALLS
    call = done.message.tool_calls[0]
    assert isinstance(done.message, ChatMessage) and isinstance(call, ToolCall)
    assert "".join(p.arguments for p in pieces) == call.arguments
    asyncio.run(front.answer(conn, op))
    first = next(r for r in conn.out if r["type"] == "delta" and "tool_calls" in r)
    tc = first["tool_calls"][0]
    assert list(tc) == ["index", "id", "type", "function"] and tc["type"] == "function"
    assert tc["function"]["name"] == "get_weather"
    final = conn.out[-1]
    assert final["type"] == "done" and final["finish_reason"] == "tool_calls"
    m = final["message"]
    assert m["role"] == "assistant" and m["content"] is None
    assert m["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": call.arguments}


def test_ndjson_done_line(tok):
    eng = ScriptedEngine(tok, "Hi", reuse=ReuseInfo(reason="short"))
    front = NdjsonFront(_edge(tok, eng))
    conn = Conn()
    op = P.parse_request({"id": "d", "op": "completion", "prompt": [1, 2], "logprobs": True, "top_logprobs": 1})
    asyncio.run(front.answer(conn, op))
    (done,) = conn.out
    n = len(eng.ids)
    assert done == {
        "id": "d", "type": "done", "text": "Hi", "finish_reason": "length",
        "usage": {"prompt_tokens": 2, "completion_tokens": n, "total_tokens": 2 + n,
                  "prompt_tokens_details": {"cached_tokens": 0}},
        "timings": {"queue_ms": 1.235, "load_ms": 0.0, "ttft_ms": 2.5, "prefill_tokens_per_s": 100.12,
                    "decode_tokens_per_s": 50.46},
        "ignis": {"reuse": {"tier": None, "kind": None, "cached_tokens": 0, "reason": "short",
                            "best_candidate": None, "diverged_at": None}},
        "logprobs": [{"token": tok.decode([t]), "token_id": t, "logprob": -0.5,
                      "top_logprobs": [{"token": tok.decode([t]), "token_id": t, "logprob": -0.5},
                                       {"token": tok.decode([7]), "token_id": 7, "logprob": -3.0}]}
                     for t in eng.ids]}
    assert conn.rids == {"d": "c1:d"}


def test_one_method_per_op(tok):
    eng = ScriptedEngine(tok)
    front = NdjsonFront(_edge(tok, eng))
    conn = Conn()
    conn.rids["run"] = "c1:run"
    for obj in ({"op": "tokenize", "text": "hello"}, {"op": "detokenize", "tokens": [1, 2]},
                {"op": "cancel", "target": "run"}, {"op": "cancel", "target": "nope"}, {"op": "health"},
                {"op": "status"}, {"op": "metrics"}, {"op": "reset"}):
        asyncio.run(front.answer(conn, P.parse_request({"id": "x", **obj})))
    results = [r["result"] for r in conn.out]
    assert results[0]["text"] == "hello" and results[1] == {"text": tok.decode([1, 2])}
    assert results[2:5] == [{"cancelled": True}, {"cancelled": False}, {"ok": True, "model": "m"}]
    assert set(results[5]) >= {"model", "lanes", "kv_pool", "slots", "tiers", "retained", "requests"}
    assert results[6:] == [{"text": ""}, {"dropped": 2}]
    assert eng.cancels == [("c1:run", FinishReason.CANCELLED)]
    with pytest.raises(P.ProtocolError) as e:
        asyncio.run(front.answer(conn, P.parse_request({"id": "x", "op": "detokenize", "tokens": [10 ** 9]})))
    assert e.value.field == "tokens[0]"


def test_edge_modules_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import ignisd.edge, ignisd.prompt, ignisd.fronts.ndjson, ignisd.server, ignisd.unix_socket\n")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_default_max_tokens_fits_the_kv_pool(tok):
    """No max_tokens sent: the default (64 here) is capped by what the context (2,048) and, when smaller, the whole
    KV pool leave after the prompt, so a small pool never refuses a request the client gave no size."""
    n = len(tok.encode("hi"))
    edge = _edge(tok, ScriptedEngine(tok))
    assert edge._sampling(P.CompletionOp(id="a", prompt="hi"), n).max_tokens == 64
    edge.pool_tokens = n + 10
    assert edge._sampling(P.CompletionOp(id="a", prompt="hi"), n).max_tokens == 10
    assert edge._sampling(P.CompletionOp(id="a", prompt="hi", sampling=P.Sampling(max_tokens=500)),
                          n).max_tokens == 500      # an explicit size is the client's, refused at admission if too big
