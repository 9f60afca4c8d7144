"""The mapping of Anthropic Messages and Responses bodies onto the socket's chat body (ignisd.fronts.anthropic_request,
ignisd.fronts.responses_request): exact chat messages, the billing-header strip, refusals naming the client's field,
and the template-faithfulness refusals of the edge."""
from __future__ import annotations

import pytest
from ignis_client import protocol as P
from text_corpus import ignis_smollm_tokenizer

from ignisd.fronts import anthropic_request as A
from ignisd.fronts import responses_request as R
from ignisd.fronts.bodies import chat_body
from ignisd.fronts.sse import parse_op
from ignisd.prompt import Prompts
from ignisd.text.chat_template import ChatTemplate, MessageError, prepare_messages

BILLING = "x-anthropic-billing-header: cc_version=2.1.3; cc_entrypoint=cli; cch=4f2a1;"


def _code(fn, *args):
    with pytest.raises(P.ProtocolError) as e:
        fn(*args)
    return e.value.code, e.value.field


# ---------------------------------------------------------------- Anthropic Messages

def test_billing_block_is_dropped_unless_stripping_is_off():
    body = {"system": [{"type": "text", "text": BILLING}, {"type": "text", "text": "You are Claude Code."}],
            "messages": [{"role": "user", "content": "hi"}]}
    on, _ = A.to_chat(body, strip_billing=True)
    off, _ = A.to_chat(body, strip_billing=False)
    assert on["messages"][0] == {"role": "system", "content": [{"type": "text", "text": "You are Claude Code."}]}
    assert off["messages"][0]["content"] == [{"type": "text", "text": BILLING},
                                             {"type": "text", "text": "You are Claude Code."}]
    s, _ = A.to_chat({"system": BILLING + "\nBe brief.", "messages": body["messages"]}, True)
    assert s["messages"][0]["content"] == [{"type": "text", "text": "Be brief."}]


def test_system_messages_inside_messages():
    body = {"system": "Top.", "messages": [
        {"role": "system", "content": [{"type": "text", "text": BILLING}, {"type": "text", "text": "Lead."}]},
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "system", "content": "Reminder."}, {"role": "user", "content": "go on"}]}
    chat, paths = A.to_chat(body, True)
    assert chat["messages"] == [
        {"role": "system", "content": [{"type": "text", "text": "Top."}, {"type": "text", "text": "Lead."}]},
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "Reminder."}]}, {"role": "user", "content": "go on"}]
    assert paths == ["system", "messages[1]", "messages[2]", "messages[3]", "messages[4]"]


def test_tool_use_and_tool_result_blocks():
    body = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Look it up.", "signature": "s"},
                                          {"type": "redacted_thinking", "data": "x"},
                                          {"type": "tool_use", "id": "t1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "18C"},
                                     {"type": "tool_result", "tool_use_id": "t2",
                                      "content": [{"type": "text", "text": "dry"}]},
                                     {"type": "text", "text": "Thanks"}]}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "any"}, "stop_sequences": ["END"], "max_tokens": 9, "thinking": {"type": "disabled"}}
    chat, paths = A.to_chat(body, True)
    assert chat["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": None, "reasoning_content": "Look it up.",
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "18C"},
        {"role": "tool", "tool_call_id": "t2", "content": [{"type": "text", "text": "dry"}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}]
    assert paths == ["messages[0]", "messages[1]", "messages[2]", "messages[2]", "messages[2]"]
    assert chat["tools"] == [{"type": "function", "function": {"name": "get_weather",
                                                               "parameters": {"type": "object"}}}]
    assert (chat["tool_choice"], chat["stop"], chat["max_tokens"]) == ("required", ["END"], 9)
    assert chat["chat_template_kwargs"] == {"enable_thinking": False}
    op = parse_op(chat, "chat", "x")   # the socket's parser takes the mapped body as it is
    assert op.sampling.stop == ["END"] and op.tool_choice == "required"


