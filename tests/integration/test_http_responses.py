"""The Responses front of a real daemon over plain HTTP (TCP), with what Codex CLI sends: instructions, developer and
user messages, a function_call and its function_call_output, function and non-function tools, reasoning options;
the event sequence of the stream, usage against the daemon's own tokenize count, reuse on a repeat, the probe Codex
may send, and the refusal of previous_response_id."""
from __future__ import annotations

import json

from http_support import http, http_addr, sse, status, wait_idle

INSTRUCTIONS = "You are Codex, a coding agent running in a terminal. " + " ".join(["Be precise and safe."] * 20)
DEV = "<permissions instructions>Commands run in a sandbox; network access is restricted.</permissions instructions>"
ENV = "<environment_context><cwd>/work/project</cwd><shell>bash</shell></environment_context>"
SHELL = {"type": "function", "name": "shell", "description": "Runs a shell command and returns its output.",
         "strict": False, "parameters": {"type": "object", "properties": {
             "command": {"type": "array", "items": {"type": "string"}}, "workdir": {"type": "string"}},
             "required": ["command"], "additionalProperties": False}}
CODEX_TOOLS = [SHELL, {"type": "local_shell"}, {"type": "web_search"},
               {"type": "custom", "name": "apply_patch", "description": "Apply a patch",
                "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}]


def _text(t: str) -> list:
    return [{"type": "input_text", "text": t}]


def codex_body(**extra) -> dict:
    return {"model": "gpt-5-codex", "instructions": INSTRUCTIONS, "input": [
        {"type": "message", "role": "developer", "content": _text(DEV)},
        {"type": "message", "role": "user", "content": _text(ENV)},
        {"type": "message", "role": "user", "content": _text("List the files here.")},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": None, "encrypted_content": None},
        {"type": "function_call", "id": "fc_1", "name": "shell", "arguments": json.dumps({"command": ["ls"]}),
         "call_id": "call_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "a.txt\nb.txt"}],
        "tools": CODEX_TOOLS, "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": False, "stream": True,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "session-1", "max_output_tokens": 8,
        "temperature": 0, **extra}


def equivalent_chat() -> dict:
    """The same conversation as a socket chat body, written by hand."""
    return {"messages": [
        {"role": "system", "content": INSTRUCTIONS}, {"role": "developer", "content": DEV},
        {"role": "user", "content": ENV}, {"role": "user", "content": "List the files here."},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "shell", "arguments": json.dumps({"command": ["ls"]})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"}],
        "tools": [{"type": "function", "function": {"name": "shell", "description": SHELL["description"],
                                                    "parameters": SHELL["parameters"]}}]}


def check_sequence(evs: list) -> dict:
    """The stream's grammar: created, in_progress, items opened and closed in order with their deltas inside,
    then one terminal event; returns the terminal event's response."""
    names = [n for n, _ in evs]
    assert names[:2] == ["response.created", "response.in_progress"], names
    assert names[-1] in ("response.completed", "response.incomplete"), names
    assert [d["sequence_number"] for _, d in evs] == list(range(len(evs)))
    assert all(d["type"] == n for n, d in evs)
    open_item, index = None, 0
    for n, d in evs[2:-1]:
        if n == "response.output_item.added":
            assert open_item is None and d["output_index"] == index
            open_item = d["item"]
        elif n == "response.output_item.done":
            assert d["item"]["id"] == open_item["id"] and d["output_index"] == index
            open_item, index = None, index + 1
        else:
            assert open_item is not None and d["item_id"] == open_item["id"], (n, d)
    assert open_item is None
    final = evs[-1][1]["response"]
    assert len(final["output"]) == index
    return final


def test_codex_request_streams_the_event_sequence(http_qwen):
    d = http_qwen
    c = d.conn()
    c.request({"id": "r", "op": "reset"})
    n = len(c.request({"id": "t", "op": "tokenize", **equivalent_chat()})["result"]["tokens"])
    c.close()
    h = http(http_addr(d))
    r = h.post("/v1/responses", json=codex_body())
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    evs = sse(r.content)
    final = check_sequence(evs)
    assert evs[0][1]["response"]["status"] == "in_progress"
    u = final["usage"]
    assert (u["input_tokens"], u["output_tokens"], u["input_tokens_details"]["cached_tokens"]) == (n, 8, 0)
    assert final["status"] == "incomplete" and final["incomplete_details"] == {"reason": "max_output_tokens"}
    # Qwen3.5 reasons first: the reply opens a reasoning item whose text came as reasoning_text deltas
    assert final["output"][0]["type"] == "reasoning"
    deltas = "".join(x["delta"] for name, x in evs if name == "response.reasoning_text.delta")
    assert deltas == final["output"][0]["content"][0]["text"]
    log = d.log()
    for kind in ("local_shell", "web_search", "custom"):
        assert f"tool_ignored api=responses type={kind}" in log
    # the same request again resumes from what the first one left (the longest retained state under the prompt)
    kept = max(s["tokens"] for s in status(d)["retained"] if s["tokens"] < n)
    again = check_sequence(sse(h.post("/v1/responses", json=codex_body()).content))
    assert again["usage"]["input_tokens_details"]["cached_tokens"] == kept > 0
    wait_idle(d)


def test_text_reply_without_reasoning(http_qwen):
    """reasoning.effort none turns the template's thinking off: the reply is a message with output_text deltas."""
    d = http_qwen
    r = http(http_addr(d)).post("/v1/responses", json=codex_body(reasoning={"effort": "none"}))
    evs = sse(r.content)
    final = check_sequence(evs)
    names = [n for n, _ in evs]
    if final["output"] and final["output"][0]["type"] == "message":
        text = "".join(x["delta"] for n, x in evs if n == "response.output_text.delta")
        assert text == final["output"][0]["content"][0]["text"] and "response.content_part.added" in names
    assert "response.reasoning_text.delta" not in names
    body = codex_body(reasoning={"effort": "none"}, stream=False)
    whole = http(http_addr(d)).post("/v1/responses", json=body).json()
    assert whole["object"] == "response" and whole["usage"]["output_tokens"] == 8
    assert all(o["type"] != "reasoning" for o in whole["output"])
    if whole["status"] == "incomplete" and whole["output"]:      # cut at max_output_tokens: so is its last item
        assert whole["output"][-1]["status"] == "incomplete"
        streamed = [x["item"] for n, x in evs if n == "response.output_item.done"]
        assert final["status"] != "incomplete" or streamed[-1]["status"] == "incomplete"
    wait_idle(d)


def test_probe_and_previous_response_id(http_qwen):
    h = http(http_addr(http_qwen))
    r = h.post("/v1/responses", json={"model": "gpt-5-codex", "input": [], "max_output_tokens": 1})
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "incomplete" and body["usage"]["output_tokens"] == 1
    r = h.post("/v1/responses", json={"model": "m", "input": "hi", "previous_response_id": "resp_abc"})
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "previous_response_id" and "no response store" in err["message"]
    r = h.post("/v1/responses", json={"model": "m", "input": "hi", "max_output_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_output_tokens"
    wait_idle(http_qwen)


def test_refusals_name_the_input_item(http_llama):
    """SmolLM2's template renders no tool calls: a function_call item is refused naming that item (the socket
    names the same message as messages[1].tool_calls)."""
    h = http(http_addr(http_llama))
    body = {"input": [{"role": "user", "content": "hi"},
                      {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c", "output": "r"}]}
    r = h.post("/v1/responses", json=body)
    err = r.json()["error"]
    assert (r.status_code, err["code"], err["param"]) == (400, "model_unsupported", "input[1].tool_calls")
    r = h.post("/v1/responses", json={"input": "hi", "tools": [SHELL]})
    assert (r.status_code, r.json()["error"]["param"]) == (400, "tools")
    r = h.post("/v1/responses", json={"input": "tide " * 1100, "max_output_tokens": 4})      # over the 1,024 context
    err = r.json()["error"]
    assert (r.status_code, err["code"], err["param"]) == (400, "context_length_exceeded", "input"), err
    assert err["message"].startswith("prompt is too long: ")
