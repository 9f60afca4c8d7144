"""The Anthropic Messages front of a real daemon, driven by the official `anthropic` SDK: messages streamed and not,
count_tokens against the daemon's own tokenize count, usage with cache reads on a second turn, tools, errors, auth,
cancellation on a dropped connection, and Claude Code's billing-header nonce (stripped: two requests differing only
in it resume from the same retained state; kept: they do not). Expected values come from the socket's ops."""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import anthropic
import pytest
from http_support import HTTP_KEY, anthropic_client, done_line, http, http_addr, wait_idle

SYSTEM = "You are a travel guide. " + " ".join(["river bridge market"] * 30)
T0 = {"temperature": 0}   # this SDK has no temperature argument: sent as an extra body field
USER1 = "Tell me about " + " ".join(["garden harbour tower museum"] * 24)


def sock(d, body: dict, key: str | None = None) -> dict:
    c = d.conn()
    try:
        return c.request({"id": "s", **body, **({"api_key": key} if key else {})})
    finally:
        c.close()


def count(d, messages: list, key: str | None = None, **extra) -> int:
    return len(sock(d, {"op": "tokenize", "messages": messages, **extra}, key)["result"]["tokens"])


def test_messages_match_the_socket(http_llama):
    d = http_llama
    c = anthropic_client(http_addr(d))
    oa = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name three rivers."}]
    want = sock(d, {"op": "chat", "messages": oa, "max_tokens": 8, "temperature": 0, "cache_prompt": False})
    n = count(d, oa)
    kw = dict(model="claude-code-model", max_tokens=8, system="Be brief.",
              messages=[{"role": "user", "content": "Name three rivers."}],
              extra_body={"temperature": 0, "cache_prompt": False})
    m = c.messages.create(**kw)
    assert m.type == "message" and m.role == "assistant" and m.model == "claude-code-model"
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == want["message"]["content"]
    assert m.stop_reason == "max_tokens" and m.stop_sequence is None
    u = m.usage
    assert (u.input_tokens, u.output_tokens, u.cache_read_input_tokens, u.cache_creation_input_tokens) == (n, 8, 0, 0)
    assert c.messages.count_tokens(model="m", system="Be brief.", messages=kw["messages"]).input_tokens == n
    with c.messages.stream(**kw) as st:
        text = "".join(st.text_stream)
        final = st.get_final_message()
    assert text == want["message"]["content"] and final.stop_reason == "max_tokens"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (n, 8)
    wait_idle(d)


@pytest.mark.parametrize("stream", [False, True])
def test_second_turn_reads_the_cache(http_llama, stream):
    d = http_llama
    sock(d, {"op": "reset"})
    c = anthropic_client(http_addr(d))
    oa1 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER1}]
    opener = sock(d, {"op": "tokenize", "messages": oa1})["result"]["cut_points"]["opener"]

    def ask(msgs):
        kw = dict(model="m", max_tokens=4, system=SYSTEM, messages=msgs, extra_body=T0)
        if not stream:
            m = c.messages.create(**kw)
        else:
            with c.messages.stream(**kw) as st:
                events = list(st)
                m = st.get_final_message()
            # message_start is written after the first token (well under a second here), so it already carries
            # the reuse split the final message_delta reports (it used to say cache_read 0, input the whole prompt)
            start = events[0].message.usage
            assert events[0].type == "message_start"
            assert (start.input_tokens, start.cache_read_input_tokens) == (m.usage.input_tokens,
                                                                           m.usage.cache_read_input_tokens)
        return m.content[0].text, m.usage
    a1, u1 = ask([{"role": "user", "content": USER1}])
    assert u1.cache_read_input_tokens == 0
    msgs2 = [{"role": "user", "content": USER1}, {"role": "assistant", "content": a1},
             {"role": "user", "content": "And the bridges?"}]
    _, u2 = ask(msgs2)
    n2 = count(d, oa1 + [{"role": "assistant", "content": a1}, {"role": "user", "content": "And the bridges?"}])
    # turn 1's opener checkpoint, or past turn 1's reply (attention-only: the whole sequence is kept, DESIGN §4.3)
    assert u2.cache_read_input_tokens in (opener, u1.input_tokens + u1.output_tokens - 1) and opener > 0
    assert u2.input_tokens + u2.cache_read_input_tokens == n2 and u2.cache_creation_input_tokens == 0
    assert c.messages.count_tokens(model="m", system=SYSTEM, messages=msgs2).input_tokens == n2
    wait_idle(d)


