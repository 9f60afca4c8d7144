"""Synthetic agent sessions for the lint tests and tools/bench_lint.py: one neutral conversation written out as an
OpenAI chat, an Anthropic Messages or a Responses body (a plain module, like daemon_support).

A conversation is ``(system, tools, messages)``: tools ``(name, description, JSON schema)``; messages ``{"role":
"user", "text"}``, ``{"role": "assistant", "text", "reasoning"?, "calls"?: [(id, name, arguments)]}``, ``{"role":
"tool", "id", "text"}``."""
from __future__ import annotations

import json

SHAPES = ("openai", "anthropic", "responses")

SYSTEM = ("You are a careful coding agent working in the repository at /srv/app. Read files before you edit them, "
          "run the tests after every change and keep answers short.")


def schema(*props: str) -> dict:
    """An object schema with string properties `props`, all required."""
    return {"type": "object", "properties": {p: {"type": "string", "description": f"the {p}"} for p in props},
            "required": list(props)}


TOOLS = [("read_file", "Read a file of the repository and return its text.", schema("path")),
         ("write_file", "Write text to a file of the repository, replacing it.", schema("path", "text")),
         ("run_tests", "Run the test suite, or one test file, and return the report.", schema("target"))]


def reordered_keys(s: dict) -> dict:
    """The schema with the keys of every object in reverse order (same JSON value)."""
    if isinstance(s, dict):
        return {k: reordered_keys(s[k]) for k in reversed(list(s))}
    return s


def openai_body(system: str, tools, messages: list[dict]) -> dict:
    """The conversation as an OpenAI chat.completions body."""
    out = [{"role": "system", "content": system}]
    for m in messages:
        if m["role"] == "user":
            out.append({"role": "user", "content": m["text"]})
        elif m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": m["id"], "content": m["text"]})
        else:
            a = {"role": "assistant", "content": m.get("text") or None}
            if m.get("reasoning"):
                a["reasoning_content"] = m["reasoning"]
            if m.get("calls"):
                a["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(args)}}
                                   for i, n, args in m["calls"]]
            out.append(a)
    body = {"model": "agent", "messages": out, "max_tokens": 1}
    if tools:
        body["tools"] = [{"type": "function", "function": {"name": n, "description": d, "parameters": p}}
                         for n, d, p in tools]
    return body


def anthropic_body(system: str, tools, messages: list[dict]) -> dict:
    """The conversation as an Anthropic Messages body (consecutive tool results share one user message)."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "user":
            out.append({"role": "user", "content": m["text"]})
        elif m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["id"], "content": m["text"]}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        else:
            blocks = []
            if m.get("reasoning"):
                blocks.append({"type": "thinking", "thinking": m["reasoning"], "signature": "sig"})
            if m.get("text"):
                blocks.append({"type": "text", "text": m["text"]})
            blocks += [{"type": "tool_use", "id": i, "name": n, "input": args} for i, n, args in m.get("calls", ())]
            out.append({"role": "assistant", "content": blocks})
    body = {"model": "agent", "system": system, "messages": out, "max_tokens": 1}
    if tools:
        body["tools"] = [{"name": n, "description": d, "input_schema": p} for n, d, p in tools]
    return body


def responses_body(system: str, tools, messages: list[dict]) -> dict:
    """The conversation as a Responses body (instructions + input items)."""
    items: list[dict] = []
    for m in messages:
        if m["role"] == "user":
            items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": m["text"]}]})
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["id"], "output": m["text"]})
        else:
            if m.get("reasoning"):
                items.append({"type": "reasoning", "summary": [{"type": "summary_text", "text": m["reasoning"]}]})
            if m.get("text"):
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": m["text"]}]})
            items += [{"type": "function_call", "call_id": i, "name": n, "arguments": json.dumps(args)}
                      for i, n, args in m.get("calls", ())]
    body = {"model": "agent", "instructions": system, "input": items, "max_output_tokens": 1}
    if tools:
        body["tools"] = [{"type": "function", "name": n, "description": d, "parameters": p} for n, d, p in tools]
    return body


BODIES = {"openai": openai_body, "anthropic": anthropic_body, "responses": responses_body}


def body(shape: str, system: str, tools, messages: list[dict]) -> dict:
    """The conversation in `shape` (one of SHAPES)."""
    return BODIES[shape](system, tools, messages)


def agent_session(steps: int, width: int = 1) -> list[list[dict]]:
    """The message lists of a byte-stable tool loop: request k has the first user message and k tool-call rounds
    (each: an assistant call with reasoning, then the tool's result of `width` × ~60 words)."""
    msgs: list[dict] = [{"role": "user", "text": "The test test_parser.py fails since the last commit; fix it."}]
    out = [list(msgs)]
    for k in range(steps - 1):
        cid = f"call_{k:03d}"
        msgs.append({"role": "assistant", "reasoning": f"I should look at file number {k} next.",
                     "calls": [(cid, "read_file", {"path": f"src/module_{k}.py"})]})
        text = " ".join(f"line {k}.{j}: def handler_{j}(request): return process(request, retries={j})"
                        for j in range(6 * width))
        msgs.append({"role": "tool", "id": cid, "text": text})
        out.append(list(msgs))
    return out
