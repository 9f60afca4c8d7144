"""The OpenAI front of a real daemon, driven by the official `openai` SDK (HTTP over a Unix socket and over TCP):
chat streamed and not, a completion, usage with cached tokens on a second turn, errors, auth, cancellation when the
client drops the connection, and the template-faithfulness refusals. Expected values come from the daemon's own
socket ops (tokenize, chat), never from the HTTP reply itself."""
from __future__ import annotations

import httpx2
import openai
import pytest
from http_support import HTTP_KEY, done_line, http, http_addr, openai_client, status, wait_idle

SYSTEM = {"role": "system", "content": "You are a travel guide. " + " ".join(["river bridge market"] * 30)}
USER1 = {"role": "user", "content": "Tell me about " + " ".join(["garden harbour tower museum"] * 24)}


def sock(d, body: dict) -> dict:
    c = d.conn()
    try:
        return c.request({"id": "s", **body})
    finally:
        c.close()


def tokenize(d, body: dict) -> dict:
    return sock(d, {"op": "tokenize", **body})["result"]


def test_chat_matches_the_socket(http_llama):
    d = http_llama
    c = openai_client(http_addr(d))
    msgs = [{"role": "user", "content": "Name three rivers."}]
    want = sock(d, {"op": "chat", "messages": msgs, "max_tokens": 8, "temperature": 0, "cache_prompt": False})
    n = len(tokenize(d, {"messages": msgs})["tokens"])
    r = c.chat.completions.create(model="anything", messages=msgs, max_tokens=8, temperature=0,
                                  extra_body={"cache_prompt": False})
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.content == want["message"]["content"]
    assert r.choices[0].finish_reason == want["finish_reason"] == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (n, 8, n + 8)
    assert r.model_extra["ignis"]["reuse"]["reason"] == "reuse_off"
    text, finish, usage = "", None, None
    for ch in c.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0, stream=True,
                                        stream_options={"include_usage": True}, extra_body={"cache_prompt": False}):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
        if ch.usage is not None:
            usage = ch.usage
    assert (text, finish) == (want["text"], "length")
    assert (usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens_details.cached_tokens) == (n, 8, 0)
    r = c.chat.completions.create(model="m", messages=msgs, max_tokens=8, temperature=0, logprobs=True,
                                  top_logprobs=2, extra_body={"cache_prompt": False})
    lp = r.choices[0].logprobs.content
    assert len(lp) == 8 and all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.logprob for t in lp)
    assert "".join(t.token for t in lp) == want["text"]
    assert [m.id for m in c.models.list().data] == [sock(d, {"op": "status"})["result"]["model"]["name"]]
    wait_idle(d)


def test_completion_matches_the_socket(http_llama):
    d = http_llama
    want = sock(d, {"op": "completion", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0})
    n = len(tokenize(d, {"text": "Once upon a time"})["tokens"])
    r = openai_client(http_addr(d)).completions.create(model="m", prompt="Once upon a time", max_tokens=6,
                                                       temperature=0, logprobs=2)
    ch = r.choices[0]
    assert (ch.text, ch.finish_reason, r.usage.prompt_tokens) == (want["text"], "length", n)
    assert len(ch.logprobs.tokens) == 6 and all(len(t) == 2 for t in ch.logprobs.top_logprobs)
    assert "".join(ch.logprobs.tokens) == want["text"]


@pytest.mark.parametrize("stream", [False, True])
def test_second_turn_reports_cached_tokens(http_llama, stream):
    d = http_llama
    sock(d, {"op": "reset"})
    c = openai_client(http_addr(d))
    t1 = [SYSTEM, USER1]
    opener = tokenize(d, {"messages": t1})["cut_points"]["opener"]

    def ask(msgs):
        if not stream:
            r = c.chat.completions.create(model="m", messages=msgs, max_tokens=4, temperature=0)
            return r.choices[0].message.content, r.usage
        text, usage = "", None
        for ch in c.chat.completions.create(model="m", messages=msgs, max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True}):
            text += ch.choices[0].delta.content or "" if ch.choices else ""
            usage = ch.usage or usage
        return text, usage
    a1, u1 = ask(t1)
    assert u1.prompt_tokens_details.cached_tokens == 0
    t2 = t1 + [{"role": "assistant", "content": a1}, {"role": "user", "content": "And the bridges?"}]
    _, u2 = ask(t2)
    assert u2.prompt_tokens == len(tokenize(d, {"messages": t2})["tokens"])
    # turn 1's opener checkpoint, or (attention-only: the whole sequence is kept, DESIGN §4.3) past turn 1's reply
    # when the reply re-renders to the ids it was generated as
    whole = u1.prompt_tokens + u1.completion_tokens - 1
    assert u2.prompt_tokens_details.cached_tokens in (opener, whole) and opener > 0
    wait_idle(d)


