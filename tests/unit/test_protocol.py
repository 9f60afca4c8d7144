"""The wire format of DESIGN §5 (client/protocol.py): framing, envelope, every op's validation with its error code
and field path, and the reply builders. Expected replies are written out by hand from the design text."""
from __future__ import annotations

import os

import orjson
import pytest

from ignis_client import protocol as P
from ignis_client.protocol import (ChatOp, CancelOp, CompletionOp, DetokenizeOp, ProtocolError, Sampling, SimpleOp,
                                   TokenizeOp)

USER = [{"role": "user", "content": "hi"}]


def err(line_or_obj, max_line_bytes=P.DEFAULT_MAX_LINE_BYTES) -> dict:
    """The error reply a request produces (decode + parse), or fail if it is accepted."""
    with pytest.raises(ProtocolError) as ei:
        if isinstance(line_or_obj, bytes):
            P.parse_request(P.decode_line(line_or_obj, max_line_bytes))
        else:
            P.parse_request(line_or_obj)
    return ei.value.reply()


def check(reply: dict, rid, code: str, field) -> None:
    assert set(reply) == {"id", "type", "error"}
    assert reply["id"] == rid and reply["type"] == "error"
    assert reply["error"]["code"] == code and reply["error"]["field"] == field, reply
    assert set(reply["error"]) == {"code", "message", "field"}
    assert reply["error"]["message"]
    if field is not None:
        assert reply["error"]["message"].startswith(field), reply


def test_constants_match_design():
    assert P.ERROR_CODES == ("bad_json", "bad_request", "unknown_op", "duplicate_id", "too_long", "context_length",
                             "auth", "busy", "model_unsupported", "internal")
    assert set(P.OPS) == {"chat", "completion", "cancel", "tokenize", "detokenize", "status", "metrics", "health",
                          "reset"}
    assert P.TIERS == ("device", "ram", "disk") and P.KINDS == ("prefix", "checkpoint")
    assert P.FINISH_REASONS == ("stop", "length", "cancelled", "tool_calls")
    assert P.REUSE_REASONS == ("miss", "short", "below_page", "stamp_mismatch", "reuse_off", "prompt_logprobs",
                               "no_slot", "cut_unaligned")


# ------------------------------------------------------------------ framing

@pytest.mark.parametrize("line", [b"\xff\xfe{}", b'{"id": "r1", "op": "he\xc3', b"{", b"not json", b"",
                                  b'{"id": "r1",}', b'{"a": NaN}'])
def test_bad_json(line):
    check(err(line), None, "bad_json", None)


@pytest.mark.parametrize("line", [b"[1, 2]", b'"chat"', b"3", b"null", b"true"])
def test_not_an_object_is_bad_json(line):
    reply = err(line)
    check(reply, None, "bad_json", None)
    assert "object" in reply["error"]["message"]


def test_too_long_boundary():
    body = b'{"id": "r1", "op": "health", "pad": "'
    line = body + b"x" * (100 - len(body) - 2) + b'"}'
    assert len(line) == 100
    assert P.parse_request(P.decode_line(line, max_line_bytes=100)) == SimpleOp("r1", "health")
    reply = err(line + b" ", max_line_bytes=100)
    check(reply, None, "too_long", None)
    assert "101" in reply["error"]["message"] and "100" in reply["error"]["message"]


def test_invalid_utf8_says_so_with_the_byte_offset():
    line = b'{"id": "a", "op": "chat", "messages": "\xff\xfe"}'
    reply = err(line)
    check(reply, None, "bad_json", None)
    assert "not valid UTF-8" in reply["error"]["message"] and f"byte {line.index(bytes([0xff]))}" in \
        reply["error"]["message"]


def test_trailing_cr_is_whitespace():
    assert P.decode_line(b'{"id": "a", "op": "status"}\r') == {"id": "a", "op": "status"}


# ------------------------------------------------------------------ envelope

@pytest.mark.parametrize("obj", [{"op": "health"}, {"id": "", "op": "health"}, {"id": "x" * 129, "op": "health"},
                                 {"id": 5, "op": "health"}, {"id": None, "op": "health"}, {"id": ["a"], "op": "x"}])
def test_bad_id(obj):
    check(err(obj), None, "bad_request", "id")


