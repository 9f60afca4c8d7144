"""tool_choice (ignisd/text/tool_choice.py): "none" bans the tool-call token and leaves call markup in the text,
"required" and a named function force the reply's opening; the runner takes forced tokens and never samples banned
ones. Checked with the real Qwen3.5 tokenizer, through the HTTP fronts and the official SDKs over a scripted engine
(what the edge submits, how the reply parses), and on the runner's sampling of one row."""
from __future__ import annotations

from types import SimpleNamespace

import anthropic
import openai
import pytest
import torch
from http_support import anthropic_client, openai_client

from ignis_client.protocol import ProtocolError
from ignisd.plan import PlanItem
from ignisd.request import SamplingParams
from ignisd.runner import Runner
from ignisd.text.tool_choice import resolve_tool_choice

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
USER = [{"role": "user", "content": "Weather in Paris?"}]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def tok(qwen_tok):
    return qwen_tok


@pytest.fixture
def srv(scripted):
    return scripted


def test_none_bans_the_single_tool_call_token(tok):
    tid = tok.token_to_id("<tool_call>")
    assert tid is not None and tok.encode("<tool_call>") == [tid]         # one added token in Qwen3.5's vocabulary
    c = resolve_tool_choice("none", [WEATHER], "qwen3_5", tok, prompt_in_reasoning=True)
    assert c.banned == frozenset({tid}) and c.forced == () and not c.calls
    for auto in (None, "auto"):
        c = resolve_tool_choice(auto, [WEATHER], "qwen3_5", tok, prompt_in_reasoning=True)
        assert c.banned == frozenset() and c.forced == () and c.calls


@pytest.mark.parametrize("choice, family, text", [
    ("required", "qwen3_5", "<tool_call>\n"),
    ({"type": "function", "function": {"name": "get_time"}}, "qwen3_5", "<tool_call>\n<function=get_time>\n"),
    ({"type": "function", "function": {"name": "get_time"}}, "qwen3_next",
     '<tool_call>\n{"name": "get_time", "arguments": '),
])
def test_forcing_opens_the_call_in_the_family_form(tok, choice, family, text):
    c = resolve_tool_choice(choice, [WEATHER, TIME], family, tok, prompt_in_reasoning=False)
    assert c.forced_text == text and tok.decode(list(c.forced)) == text and c.calls and not c.banned
    assert c.forced[0] == tok.token_to_id("<tool_call>")


@pytest.mark.parametrize("choice, tools, family, reasoning, code, field, words", [
    ({"type": "function", "function": {"name": "launch"}}, [WEATHER, TIME], "qwen3_5", False, "bad_request",
     "tool_choice.function.name", 'no tool named "launch" in tools (they are "get_weather", "get_time")'),
    ("required", None, "qwen3_5", False, "bad_request", "tool_choice", "a tool call is required but the request "
     "has no tools"),
    ("required", [WEATHER], "qwen3_5", True, "bad_request", "tool_choice", "cannot be combined with reasoning"),
    ("required", [WEATHER], "none", False, "model_unsupported", "tool_choice", "no tool-call form to force"),
])
def test_refusals_name_the_field(tok, choice, tools, family, reasoning, code, field, words):
    with pytest.raises(ProtocolError) as e:
        resolve_tool_choice(choice, tools, family, tok, prompt_in_reasoning=reasoning)
    assert (e.value.code, e.value.field) == (code, field) and words in str(e.value)


def test_openai_none_keeps_call_markup_as_text_and_bans_the_token(srv, tok):
    s, engine = srv
    engine.text = CALL
    c = openai_client(s.addr)
    r = c.chat.completions.create(model="m", messages=USER, tools=[WEATHER], tool_choice="none", extra_body=NO_THINK)
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and ch.message.tool_calls is None and ch.message.content == CALL
    sp = engine.submitted[-1].sampling
    assert sp.banned_token_ids == {tok.token_to_id("<tool_call>")} and sp.forced_token_ids == ()
    r = c.chat.completions.create(model="m", messages=USER, tools=[WEATHER], extra_body=NO_THINK)    # auto
    assert r.choices[0].finish_reason == "tool_calls" and engine.submitted[-1].sampling.banned_token_ids == set()