def test_bad_bodies_get_the_socket_codes(http_llama):
    d = http_llama
    c = openai_client(http_addr(d))
    cases = [({"messages": []}, "bad_request", "messages"),
             ({"messages": [{"role": "user", "content": "x"}], "temperature": 5}, "bad_request", "temperature"),
             ({"messages": [{"role": "wizard", "content": "x"}]}, "bad_request", "messages[0].role"),
             ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 5000}, "context_length", "max_tokens"),
             ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {
                 "name": "f", "parameters": {"type": "object"}}}]}, "model_unsupported", "tools"),
             ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
                 {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "a", "content": "r"}]}, "model_unsupported",
              "messages[1].tool_calls")]
    for body, code, field in cases:
        want = sock(d, {"op": "chat", **body})
        assert want["type"] == "error" and (want["error"]["code"], want["error"]["field"]) == (code, field)
        with pytest.raises(openai.BadRequestError) as e:
            c.chat.completions.create(model="m", **body)
        err = e.value.body
        openai_code = {"context_length": "context_length_exceeded"}.get(code, code)     # OpenAI's own spelling
        assert (e.value.status_code, err["code"], err["param"], err["ignis"]["code"]) == (400, openai_code, field,
                                                                                            code), err
        assert err["message"] == want["error"]["message"]
    h = http(http_addr(d))
    r = h.post("/v1/chat/completions", content=b"{not json")
    assert (r.status_code, r.json()["error"]["code"]) == (400, "bad_json")
    r = h.post("/v1/completions", content=b"[1, 2]")
    assert (r.status_code, r.json()["error"]["code"]) == (400, "bad_json")
    r = h.get("/v1/nothing/here")
    assert (r.status_code, r.json()["error"]["type"]) == (404, "not_found_error")
    r = h.get("/v1/chat/completions")
    assert (r.status_code, r.json()["error"]["code"], r.headers["Allow"]) == (405, "method_not_allowed", "POST")
    assert r.json()["error"]["message"] == "GET is not allowed on /v1/chat/completions; use POST"
    wait_idle(d)


