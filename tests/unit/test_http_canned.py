"""The HTTP fronts over a scripted engine: canned model output (exact token ids of a chosen text, through the real
Qwen3.5 tokenizer, template and output parser) reaches the official openai and anthropic SDKs and a plain HTTP
client as each API's parsed tool calls, reasoning, usage and errors. The served app is the daemon's own HttpFront on
a real Unix socket; only the engine is scripted."""
from __future__ import annotations

import json
import re

import anthropic
import openai
import pytest
from ignis_client import protocol as P
from http_support import InProcess, ScriptedEngine, anthropic_client, http, openai_client, sse

from ignisd.edge import Edge
from ignisd.fronts.ndjson import NdjsonFront
from ignisd.text.chat_template import ChatTemplate


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
# the generation prompt of Qwen3.5 ends inside <think>: the reply's text starts in the reasoning
AFTER_THINK = "The user wants the weather.\n</think>\n\nLet me check.\n\n" + CALL
INSIDE_THINK = "I need the weather first.\n" + CALL + "\n</think>\n\n"
USER = [{"role": "user", "content": "Weather in Paris?"}]
LETTERS = "\U0001d518\U0001d52b\U0001d526"    # three Fraktur letters, each several byte-level tokens
FRAKTUR = "Fraktur " + LETTERS


@pytest.fixture(scope="module")
def tok(qwen_tok):
    return qwen_tok


@pytest.fixture
def srv(scripted):
    return scripted


@pytest.mark.parametrize("text", [AFTER_THINK, INSIDE_THINK], ids=["after_think", "inside_think"])
def test_openai_sdk_gets_the_parsed_tool_call(srv, text):
    s, engine = srv
    engine.text = text
    c = openai_client(s.addr)
    r = c.chat.completions.create(model="m", messages=USER, tools=[WEATHER])
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    (call,) = ch.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert ch.message.model_extra["reasoning_content"] == text.split("\n")[0]
    assert ch.message.content == ("Let me check." if text is AFTER_THINK else None)
    # streamed: the pieces add up to the same call
    name, args, reasoning, finish = None, "", "", None
    for chunk in c.chat.completions.create(model="m", messages=USER, tools=[WEATHER], stream=True):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        for tc in d.tool_calls or []:
            name = tc.function.name or name
            args += tc.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (name, json.loads(args), finish) == ("get_weather", {"city": "Paris"}, "tool_calls")
    assert reasoning == text.split("\n")[0]


@pytest.mark.parametrize("text", [AFTER_THINK, INSIDE_THINK], ids=["after_think", "inside_think"])
def test_anthropic_sdk_gets_the_tool_use_block(srv, text):
    s, engine = srv
    engine.text = text
    c = anthropic_client(s.addr)
    tools = [{"name": "get_weather", "description": "Weather of a city",
              "input_schema": WEATHER["function"]["parameters"]}]
    msgs = [{"role": "user", "content": "Weather in Paris?"}]
    m = c.messages.create(model="m", max_tokens=64, messages=msgs, tools=tools)
    assert m.stop_reason == "tool_use"
    kinds = [b.type for b in m.content]
    assert kinds == (["thinking", "text", "tool_use"] if text is AFTER_THINK else ["thinking", "tool_use"])
    use = m.content[-1]
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})
    assert re.fullmatch(r"toolu_[0-9a-f]{24}", use.id), use.id        # Anthropic's spelling of a tool_use id
    assert m.content[0].thinking == text.split("\n")[0]
    with c.messages.stream(model="m", max_tokens=64, messages=msgs, tools=tools) as st:
        events = [e.type for e in st]
        final = st.get_final_message()
    assert [b.type for b in final.content] == kinds and final.content[-1].input == {"city": "Paris"}
    assert re.fullmatch(r"toolu_[0-9a-f]{24}", final.content[-1].id) and final.content[-1].id != use.id
    assert final.stop_reason == "tool_use"
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert events.count("content_block_start") == events.count("content_block_stop") == len(kinds)


def test_responses_streams_the_function_call(srv):
    s, engine = srv
    engine.text = INSIDE_THINK
    body = {"model": "m", "stream": True, "input": [{"type": "message", "role": "user",
                                                     "content": [{"type": "input_text", "text": "Weather?"}]}],
            "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}]}
    evs = sse(http(s.addr).post("/v1/responses", json=body).content)
    names = [n for n, _ in evs]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    args = "".join(d["delta"] for n, d in evs if n == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"}
    done = evs[-1][1]["response"]
    assert [o["type"] for o in done["output"]] == ["reasoning", "function_call"]
    fc = done["output"][1]
    assert (fc["name"], json.loads(fc["arguments"]), fc["status"]) == ("get_weather", {"city": "Paris"}, "completed")
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))