def test_message_start_reports_reuse_before_a_slow_first_token(start_daemon, tiny_llama_dir):
    """Each prefill round waits 1.5 s first (tests/seams), so a second turn's message_start (sent a second in) goes
    out before its first token: it must already carry the reuse split that message_delta reports (the engine's
    admission event; it said cache_read 0 and the whole prompt as input before)."""
    path = Path(tempfile.mkdtemp(prefix="ignis-http-", dir="/tmp")) / "http.sock"
    seams = {"PYTHONPATH": str(Path(__file__).resolve().parents[1] / "seams"), "IGNIS_TEST_PREFILL_DELAY_S": "1.5"}
    d = start_daemon(["--model", str(tiny_llama_dir), "--lanes", "2", "--vram-kv-pool-bytes", "4Ktok",
                      "--model-context-tokens", "1024", "--server-http-listen", f"unix:{path}"], env=seams)
    c = anthropic_client(http_addr(d))

    def ask(msgs):
        at = {}
        with c.messages.stream(model="m", max_tokens=2, system=SYSTEM, messages=msgs, extra_body=T0) as st:
            t0 = time.monotonic()
            for ev in st:
                at.setdefault(ev.type, (time.monotonic() - t0, ev))
            m = st.get_final_message()
        return at, m
    at1, m1 = ask([{"role": "user", "content": USER1}])
    at2, m2 = ask([{"role": "user", "content": USER1}, {"role": "assistant", "content": m1.content[0].text},
                   {"role": "user", "content": "And the bridges?"}])
    for at, m in ((at1, m1), (at2, m2)):
        t_start, start = at["message_start"]
        t_first = at["content_block_delta"][0]
        assert t_first - t_start > 0.3, (t_start, t_first)     # the case under test: message_start came first
        u = start.message.usage
        assert (u.input_tokens, u.cache_read_input_tokens) == (m.usage.input_tokens, m.usage.cache_read_input_tokens)
    assert m1.usage.cache_read_input_tokens == 0 and m2.usage.cache_read_input_tokens > 0


def test_tools_and_tool_results(http_qwen):
    d = http_qwen
    tools = [{"name": "get_weather", "description": "Weather of a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    msgs = [{"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                              {"type": "tool_use", "id": "t1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18C, dry"}]}]
    oa = [{"role": "user", "content": "Weather in Paris?"},
          {"role": "assistant", "content": "Checking.", "tool_calls": [
              {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
          {"role": "tool", "tool_call_id": "t1", "content": "18C, dry"}]
    oa_tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                  "parameters": tools[0]["input_schema"]}}]
    n = count(d, oa, tools=oa_tools)
    c = anthropic_client(http_addr(d))
    assert c.messages.count_tokens(model="m", messages=msgs, tools=tools).input_tokens == n
    m = c.messages.create(model="m", max_tokens=4, messages=msgs, tools=tools, extra_body=T0)
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == n
    assert m.stop_reason in ("max_tokens", "end_turn", "tool_use")
    wait_idle(d)