def _errors_counted(h, code: str) -> float:
    for line in h.get("/metrics").text.splitlines():
        if line.startswith(f'ignis_errors_total{{code="{code}"}}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_an_engine_refusal_is_logged_and_counted_like_the_sockets(http_llama, stream):
    """A request the engine refuses (context_length) before its answer starts: the HTTP status, one more
    ignis_errors_total{code} (the metric the socket's refusals move) and an error_reply log line."""
    d = http_llama
    h = http(http_addr(d))
    before = _errors_counted(h, "context_length")
    r = h.post("/v1/chat/completions", json={"messages": [USER1], "max_tokens": 10_000_000, "stream": stream})
    err = r.json()["error"]
    assert (r.status_code, err["code"], err["ignis"]["code"]) == (400, "context_length_exceeded", "context_length")
    # the phrases clients key their trim / compact on: OpenAI's (litellm) and Anthropic's; the context is 1,024
    prompt = len(sock(d, {"op": "tokenize", "messages": [USER1]})["result"]["tokens"])
    assert err["message"].startswith(f"input length and max_tokens exceed context limit: {prompt} + 10000000 > "
                                     "1024 (this model's maximum context length is 1024 tokens)"), err
    assert _errors_counted(h, "context_length") == before + 1
    assert "error_reply http=400 code=context_length" in d.log()
    wait_idle(d)


def test_wrong_key_is_401(http_llama_keyed):
    addr = http_addr(http_llama_keyed)
    msgs = [{"role": "user", "content": "hi"}]
    for key in ("wrong", "-"):
        with pytest.raises(openai.AuthenticationError) as e:
            openai_client(addr, key=key).chat.completions.create(model="m", messages=msgs)
        assert e.value.body["code"] == "auth"
    r = httpx2.post(f"http://{addr}/v1/chat/completions", json={"messages": msgs})   # no header at all
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx2.get(f"http://{addr}/health").status_code == 200   # health needs no key
    r = openai_client(addr, key=HTTP_KEY).chat.completions.create(model="m", messages=msgs, max_tokens=2)
    assert r.usage.completion_tokens == 2
    assert httpx2.get(f"http://{addr}/metrics", headers={"Authorization": f"Bearer {HTTP_KEY}"}).status_code == 200
    wait_idle(http_llama_keyed, HTTP_KEY)


def test_dropped_connection_cancels_the_request(http_llama):
    d = http_llama
    c = openai_client(http_addr(d))
    msgs = [{"role": "user", "content": "Write a long story."}]
    stream = c.chat.completions.create(model="m", messages=msgs, max_tokens=900, temperature=0, stream=True)
    it = iter(stream)
    first = next(it)
    next(it)
    stream.close()   # the SDK closes the HTTP connection mid-stream
    line = done_line(d, first.id)
    assert line["finish"] == "cancelled" and int(line["generated"]) < 900
    st = wait_idle(d)
    assert st["kv_pool"]["pages_live"] == 0 and not st["requests"]
    # a non-streamed request whose client gives up (a read timeout closes the connection) is cancelled too
    with pytest.raises(httpx2.TimeoutException):
        http(http_addr(d), timeout=0.3).post("/v1/chat/completions",
                                             json={"messages": msgs, "max_tokens": 900, "temperature": 0})
    gone = [ln for ln in d.log().splitlines() if "http_client_gone" in ln][-1]
    rid = gone.split("id=")[1].split()[0]
    line = done_line(d, rid)
    assert line["finish"] == "cancelled" and int(line["generated"]) < 900
    wait_idle(d)


def test_tool_conversation_on_a_template_with_tools(http_qwen):
    d = http_qwen
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "18C"}]
    n = len(tokenize(d, {"messages": msgs, "tools": tools})["tokens"])
    r = openai_client(http_addr(d)).chat.completions.create(model="m", messages=msgs, tools=tools, max_tokens=3,
                                                            temperature=0)
    assert r.usage.prompt_tokens == n and r.choices[0].finish_reason in ("length", "stop", "tool_calls")
    wait_idle(d)


def test_status_rows_name_each_request_by_the_id_of_its_log_lines(http_llama):
    """`status` rows carry request_id, the id the request's log lines name (a client's X-Request-Id, a socket op's
    id) beside the engine's key: the two differed for every request (h:<body id>, <connection>:<op id>)."""
    d = http_llama
    c = openai_client(http_addr(d))
    sock = d.conn()
    msgs = [{"role": "user", "content": "Write a long story."}]
    stream = c.chat.completions.create(model="m", messages=msgs, max_tokens=900, temperature=0, stream=True,
                                       extra_headers={"X-Request-Id": "trace-42"})
    it = iter(stream)
    first = next(it)
    sock.send({"id": "sock-7", "op": "chat", "messages": msgs, "max_tokens": 900, "temperature": 0, "stream": True})
    while sock.recv().get("type") != "delta":
        pass
    rows = {r["request_id"]: r for r in status(d)["requests"]}
    assert set(rows) == {"trace-42", "sock-7"}, rows
    assert rows["trace-42"]["id"] == f"h:{first.id}" and rows["sock-7"]["id"].endswith(":sock-7")
    assert rows["sock-7"]["id"] != "sock-7"
    stream.close()
    sock.close()
    assert done_line(d, "trace-42")["finish"] == "cancelled" and done_line(d, "sock-7")["finish"] == "cancelled"
    wait_idle(d)