def test_cached_tokens_in_each_usage_shape(srv):
    s, engine = srv
    engine.text, engine.cached = "Hello there.", 7
    r = openai_client(s.addr).chat.completions.create(model="m", messages=USER, max_tokens=8)
    n = len(engine.submitted[-1].prompt_ids)
    assert (r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens) == (n, 7)
    m = anthropic_client(s.addr).messages.create(model="m", max_tokens=8, messages=USER)
    u = m.usage
    assert (u.input_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (n - 7, 7, 0)
    body = {"model": "m", "input": "Weather in Paris?", "max_output_tokens": 8}
    ru = http(s.addr).post("/v1/responses", json=body).json()["usage"]
    assert (ru["input_tokens"], ru["input_tokens_details"]["cached_tokens"]) == (n, 7)
    # streamed usage: the last OpenAI chunk (include_usage) and Anthropic's message_delta
    chunks = list(openai_client(s.addr).chat.completions.create(
        model="m", messages=USER, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens_details.cached_tokens == 7
    with anthropic_client(s.addr).messages.stream(model="m", max_tokens=8, messages=USER) as st:
        fu = st.get_final_message().usage
    assert (fu.input_tokens, fu.cache_read_input_tokens) == (n - 7, 7)


@pytest.mark.parametrize("text,reasoning", [
    (AFTER_THINK, ["The user wants the weather.\n", "</think>"]),
    (INSIDE_THINK, ["I need the weather first.\n", "\n</think>"]),    # the call inside is not reasoning
    ("</think>\n\nHi", ["</think>"]),                                  # only the closing tag
    (FRAKTUR + ".\n</think>\n\nOK", [FRAKTUR + ".\n", "</think>"]),   # tokens that end mid-character
], ids=["after_think", "inside_think", "empty", "split_characters"])
def test_reasoning_tokens_in_each_usage_shape(srv, tok, text, reasoning):
    """Responses' output_tokens_details.reasoning_tokens and chat completions' completion_tokens_details
    .reasoning_tokens count the reply's reasoning tokens, the closing </think> included (the Qwen3.5 prompt opens
    the <think>): the tokenizer's own count of the reasoning text, streamed or not."""
    s, engine = srv
    engine.text = text
    want = sum(len(tok.encode(t)) for t in reasoning)
    total = len(tok.encode(text))
    assert 0 < want < total and len(tok.encode("</think>")) == 1
    assert len(tok.encode(LETTERS)) > len(LETTERS)        # some tokens end inside a character
    body = {"model": "m", "input": "Weather in Paris?", "tools": [{"type": "function", "name": "get_weather",
                                                                   "parameters": WEATHER["function"]["parameters"]}]}
    u = http(s.addr).post("/v1/responses", json=body).json()["usage"]
    assert (u["output_tokens"], u["output_tokens_details"]["reasoning_tokens"]) == (total, want)
    evs = sse(http(s.addr).post("/v1/responses", json={**body, "stream": True}).content)
    u = evs[-1][1]["response"]["usage"]
    assert (u["output_tokens"], u["output_tokens_details"]["reasoning_tokens"]) == (total, want)
    c = openai_client(s.addr)
    r = c.chat.completions.create(model="m", messages=USER, tools=[WEATHER])
    assert (r.usage.completion_tokens, r.usage.completion_tokens_details.reasoning_tokens) == (total, want)
    chunks = list(c.chat.completions.create(model="m", messages=USER, tools=[WEATHER], stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == want
    # the socket's done line: the same field as chat completions (it had none)
    for stream in (False, True):
        done = socket_chat(s, {"messages": USER, "tools": [WEATHER], "stream": stream})[-1]
        assert done["type"] == "done" and done["usage"]["completion_tokens"] == total
        assert done["usage"]["completion_tokens_details"] == {"reasoning_tokens": want}


class _Conn:
    """What NdjsonFront needs of a socket connection (ignisd.server.Connection): the replies it sends, in order."""
    closed = False

    def __init__(self):
        self.rids, self.sent = {}, []

    def rid(self, client_id: str) -> str:
        return f"t:{client_id}"

    async def send(self, obj: dict) -> None:
        self.sent.append(obj)


def socket_chat(s, body: dict) -> list[dict]:
    """The socket front's replies to a chat op, answered by the served Edge (the daemon's NdjsonFront)."""
    conn = _Conn()
    front = NdjsonFront(s.front.edge)
    s.call(front.answer(conn, P.parse_request({"id": "c", "op": "chat", **body})))
    return conn.sent


def test_reasoning_tokens_of_a_reply_cut_by_a_stop_string(srv, tok):
    """Tokens after the stop string are not generated output; the reasoning before it keeps its count."""
    s, engine = srv
    engine.text = "Think first.\n</think>\n\nhello STOP more words here"
    want = len(tok.encode("Think first.\n")) + 1
    c = openai_client(s.addr)
    r = c.chat.completions.create(model="m", messages=USER, stop=["STOP"])
    assert r.choices[0].message.content == "hello"
    assert r.usage.completion_tokens < len(tok.encode(engine.text))
    assert r.usage.completion_tokens_details.reasoning_tokens == want
    chunks = list(c.chat.completions.create(model="m", messages=USER, stop=["STOP"], stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == want


def test_no_reasoning_tokens_without_reasoning(srv):
    """With thinking off the prompt closes the <think> block itself: nothing generated is reasoning. A completion
    has no parser, and its usage no completion_tokens_details."""
    s, engine = srv
    engine.text = "Hello there."
    r = openai_client(s.addr).chat.completions.create(
        model="m", messages=USER, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert (r.choices[0].message.content, r.usage.completion_tokens_details.reasoning_tokens) == ("Hello there.", 0)
    u = http(s.addr).post("/v1/completions", json={"prompt": "Hi", "max_tokens": 8}).json()["usage"]
    assert u["completion_tokens"] == len(engine.tok.encode("Hello there.")) and "completion_tokens_details" not in u


def test_stop_sequence_is_named(srv):
    s, engine = srv
    engine.text = "</think>\n\nhello STOP more"
    m = anthropic_client(s.addr).messages.create(model="m", max_tokens=32, messages=USER, stop_sequences=["STOP"])
    assert (m.stop_reason, m.stop_sequence, m.content[-1].text) == ("stop_sequence", "STOP", "hello")


def test_engine_refusals_keep_their_status(srv):
    s, engine = srv
    engine.error = ("busy", "256 requests waiting", None)
    with pytest.raises(openai.RateLimitError) as e:
        openai_client(s.addr).chat.completions.create(model="m", messages=USER)
    assert e.value.response.headers["retry-after"] == "1"            # the SDKs' backoff reads it
    with pytest.raises(anthropic.RateLimitError) as e:
        anthropic_client(s.addr).messages.create(model="m", max_tokens=8, messages=USER)
    assert e.value.response.headers["retry-after"] == "1"
    with pytest.raises(openai.RateLimitError):   # streamed: the refusal comes before the stream starts
        list(openai_client(s.addr).chat.completions.create(model="m", messages=USER, stream=True))
    engine.error = ("context_length", "prompt + max_tokens exceeds the context", "max_tokens")
    with pytest.raises(anthropic.BadRequestError) as e:
        anthropic_client(s.addr).messages.create(model="m", max_tokens=8, messages=USER)
    err = e.value.body["error"]
    assert err["type"] == "invalid_request_error" and err["ignis"] == {"code": "context_length",
                                                                       "field": "max_tokens"}


def test_an_error_after_the_stream_began_is_in_the_stream(srv):
    """A failure once the response has started (a forward pass that failed) is written in each API's stream shape:
    the SDKs raise it."""
    s, engine = srv
    engine.text, engine.error, engine.error_after = "</think>\n\nHello there friend", ("internal", "boom", None), 4
    with pytest.raises(openai.APIError, match="boom"):
        list(openai_client(s.addr).chat.completions.create(model="m", messages=USER, stream=True))
    with pytest.raises(anthropic.APIStatusError, match="boom"):
        with anthropic_client(s.addr).messages.stream(model="m", max_tokens=8, messages=USER) as st:
            list(st)
    evs = sse(http(s.addr).post("/v1/responses", json={"input": "hi", "stream": True}).content)
    assert evs[-1][0] == "response.failed" and evs[-1][1]["response"]["error"] == {"code": "internal",
                                                                                  "message": "boom"}


def test_a_body_over_the_limit_is_413(tok):
    engine = ScriptedEngine(tok)
    s = InProcess(Edge(engine, tok, ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token),
                       model_info={"name": "q"}, context_tokens=4096, default_max_tokens=8,
                       developer_policy="into-system", output_family="qwen3_5"), max_body_bytes=4096)
    try:
        big = {"messages": [{"role": "user", "content": "x" * 5000}]}
        r = http(s.addr).post("/v1/chat/completions", json=big)
        assert (r.status_code, r.json()["error"]["code"]) == (413, "too_long")
        r = http(s.addr).post("/v1/messages", json={"max_tokens": 4, **big})
        assert (r.status_code, r.json()["error"]["type"]) == (413, "request_too_large")
        assert not engine.submitted
    finally:
        s.close()


def test_health_is_503_until_the_model_is_loaded(tok):
    s = InProcess(None, api_key="k")
    try:
        r = http(s.addr).get("/health")
        assert (r.status_code, r.json()) == (503, {"status": "loading"})
        r = http(s.addr).post("/v1/chat/completions", json={"messages": USER})
        assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
        engine = ScriptedEngine(tok)
        engine.text = "</think>\n\nHi"
        s.front.attach(Edge(engine, tok, ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token),
                            model_info={"name": "q"}, context_tokens=4096, default_max_tokens=8,
                            developer_policy="into-system", output_family="qwen3_5"))
        r = http(s.addr).get("/health")
        assert (r.status_code, r.json()) == (200, {"status": "ok"})
        with pytest.raises(openai.AuthenticationError):
            openai_client(s.addr, key="wrong").chat.completions.create(model="m", messages=USER)
        with pytest.raises(anthropic.AuthenticationError):
            anthropic_client(s.addr, key="wrong").messages.create(model="m", max_tokens=8, messages=USER)
        assert http(s.addr).get("/metrics").status_code == 401
        r = openai_client(s.addr, key="k").chat.completions.create(model="m", messages=USER)
        assert r.choices[0].message.content == "Hi"
        m = anthropic_client(s.addr, key="k").messages.create(model="m", max_tokens=8, messages=USER)
        assert m.content[-1].text == "Hi"
    finally:
        s.close()


def test_a_silent_stream_gets_keepalives_the_sdks_ignore(srv, monkeypatch):
    """A stream that started and then waits (here 1.5 s before the first token, as behind a long prefill) writes a
    keepalive every KEEPALIVE_S: Anthropic's `ping` event, an SSE comment line on OpenAI and Responses streams; the
    SDKs' parsers take the reply as if none had been sent."""
    from ignisd.fronts import sse as sse_mod
    monkeypatch.setattr(sse_mod, "KEEPALIVE_S", 0.1)
    s, engine = srv
    engine.text, engine.delay_s = "</think>\n\nhello there", 1.5
    h = http(s.addr)
    raw = h.post("/v1/messages", json={"model": "m", "max_tokens": 8, "messages": USER, "stream": True}).text
    names = [n for n, _ in sse(raw)]
    assert names[0] == "message_start" and names[1] == "ping" and names.count("ping") >= 3, names
    assert names.index("content_block_start") > names.index("ping")
    raw = h.post("/v1/chat/completions", json={"model": "m", "messages": USER, "stream": True}).text
    assert raw.count(": keepalive\n\n") >= 3 and raw.endswith("data: [DONE]\n\n")
    chunks = list(openai_client(s.addr).chat.completions.create(model="m", messages=USER, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "hello there"
    with anthropic_client(s.addr).messages.stream(model="m", max_tokens=8, messages=USER) as st:
        assert "".join(st.text_stream) == "hello there"


def test_messages_refuse_structured_output_by_its_field_and_count_tokens_counts(srv):
    """A Messages request asking for json_schema output is refused (400, model_unsupported) naming the field the
    client used; count_tokens of the same body still counts the prompt."""
    s, engine = srv
    body = {"model": "m", "max_tokens": 8, "messages": USER,
            "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}
    r = http(s.addr).post("/v1/messages", json=body)
    err = r.json()["error"]
    assert (r.status_code, err["ignis"]["code"], err["ignis"]["field"]) == (400, "model_unsupported",
                                                                            "output_config.format.type")
    assert err["message"].startswith("output_config.format.type: json_schema (structured output)")
    assert engine.submitted == []
    r = http(s.addr).post("/v1/messages/count_tokens", json=body)
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