def test_openai_named_function_forces_its_opening(srv, tok):
    s, engine = srv
    engine.text = CALL                       # the scripted reply stands for forced + generated tokens
    c = openai_client(s.addr)
    r = c.chat.completions.create(model="m", messages=USER, tools=[WEATHER, TIME], extra_body=NO_THINK,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert tok.decode(list(engine.submitted[-1].sampling.forced_token_ids)) == "<tool_call>\n<function=get_weather>\n"
    with pytest.raises(openai.BadRequestError) as e:            # the default Qwen3.5 prompt opens <think>
        c.chat.completions.create(model="m", messages=USER, tools=[WEATHER], tool_choice="required")
    assert e.value.body["param"] == "tool_choice" and "reasoning" in e.value.body["message"]


def test_anthropic_tool_choice_maps_onto_the_same(srv, tok):
    s, engine = srv
    engine.text = CALL
    a = anthropic_client(s.addr)
    tools = [{"name": "get_weather", "description": "Weather of a city",
              "input_schema": WEATHER["function"]["parameters"]}]
    m = a.messages.create(model="m", max_tokens=64, messages=USER, tools=tools,
                          tool_choice={"type": "tool", "name": "get_weather"}, extra_body=NO_THINK)
    assert m.stop_reason == "tool_use" and [b.name for b in m.content if b.type == "tool_use"] == ["get_weather"]
    assert tok.decode(list(engine.submitted[-1].sampling.forced_token_ids)) == "<tool_call>\n<function=get_weather>\n"
    m = a.messages.create(model="m", max_tokens=64, messages=USER, tools=tools, tool_choice={"type": "none"},
                          extra_body=NO_THINK)
    assert m.stop_reason == "end_turn" and [b.type for b in m.content] == ["text"] and m.content[0].text == CALL
    with pytest.raises(anthropic.BadRequestError):
        a.messages.create(model="m", max_tokens=64, messages=USER, tools=tools, tool_choice={"type": "any"})


def _sample(runner, logits, sp, force=None, rid="r"):
    it = PlanItem(rid, 0, (1,), (0,), None, "decode", "last", True, sp, force=force)
    return runner._item_result(it, logits.view(1, -1))


def test_runner_takes_forced_tokens_and_never_samples_banned_ones():
    runner = Runner(None, SimpleNamespace(page_tokens=64))
    logits = torch.tensor([0.0, 9.0, 8.0, 1.0])               # token 1 leads, then 2
    greedy = SamplingParams(max_tokens=4, temperature=0.0, banned_token_ids=frozenset({1}), logprobs=True)
    assert _sample(runner, logits, greedy).token_id == 2
    forced = _sample(runner, logits, greedy, force=3)
    assert forced.token_id == 3
    assert forced.logprob == pytest.approx(float(torch.log_softmax(logits, -1)[3]))     # from the raw logits
    hot = SamplingParams(max_tokens=4, temperature=1.0, seed=7, banned_token_ids=frozenset({1, 2}))
    draws = {_sample(runner, logits, hot, rid="h").token_id for _ in range(300)}
    assert draws == {0, 3}                                      # p 0.27 and 0.73 once 1 and 2 are banned


@pytest.mark.parametrize("bad, shown", [("bogus", '"bogus"'), (5, "5"), (["auto"], '["auto"]')])
def test_socket_parser_names_every_allowed_tool_choice(bad, shown):
    # a wrong string used to be answered "must be an object, got a string", as if the words were not allowed
    from ignis_client.protocol import parse_request
    with pytest.raises(ProtocolError) as e:
        parse_request({"id": "r", "op": "chat", "messages": [{"role": "user", "content": "hi"}], "tool_choice": bad})
    assert (e.value.code, e.value.field) == ("bad_request", "tool_choice")
    assert e.value.message == ('tool_choice: must be "none", "auto", "required" or {"type": "function", "function": '
                               '{"name": ...}}, got ' + shown)