def test_id_limits():
    assert P.parse_request({"id": "x" * 128, "op": "health"}).id == "x" * 128
    assert P.parse_request({"id": "é" * 128, "op": "health"}).id == "é" * 128   # characters, not bytes


def test_op_errors():
    check(err({"id": "r1"}), "r1", "bad_request", "op")
    check(err({"id": "r1", "op": 7}), "r1", "bad_request", "op")
    reply = err({"id": "r1", "op": "frobnicate"})
    check(reply, "r1", "unknown_op", "op")
    assert "frobnicate" in reply["error"]["message"]


def test_api_key_must_be_a_string():
    check(err({"id": "r1", "op": "status", "api_key": 5}), "r1", "bad_request", "api_key")
    assert P.parse_request({"id": "r1", "op": "status", "api_key": "k"}) == SimpleOp("r1", "status", "k")


@pytest.mark.parametrize("op", ["health", "status", "metrics", "reset"])
def test_simple_ops(op):
    assert P.parse_request({"id": "q", "op": op, "extra": 1}) == SimpleOp("q", op)


# ------------------------------------------------------------------ chat validation: (body fields, field path)

CHAT_ERRORS = [
    ({}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}, "messages[1].role"),
    ({"messages": [{"content": "a"}]}, "messages[0].role"),
    ({"messages": [{"role": 3, "content": "a"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text"}]}]},
     "messages[0].content[1].text"),
    ({"messages": [{"role": "user", "content": ["a"]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": [{"text": "a"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": "a", "tool_calls": []}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": {"a": 1}}]}, "messages[0].tool_calls"),
    ({"messages": USER + [{"role": "assistant", "content": None,
                           "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[1].tool_calls[0].function.arguments"),
    ({"messages": USER + [{"role": "assistant", "content": None,
                           "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}]},
     "messages[1].tool_calls[0].function.name"),
    ({"messages": USER + [{"role": "assistant", "content": None, "tool_calls": [{"type": "function"}]}]},
     "messages[1].tool_calls[0].function"),
    ({"messages": USER + [{"role": "tool", "content": "42", "tool_call_id": 9}]}, "messages[1].tool_call_id"),
    ({"messages": [{"role": "user", "content": "a", "name": 1}]}, "messages[0].name"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 2**31}, "max_tokens"),
    ({"max_tokens": 10**30}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": "10"}, "max_tokens"),
    ({"max_completion_tokens": -5}, "max_completion_tokens"),
    ({"max_tokens": 5, "max_completion_tokens": 6}, "max_completion_tokens"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": False}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.01}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": 2.0}, "top_k"),
    ({"min_p": 1.1}, "min_p"),
    ({"min_p": -0.5}, "min_p"),
    ({"seed": "x"}, "seed"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"seed": 1.5}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"stop": ""}, "stop"),
    ({"stop": 5}, "stop"),
    ({"stop": ["s"] * 17}, "stop"),
    ({"stop": [1]}, "stop[0]"),
    ({"stop": ["a", ""]}, "stop[1]"),
    ({"n": 2}, "n"),
    ({"stream": "yes"}, "stream"),
    ({"stream": 1}, "stream"),
    ({"logprobs": 1}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"chat_template_kwargs": []}, "chat_template_kwargs"),
    ({"chat_template_kwargs": "enable_thinking"}, "chat_template_kwargs"),
    ({"priority": "urgent"}, "priority"),
    ({"cache_prompt": "no"}, "cache_prompt"),
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": ["f"]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools[0].function.parameters"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {}}}, "tool_choice.function.name"),
]


@pytest.mark.parametrize("fields,path", CHAT_ERRORS, ids=[p for _, p in CHAT_ERRORS])
def test_chat_errors(fields, path):
    body = {"id": "c7", "op": "chat", **({"messages": USER} if fields else {}), **fields}   # {}: no messages
    check(err(body), "c7", "bad_request", path)


def test_chat_error_over_the_wire_is_the_documented_object():
    line = orjson.dumps({"id": "r9", "op": "chat", "messages": [{"role": "user", "content": "a"},
                                                                 {"role": "user", "content": "b"},
                                                                 {"role": "wizard", "content": "c"}]})
    reply = err(line)
    wire = orjson.loads(P.encode(reply))
    assert wire == {"id": "r9", "type": "error", "error": {
        "code": "bad_request", "field": "messages[2].role",
        "message": "messages[2].role: must be one of system, user, assistant, tool, developer; got \"wizard\""}}


def test_chat_parses_everything():
    body = {"id": "r1", "op": "chat", "model": "whatever", "frequency_penalty": 0, "stream_options": {},
            "messages": [{"role": "system", "content": "S"},
                         {"role": "developer", "content": [{"type": "text", "text": "D"}]},
                         {"role": "user", "content": "U", "name": "bob"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]},
                         {"role": "tool", "content": "42", "tool_call_id": "t1"},
                         {"role": "assistant", "content": "ok", "tool_calls": [
                             {"id": "t2", "type": "function", "function": {"name": "g", "arguments": {"y": 2}}}]}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": "auto", "max_completion_tokens": 77, "temperature": 0, "top_p": 0.9, "top_k": 40,
            "min_p": 0.05, "seed": 123, "stop": "END", "stream": True, "logprobs": True, "top_logprobs": 5,
            "chat_template_kwargs": {"enable_thinking": False}, "priority": "agent", "cache_prompt": False}
    op = P.parse_request(body)
    assert op == ChatOp(id="r1", messages=body["messages"], tools=body["tools"], tool_choice="auto",
                        sampling=Sampling(max_tokens=77, temperature=0.0, top_p=0.9, top_k=40, min_p=0.05, seed=123,
                                          stop=["END"]),
                        stream=True, logprobs=True, top_logprobs=5, chat_template_kwargs={"enable_thinking": False},
                        priority="agent", cache_prompt=False)
    assert op.op == "chat" and op.sampling.greedy
    assert op.messages[3]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'   # passed through unchanged


def test_chat_defaults():
    op = P.parse_request({"id": "r1", "op": "chat", "messages": USER, "max_tokens": None, "seed": None,
                          "stop": None, "tools": None})
    assert op == ChatOp(id="r1", messages=USER)
    assert op.sampling == Sampling(max_tokens=None, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, seed=None,
                                   stop=[])
    assert (op.stream, op.logprobs, op.top_logprobs, op.priority, op.cache_prompt, op.chat_template_kwargs) == (
        False, False, 0, "interactive", True, {})
    assert not op.sampling.greedy and not op.sampling.ignore_eos
    op = P.parse_request({"id": "r2", "op": "completion", "prompt": [1, 2], "ignore_eos": True})
    assert op.sampling.ignore_eos is True


def test_sampling_limits_accepted():
    op = P.parse_request({"id": "r1", "op": "chat", "messages": USER, "max_tokens": 2**31 - 1, "temperature": 2,
                          "top_p": 1, "min_p": 1, "seed": -5, "stop": ["s"] * 16, "max_completion_tokens": 2**31 - 1})
    assert op.sampling.max_tokens == 2**31 - 1 and op.sampling.temperature == 2.0 and op.sampling.seed == -5
    assert len(op.sampling.stop) == 16


def test_assistant_null_content_with_tool_calls_and_empty_parts():
    msgs = USER + [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": ""}}]},
                   {"role": "user", "content": []}]
    assert P.parse_request({"id": "a", "op": "chat", "messages": msgs}).messages == msgs


# ------------------------------------------------------------------ completion

COMPLETION_ERRORS = [
    ({}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": []}, "prompt"), ({"prompt": 5}, "prompt"),
    ({"prompt": {"text": "a"}}, "prompt"), ({"prompt": [1, -2]}, "prompt[1]"), ({"prompt": [1, True]}, "prompt[1]"),
    ({"prompt": ["a"]}, "prompt"), ({"prompt": [1, 2.0]}, "prompt[1]"),
    ({"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt": "x", "prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt": "x", "prompt_logprobs": True}, "prompt_logprobs"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"), ({"prompt": "x", "max_tokens": -3}, "max_tokens"),
    ({"prompt": "x", "stop": [""]}, "stop[0]"), ({"prompt": "x", "priority": 1}, "priority"),
]


@pytest.mark.parametrize("fields,path", COMPLETION_ERRORS, ids=[p for _, p in COMPLETION_ERRORS])
def test_completion_errors(fields, path):
    check(err({"id": "k", "op": "completion", **fields}), "k", "bad_request", path)


def test_completion_parses():
    op = P.parse_request({"id": "k", "op": "completion", "prompt": [1, 0, 49151], "prompt_logprobs": 20,
                          "max_tokens": 1, "temperature": 0.0, "stream": True, "echo": False, "user": "u1"})
    assert op == CompletionOp(id="k", prompt=[1, 0, 49151], sampling=Sampling(max_tokens=1, temperature=0.0),
                              stream=True, prompt_logprobs=20)
    op = P.parse_request({"id": "k", "op": "completion", "prompt": "Hello", "prompt_logprobs": 0})
    assert op.prompt == "Hello" and op.prompt_logprobs == 0 and op.op == "completion"


def test_completion_legacy_integer_logprobs():
    op = P.parse_request({"id": "k", "op": "completion", "prompt": "a", "logprobs": 3})
    assert (op.logprobs, op.top_logprobs) == (True, 3)
    op = P.parse_request({"id": "k", "op": "completion", "prompt": "a", "logprobs": True, "top_logprobs": 2})
    assert (op.logprobs, op.top_logprobs) == (True, 2)


# ------------------------------------------------------------------ cancel / tokenize / detokenize

@pytest.mark.parametrize("body,path", [
    ({"op": "cancel"}, "target"), ({"op": "cancel", "target": ""}, "target"), ({"op": "cancel", "target": 3}, "target"),
    ({"op": "tokenize"}, "text"), ({"op": "tokenize", "text": "a", "messages": USER}, "text"),
    ({"op": "tokenize", "text": 5}, "text"), ({"op": "tokenize", "messages": []}, "messages"),
    ({"op": "tokenize", "messages": [{"role": "x", "content": "a"}]}, "messages[0].role"),
    ({"op": "tokenize", "text": "a", "add_generation_prompt": "no"}, "add_generation_prompt"),
    ({"op": "detokenize"}, "tokens"), ({"op": "detokenize", "tokens": "12"}, "tokens"),
    ({"op": "detokenize", "tokens": [1, "a"]}, "tokens[1]"), ({"op": "detokenize", "tokens": [-1]}, "tokens[0]"),
])
def test_other_op_errors(body, path):
    check(err({"id": "z", **body}), "z", "bad_request", path)


def test_other_ops_parse():
    assert P.parse_request({"id": "a", "op": "cancel", "target": "r1"}) == CancelOp("a", "r1")
    assert P.parse_request({"id": "a", "op": "tokenize", "text": ""}) == TokenizeOp("a", text="")
    tools = [{"type": "function", "function": {"name": "f"}}]
    op = P.parse_request({"id": "a", "op": "tokenize", "messages": USER, "tools": tools,
                          "chat_template_kwargs": {"enable_thinking": True}, "add_generation_prompt": False})
    assert op.text is None and op.add_generation_prompt is False
    assert op.chat == ChatOp(id="a", messages=USER, tools=tools, chat_template_kwargs={"enable_thinking": True})
    assert P.parse_request({"id": "a", "op": "detokenize", "tokens": []}) == DetokenizeOp("a", [])


# ------------------------------------------------------------------ replies

def test_delta_builder():
    assert orjson.loads(P.encode(P.delta("r1", "Hel"))) == {"id": "r1", "type": "delta", "text": "Hel"}
    lp = [{"token": 5, "logprob": -0.25, "top": [[5, -0.25]]}]
    tc = [{"index": 0, "id": "t", "type": "function", "function": {"name": "f", "arguments": ""}}]
    assert P.delta("r1", "", logprobs=lp, reasoning_content="hmm", tool_calls=tc) == {
        "id": "r1", "type": "delta", "text": "", "logprobs": lp, "reasoning_content": "hmm", "tool_calls": tc}


def test_done_builder_round_trip():
    d = P.done("r1", "Paris.", "stop", P.usage(12, 3, cached_tokens=4),
               P.timings(queue_ms=1.5, ttft_ms=20.0, decode_tokens_per_s=50.0), P.empty_reuse(),
               message=P.chat_message("Paris."))
    line = P.encode(d)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert orjson.loads(line) == {
        "id": "r1", "type": "done", "text": "Paris.", "finish_reason": "stop",
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15,
                  "prompt_tokens_details": {"cached_tokens": 4}},
        "timings": {"queue_ms": 1.5, "load_ms": 0.0, "ttft_ms": 20.0, "prefill_tokens_per_s": 0.0,
                    "decode_tokens_per_s": 50.0},
        "ignis": {"reuse": {"tier": None, "kind": None, "cached_tokens": 0, "reason": "miss",
                            "best_candidate": None, "diverged_at": None}},
        "message": {"role": "assistant", "content": "Paris.", "reasoning_content": None, "tool_calls": None}}
    plp = [None, {"token": 7, "logprob": -1.0, "rank": 1, "top": [[7, -1.0]]}]
    d2 = P.done("k", "a\nb", "length", P.usage(2, 1), P.timings(), P.empty_reuse("reuse_off"), prompt_logprobs=plp)
    assert "message" not in d2 and d2["prompt_logprobs"] == plp and d2["ignis"]["reuse"]["reason"] == "reuse_off"
    assert P.encode(d2).count(b"\n") == 1                  # the newline in the text is escaped


def test_builders_refuse_what_the_design_does_not_allow():
    with pytest.raises(ValueError):
        P.done("r", "", "eos", P.usage(1, 1), P.timings(), P.empty_reuse())
    with pytest.raises(ValueError):
        P.done("r", "", "stop", {"prompt_tokens": 1}, P.timings(), P.empty_reuse())
    with pytest.raises(ValueError):
        P.usage(3, 1, cached_tokens=4)
    with pytest.raises(ValueError):
        P.reuse(tier="gpu")
    with pytest.raises(ValueError):
        P.reuse(reason="because")
    with pytest.raises(ValueError):
        P.error("r", "oops", "m")


def test_reuse_builder():
    assert P.reuse("ram", "checkpoint", 640, None, None, None) == {
        "tier": "ram", "kind": "checkpoint", "cached_tokens": 640, "reason": None, "best_candidate": None,
        "diverged_at": None}


@pytest.mark.parametrize("code", ["bad_json", "bad_request", "unknown_op", "duplicate_id", "too_long",
                                  "context_length", "auth", "busy", "model_unsupported", "internal"])
def test_error_builder_every_code(code):
    assert orjson.loads(P.encode(P.error("r1", code, "why", "f"))) == {
        "id": "r1", "type": "error", "error": {"code": code, "message": "why", "field": "f"}}
    assert P.ProtocolError(code, "m").reply() == {"id": None, "type": "error",
                                                  "error": {"code": code, "message": "m", "field": None}}


def test_result_and_status_skeleton():
    assert P.result("h", {"ok": True, "model": "m"}) == {"id": "h", "type": "result",
                                                         "result": {"ok": True, "model": "m"}}
    s = P.empty_status()
    assert set(s) == {"model", "lanes", "queue", "kv_pool", "slots", "tiers", "retained", "requests"}
    assert set(s["model"]) == {"name", "arch", "kv_format", "context_tokens", "page_tokens", "page_bytes",
                               "state_bytes", "prefill_tokens_per_s"}
    assert s["lanes"] == {"total": 0, "prefill": 0, "decode": 0, "evicted": 0}
    assert s["kv_pool"] == {"pages_total": 0, "pages_free": 0, "pages_live": 0, "pages_retained": 0}
    assert s["slots"] == {"device_total": 0, "device_free": 0, "host_total": 0, "host_free": 0}
    assert s["queue"] == {"waiting": 0}


# ------------------------------------------------------------------ socket path (DESIGN §6)

def test_resolve_socket_path(tmp_path):
    missing, present = str(tmp_path / "nope.sock"), tmp_path / "there.sock"
    present.write_text("")
    full = {"IGNIS_SOCKET": "/x/a.sock", "RUNTIME_DIRECTORY": "/run/ignis:/run/other",
            "XDG_RUNTIME_DIR": "/run/user/7"}
    assert P.resolve_socket_path(full, system_path=str(present)) == "/x/a.sock"
    full.pop("IGNIS_SOCKET")
    assert P.resolve_socket_path(full, system_path=str(present)) == "/run/ignis/ignisd.sock"
    full.pop("RUNTIME_DIRECTORY")
    assert P.resolve_socket_path(full, system_path=str(present)) == str(present)
    assert P.resolve_socket_path(full, system_path=missing) == "/run/user/7/ignis/ignisd.sock"
    assert P.resolve_socket_path({"IGNIS_SOCKET": ""}, system_path=missing) == f"/tmp/ignis-{os.getuid()}/ignisd.sock"


def test_an_integer_past_64_bits_is_named_as_such():
    line = b'{"id": "r", "op": "completion", "prompt": "hi", "max_tokens": 99999999999999999999}'
    with pytest.raises(P.ProtocolError) as e:
        P.parse_request(orjson.loads(line))
    assert e.value.field == "max_tokens" and "too large for 64 bits (about 1e+20)" in str(e.value)
    assert "got 1e+20" not in str(e.value)


def test_stop_of_another_type_says_a_string_is_accepted_too():
    # OpenAI's `stop` is a string or an array of strings: the message says both
    e = err({"id": "s", "op": "chat", "messages": USER, "stop": 5})
    assert e["error"]["message"] == "stop: must be a string or an array of strings, got a number", e


@pytest.mark.parametrize("field, value, shown", [
    ("max_tokens", True, "got true"), ("temperature", "hot", 'got "hot"'), ("stream", 1, "got 1"),
    ("max_tokens", "x" * 200, 'got "' + "x" * 78 + "…"),   # 80 characters in all, the quote and "…" counted
])
def test_a_bad_value_is_shown_as_json_spells_it(field, value, shown):
    """The value in the message is the one the client sent, in JSON's spelling (true, "text"), not Python's."""
    with pytest.raises(P.ProtocolError) as e:
        P.parse_request({"id": "r", "op": "completion", "prompt": "hi", field: value})
    assert e.value.field == field and str(e.value).endswith(shown), str(e.value)


@pytest.mark.parametrize("obj, field, message", [
    ({"op": "chat", "messages": USER, "stop": [""]}, "stop[0]", 'stop[0]: must be a non-empty string, got ""'),
    ({"op": "chat", "messages": USER, "stop": ["a", None]}, "stop[1]", "stop[1]: must be a non-empty string, got null"),
    ({"op": "chat", "messages": USER, "n": "2"}, "n", 'n: only n=1 is supported, got "2"'),
    ({"op": "chat", "messages": USER, "tools": [{"type": "retrieval"}]}, "tools[0].type",
     'tools[0].type: must be "function", got "retrieval"'),
    ({"op": "cancel", "target": ""}, "target",
     'target: must be the id (string of 1 to 128 characters) of an in-flight request, got ""'),
    ({"op": "cancel", "target": False}, "target",
     "target: must be the id (string of 1 to 128 characters) of an in-flight request, got false"),
    ({"op": "frob"}, "op", 'op: unknown operation "frob"; known: ' + ", ".join(P.OPS)),
])
def test_refusals_show_the_clients_value_as_json(obj, field, message):
    """Values spelled by hand as JSON writes them (double quotes, null, false), where Python's repr wrote '', None,
    False."""
    with pytest.raises(P.ProtocolError) as e:
        P.parse_request({"id": "r", **obj})
    assert (e.value.field, str(e.value)) == (field, message)


@pytest.mark.parametrize("prompt", [["a", "b"], [[1, 2], [3]]])
def test_a_batch_of_prompts_is_named_as_a_batch(prompt):
    """OpenAI's /v1/completions takes a list of strings or of token lists; one request here serves one prompt."""
    with pytest.raises(P.ProtocolError) as e:
        P.parse_request({"id": "r", "op": "completion", "prompt": prompt})
    assert e.value.field == "prompt" and "a list of prompts (a batch of 2) is not served" in str(e.value)


def test_decode_line_names_an_http_body_as_a_body():
    with pytest.raises(P.ProtocolError) as e:
        P.decode_line(b'{"a": "\xff"}', what="body")
    assert e.value.code == "bad_json" and str(e.value).startswith("the body is not valid UTF-8 (byte 7"), str(e.value)
    with pytest.raises(P.ProtocolError) as e:
        P.decode_line(b"x" * 11, max_line_bytes=10, what="body")
    assert e.value.code == "too_long" and str(e.value).startswith("body of 11 bytes exceeds the limit of 10 bytes")
