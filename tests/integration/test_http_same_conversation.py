"""One conversation through the socket and each HTTP front (OpenAI chat, Anthropic Messages, Responses) gives the
same prompt tokens, the same cached tokens on its second turn and the same greedy reply; and a front's prompt is
token for token the socket's, since it resumes from the state the socket's identical request left."""
from __future__ import annotations

import pytest
from http_support import http, http_addr, status, wait_idle

SYSTEM = "You are a travel guide. " + " ".join(["river bridge market garden"] * 25)
USER1 = "Tell me about " + " ".join(["harbour tower museum street square"] * 22)
ASSISTANT1 = "Sure, here is a short tour of the harbour."
USER2 = "And the bridges?"
TOOL = {"name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def turns(with_tools: bool):
    t1 = [("system", SYSTEM), ("user", USER1)]
    return t1, t1 + [("assistant", ASSISTANT1), ("user", USER2)], with_tools


def socket_run(d, msgs, tools, _addr) -> tuple:
    body = {"id": "s", "op": "chat", "messages": [{"role": r, "content": c} for r, c in msgs], "max_tokens": 4,
            "temperature": 0}
    if tools:
        body["tools"] = [{"type": "function", "function": TOOL}]
    c = d.conn()
    r = c.request(body)
    c.close()
    m = r["message"]
    return r["usage"]["prompt_tokens"], r["usage"]["prompt_tokens_details"]["cached_tokens"], m["content"] or None, \
        m["reasoning_content"]


def openai_run(d, msgs, tools, addr) -> tuple:
    body = {"model": "m", "messages": [{"role": r, "content": c} for r, c in msgs], "max_tokens": 4, "temperature": 0}
    if tools:
        body["tools"] = [{"type": "function", "function": TOOL}]
    r = http(addr).post("/v1/chat/completions", json=body).json()
    m = r["choices"][0]["message"]
    return r["usage"]["prompt_tokens"], r["usage"]["prompt_tokens_details"]["cached_tokens"], m["content"] or None, \
        m["reasoning_content"]


def anthropic_run(d, msgs, tools, addr) -> tuple:
    body = {"model": "m", "system": msgs[0][1], "messages": [{"role": r, "content": c} for r, c in msgs[1:]],
            "max_tokens": 4, "temperature": 0}
    if tools:
        body["tools"] = [{"name": TOOL["name"], "description": TOOL["description"],
                          "input_schema": TOOL["parameters"]}]
    r = http(addr).post("/v1/messages", json=body).json()
    u = r["usage"]
    text = "".join(b["text"] for b in r["content"] if b["type"] == "text") or None
    thinking = "".join(b["thinking"] for b in r["content"] if b["type"] == "thinking") or None
    return u["input_tokens"] + u["cache_read_input_tokens"], u["cache_read_input_tokens"], text, thinking


def responses_run(d, msgs, tools, addr) -> tuple:
    body = {"model": "m", "instructions": msgs[0][1], "max_output_tokens": 4, "temperature": 0,
            "input": [{"type": "message", "role": r,
                       "content": [{"type": "input_text" if r == "user" else "output_text", "text": c}]}
                      for r, c in msgs[1:]]}
    if tools:
        body["tools"] = [{"type": "function", **TOOL}]
    r = http(addr).post("/v1/responses", json=body).json()
    out = {o["type"]: o for o in r["output"]}
    text = out["message"]["content"][0]["text"] if "message" in out else None
    thinking = out["reasoning"]["content"][0]["text"] if "reasoning" in out else None
    return r["usage"]["input_tokens"], r["usage"]["input_tokens_details"]["cached_tokens"], text, thinking


FRONTS = {"socket": socket_run, "openai": openai_run, "anthropic": anthropic_run, "responses": responses_run}


@pytest.mark.parametrize("daemon", ["http_llama", "http_qwen"])
def test_same_conversation_through_every_front(request, daemon):
    d = request.getfixturevalue(daemon)
    addr = http_addr(d)
    t1, t2, tools = turns(daemon == "http_qwen")
    c = d.conn()
    body1 = {"messages": [{"role": r, "content": x} for r, x in t1]}
    if tools:
        body1["tools"] = [{"type": "function", "function": TOOL}]
    k1 = c.request({"id": "t", "op": "tokenize", **body1})["result"]
    results = {}
    for name, run in FRONTS.items():
        c.request({"id": "r", "op": "reset"})
        results[name] = (run(d, t1, tools, addr), run(d, t2, tools, addr))
    for name, got in results.items():
        assert got == results["socket"], name
    (p1, cached1, *_), (p2, cached2, *_) = results["socket"]
    assert p1 == len(k1["tokens"]) and cached1 == 0
    assert cached2 == k1["cut_points"]["opener"] and p2 > p1
    # token identity: each front's first turn resumes from what the socket's identical request kept
    for name, run in FRONTS.items():
        c.request({"id": "r", "op": "reset"})
        socket_run(d, t1, tools, addr)
        kept = max(s["tokens"] for s in status(d)["retained"] if s["tokens"] < p1)
        assert run(d, t1, tools, addr)[1] == kept > 0, name
    c.close()
    wait_idle(d)