def test_messages_refusals_name_the_anthropic_field():
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    assert _code(A.to_chat, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, img]}]},
                 True) == ("model_unsupported", "messages[0].content[1]")
    assert _code(A.to_chat, {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
                 True) == ("model_unsupported", "messages[1]")
    assert _code(A.to_chat, {"messages": []}, True) == ("bad_request", "messages")
    assert _code(A.to_chat, {"messages": [{"role": "bot", "content": "a"}]}, True) == ("bad_request",
                                                                                      "messages[0].role")
    e = P.ProtocolError("model_unsupported", "x", "messages[2].tool_calls")
    assert A.remap(e, ["system", "messages[0]", "messages[1]", "messages[2]"]).field == "messages[1].tool_calls"


def _message(fn, *args):
    with pytest.raises((P.ProtocolError, MessageError)) as e:
        fn(*args)
    return str(e.value)


def test_front_refusals_show_the_clients_value_as_json():
    """The role or block type the client sent, spelled by hand as JSON writes it (was Python's repr: 'bot', None)."""
    assert _message(A.to_chat, {"messages": [{"role": "bot", "content": "a"}]}, True) == \
        'messages[0].role: must be user or assistant (or system), got "bot"'
    assert _message(A.to_chat, {"messages": "hello"}, True) == \
        'messages: must be a non-empty list of messages, got "hello"'          # was "required": it was there
    assert _message(A.to_chat, {"messages": []}, True) == "messages: must be a non-empty list of messages, got []"
    assert _message(A.to_chat, {}, True) == "messages: required (a non-empty list of messages)"
    assert _message(A.to_chat, {"messages": [{"content": "a"}]}, True) == \
        "messages[0].role: must be user or assistant (or system), got null"
    assert _message(A.to_chat, {"messages": [{"role": "user", "content": [{"type": "audio"}]}]}, True) == \
        'messages[0].content[0].type: unsupported block type "audio" in a user message (text, tool_result)'
    assert _message(A.to_chat, {"messages": [{"role": "user", "content": "a"},
                                             {"role": "assistant", "content": [{"type": 7}]},
                                             {"role": "user", "content": "b"}]}, True) == \
        ("messages[1].content[0].type: unsupported block type 7 in an assistant message (text, thinking, "
         "redacted_thinking, tool_use)")
    assert _message(R.to_chat, {"input": [{"type": "message", "role": "bot", "content": "a"}]}) == \
        'input[0].role: must be user, assistant, system or developer, got "bot"'
    assert _message(R.to_chat, {"input": 5}) == "input: must be a string or a list of input items, got 5"
    assert _message(R.to_chat, {"input": {"a": True}}) == \
        'input: must be a string or a list of input items, got {"a":true}'
    assert _message(chat_body, "gemini", {}) == 'api: must be one of openai, anthropic, responses; got "gemini"'
    assert _message(prepare_messages, [{"role": "bot", "content": "a"}], "keep") == \
        'messages[0].role: unknown role "bot" (allowed: system, user, assistant, tool, developer)'
    assert _message(prepare_messages, [{"role": "user", "content": [{"type": "audio"}]}], "keep") == \
        'messages[0].content[0].type: unsupported content part type "audio" (allowed: text, image_url)'


# ---------------------------------------------------------------- Responses

def test_codex_shaped_input_items():
    body = {"instructions": "You are Codex.", "reasoning": {"effort": "minimal"}, "max_output_tokens": 32,
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox."}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List files"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Use ls."}],
                 "encrypted_content": None},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
                {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\": [\"ls\"]}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                {"type": "local_shell_call", "call_id": "c2", "action": {}},
                {"role": "user", "content": "and now?"}],
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
                      {"type": "local_shell"}, {"type": "web_search"}, {"type": "custom", "name": "apply_patch"}]}
    chat, paths = R.to_chat(body)
    assert chat["messages"] == [
        {"role": "system", "content": "You are Codex."},
        {"role": "developer", "content": [{"type": "text", "text": "Sandbox."}]},
        {"role": "user", "content": [{"type": "text", "text": "List files"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Sure."}], "reasoning_content": "Use ls.",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shell", "arguments": {"cmd": ["ls"]}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
        {"role": "user", "content": "and now?"}]
    assert paths == ["instructions", "input[0]", "input[1]", "input[3]", "input[5]", "input[7]"]
    assert chat["tools"] == [{"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}]
    assert chat["max_tokens"] == 32 and chat["chat_template_kwargs"] == {"enable_thinking": False}
    parse_op(chat, "chat", "x")


def test_responses_probe_and_refusals():
    assert R.to_chat({"input": [], "max_output_tokens": 1})[0]["messages"] == [{"role": "user", "content": ""}]
    assert R.to_chat({"instructions": "S", "input": ""})[0]["messages"] == [{"role": "system", "content": "S"},
                                                                           {"role": "user", "content": ""}]
    assert _code(R.to_chat, {}) == ("bad_request", "input")               # no input at all is not a probe
    assert _code(R.to_chat, {"instructions": "S"}) == ("bad_request", "input")
    code, field = _code(R.to_chat, {"input": "hi", "previous_response_id": "resp_1"})
    assert (code, field) == ("bad_request", "previous_response_id")
    img = {"type": "input_image", "image_url": "data:image/png;base64,AA=="}
    assert _code(R.to_chat, {"input": [{"role": "user", "content": [img]}]}) == ("model_unsupported",
                                                                                  "input[0].content[0]")
    chat, paths = R.to_chat({"input": "hi", "max_output_tokens": 0})
    with pytest.raises(P.ProtocolError) as e:
        parse_op(chat, "chat", "x")
    assert R.remap(e.value, paths).field == "max_output_tokens"


def test_structured_output_refusal_names_each_fronts_field():
    """json_schema is refused as the chat's response_format.type; each front names the field its client used, at
    the start of the message as every other refusal does (the message used to open with the type, naming no field;
    the Anthropic front called output_config.format output_format)."""
    chat, paths = R.to_chat({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}})
    with pytest.raises(P.ProtocolError) as e:
        parse_op(chat, "chat", "x")
    e = R.remap(e.value, paths)
    assert (e.code, e.field) == ("model_unsupported", "text.format.type")
    assert e.message.startswith("text.format.type: json_schema (structured output) is not supported"), e.message
    user = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    for body, name in (({"output_format": {"type": "json_schema", "schema": {}}}, "output_format"),
                       ({"output_config": {"format": {"type": "json_schema", "schema": {}}}}, "output_config.format")):
        with pytest.raises(P.ProtocolError) as e:
            A.check_output_format({**user, **body})
        assert (e.value.code, e.value.field) == ("model_unsupported", f"{name}.type")
        assert e.value.message.startswith(f"{name}.type: json_schema (structured output) is not supported")
    with pytest.raises(P.ProtocolError) as e:
        A.check_output_format({**user, "output_config": {"format": {"type": "yaml"}}})
    assert (e.value.code, e.value.field) == ("bad_request", "output_config.format.type")
    A.check_output_format({**user, "output_format": {"type": "text"}, "output_config": {"effort": "low"}})


# ---------------------------------------------------------------- template faithfulness (every front, the socket)

@pytest.fixture(scope="module")
def smollm_prompts():
    tok = ignis_smollm_tokenizer()
    return Prompts(tok, ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token), "into-system")


def test_a_template_that_drops_tool_calls_refuses_them(smollm_prompts):
    msgs = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "x"}]
    op = parse_op({"messages": msgs}, "chat", "x")
    with pytest.raises(P.ProtocolError) as e:
        smollm_prompts.chat(op)
    assert (e.value.code, e.value.field) == ("model_unsupported", "messages[1].tool_calls")


CALLS_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
                  "{% for tc in message.tool_calls or [] %}<call>{{ tc.function.name }}</call>{% endfor %}"
                  "{{ '<|im_end|>\\n' }}{% endfor %}"
                  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_null_content_renders_as_empty():
    """A template that renders tool_calls but concatenates message['content'] as a string: an assistant
    `content: null` beside tool_calls (which OpenAI servers take) renders as "" instead of failing in the template."""
    tok = ignis_smollm_tokenizer()
    prompts = Prompts(tok, ChatTemplate(CALLS_TEMPLATE, tok.bos_token, tok.eos_token), "into-system")
    call = [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]

    def body(content):
        return parse_op({"messages": [{"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": content, "tool_calls": call},
                                      {"role": "tool", "tool_call_id": "a", "content": "x"}]}, "chat", "x")
    text = prompts.chat(body(None)).text
    assert text == prompts.chat(body("")).text
    assert text == ("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<call>f</call><|im_end|>\n"
                    "<|im_start|>tool\nx<|im_end|>\n<|im_start|>assistant\n")