def test_bad_bodies_and_refusals(http_llama):
    c = anthropic_client(http_addr(http_llama))
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=4, messages=[])
    assert e.value.body["error"]["type"] == "invalid_request_error"
    assert e.value.body["error"]["ignis"] == {"code": "bad_request", "field": "messages"}
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=4,
                          messages=[{"role": "user", "content": [{"type": "text", "text": "see"}, img]}])
    assert e.value.body["error"]["ignis"] == {"code": "model_unsupported", "field": "messages[0].content[1]"}
    with pytest.raises(anthropic.BadRequestError) as e:   # SmolLM2's template renders no tools
        c.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "x"}],
                          tools=[{"name": "f", "input_schema": {"type": "object"}}])
    assert e.value.body["error"]["ignis"] == {"code": "model_unsupported", "field": "tools"}
    with pytest.raises(anthropic.BadRequestError) as e:   # a tool_use it would drop: named in Anthropic terms
        c.messages.create(model="m", max_tokens=4, messages=[
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]}])
    assert e.value.body["error"]["ignis"] == {"code": "model_unsupported", "field": "messages[1].tool_calls"}
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=5000, messages=[{"role": "user", "content": "x"}])
    assert e.value.body["error"]["ignis"]["code"] == "context_length"
    assert "exceed context limit" in e.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as e:    # the prompt alone: the words Claude Code compacts on
        c.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "tide " * 1100}])
    assert e.value.body["error"]["ignis"] == {"code": "context_length", "field": "messages"}
    assert e.value.body["error"]["message"].startswith("prompt is too long: ")
    assert " tokens > 1023 maximum (this model's maximum context length is 1024 tokens" in \
        e.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        c.get("/v1/messages/nope", cast_to=object)
    r = http(http_addr(http_llama)).post("/v1/messages",                  # the Messages API requires max_tokens
                                         json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["ignis"] == {"code": "bad_request", "field": "max_tokens"}
    r = http(http_addr(http_llama)).post("/v1/messages/count_tokens",     # ... but counting does not
                                         json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0


def test_wrong_key_is_401(http_llama_keyed):
    addr = http_addr(http_llama_keyed)
    msgs = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.AuthenticationError) as e:
        anthropic_client(addr, key="wrong").messages.create(model="m", max_tokens=2, messages=msgs)
    assert e.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(addr, key="wrong").messages.count_tokens(model="m", messages=msgs)
    m = anthropic_client(addr, key=HTTP_KEY).messages.create(model="m", max_tokens=2, messages=msgs)
    assert m.usage.output_tokens == 2
    wait_idle(http_llama_keyed, HTTP_KEY)


def test_dropped_connection_cancels_the_request(http_llama):
    d = http_llama
    c = anthropic_client(http_addr(d))
    with c.messages.stream(model="m", max_tokens=900, messages=[{"role": "user", "content": "Write a long story."}],
                           extra_body=T0) as st:
        it = iter(st)
        start = next(it)
        next(it)
        next(it)
    # leaving the block closed the HTTP response mid-stream
    line = done_line(d, start.message.id)
    assert line["finish"] == "cancelled" and int(line["generated"]) < 900
    wait_idle(d)


def _claude_code_body(nonce: str) -> dict:
    billing = f"x-anthropic-billing-header: cc_version=2.1.3.a1; cc_entrypoint=cli; cch={nonce};"
    return {"model": "claude-code-model", "max_tokens": 3, "extra_body": T0,
            "system": [{"type": "text", "text": billing},
                       {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
                       {"type": "text", "text": SYSTEM}],
            "messages": [{"role": "user", "content": "Fix the failing test."}]}


def test_billing_nonce_does_not_defeat_reuse(http_llama, http_llama_keyed):
    on, off = http_llama, http_llama_keyed
    sock(on, {"op": "reset"})
    sock(off, {"op": "reset"}, HTTP_KEY)
    # what the stripped request renders: the system blocks without the billing one, joined as text parts are
    oa = [{"role": "system", "content": "You are Claude Code, Anthropic's official CLI for Claude." + SYSTEM},
          {"role": "user", "content": "Fix the failing test."}]
    cuts = sock(on, {"op": "tokenize", "messages": oa})["result"]["cut_points"]
    # the system block is a retained prefix; the opener is less than a page past it, and an attention-only model
    # keeps its checkpoint all the same (DESIGN §4.3): the second request resumes there
    assert cuts["publish"] >= 64 and cuts["opener"] - cuts["publish"] < 64
    c_on = anthropic_client(http_addr(on))
    first = c_on.messages.create(**_claude_code_body("a1b2c"))
    second = c_on.messages.create(**_claude_code_body("f9e8d"))
    assert first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == cuts["opener"]
    assert first.usage.input_tokens == count(on, oa) == second.usage.input_tokens + cuts["opener"]
    reuse = second.model_extra["ignis"]["reuse"]
    assert (reuse["kind"], reuse["reason"]) == ("checkpoint", None)
    c_off = anthropic_client(http_addr(off), key=HTTP_KEY)
    c_off.messages.create(**_claude_code_body("a1b2c"))
    kept = c_off.messages.create(**_claude_code_body("f9e8d"))
    assert kept.usage.cache_read_input_tokens == 0
    reuse = kept.model_extra["ignis"]["reuse"]
    assert reuse["reason"] == "miss" and reuse["diverged_at"]["message_index"] == 0
    assert "cch=" in reuse["diverged_at"]["theirs"]
    wait_idle(on)
    wait_idle(off, HTTP_KEY)
