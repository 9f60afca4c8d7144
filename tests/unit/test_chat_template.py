"""ChatTemplate renders byte-identically to transformers' apply_chat_template; prepare_messages turns request
messages into template input (hand-written expected outputs)."""
from __future__ import annotations

import datetime
import json

import pytest

from ignisd.text.chat_template import ChatTemplate, ChatTemplateError, MessageError, prepare_messages
from text_corpus import QWEN35_DIR, hf_smollm_tokenizer, ignis_smollm_tokenizer

QWEN_SOURCE = (QWEN35_DIR / "chat_template.jinja").read_text()
QWEN_EXAMPLES = json.loads((QWEN35_DIR / "rendered_examples.json").read_text())

TOOLS = [{"type": "function", "function": {
    "name": "météo", "description": "Météo à <Paris> & 東京 \"now\"",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

SMOLLM_CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "Привет! 日本語で 😀\n  indented"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "reasoning_content": "r"},
     {"role": "tool", "content": "{\"temp\": 14}"}, {"role": "developer", "content": "be brief"}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "<|im_end|> inside content"}],
]


@pytest.fixture(scope="module")
def hf():
    return hf_smollm_tokenizer()


@pytest.fixture(scope="module")
def smollm():
    tok = ignis_smollm_tokenizer()
    return ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token)


def test_smollm_hand_written(smollm):
    assert smollm.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert smollm.render([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}],
                         add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")


@pytest.mark.parametrize("conv", range(len(SMOLLM_CONVERSATIONS)))
@pytest.mark.parametrize("gen", [True, False])
def test_smollm_equals_transformers(smollm, hf, conv, gen):
    messages = SMOLLM_CONVERSATIONS[conv]
    expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    assert smollm.render(messages, add_generation_prompt=gen) == expected


def test_qwen35_rendered_examples():
    template = ChatTemplate(QWEN_SOURCE, None, "<|im_end|>")
    assert len(QWEN_EXAMPLES) >= 5
    for ex in QWEN_EXAMPLES:
        kwargs = dict(ex["kwargs"])
        gen = kwargs.pop("add_generation_prompt", False)
        got = template.render(ex["messages"], tools=ex["tools"], add_generation_prompt=gen, **kwargs)
        assert got == ex["rendered"], ex["name"]


def test_qwen35_equals_transformers(hf):
    template = ChatTemplate(QWEN_SOURCE, hf.bos_token, hf.eos_token)
    cases = [(ex["messages"], ex["tools"], ex["kwargs"]) for ex in QWEN_EXAMPLES]
    cases += [
        # non-ASCII and HTML characters through tojson (transformers: ensure_ascii=False, no HTML escaping)
        ([{"role": "user", "content": [{"type": "text", "text": "Météo "}, {"type": "text", "text": "東京?"}]}],
         TOOLS, {"add_generation_prompt": True}),
        ([{"role": "user", "content": "q"},
          {"role": "assistant", "content": None, "reasoning": "via alias", "tool_calls": [
              {"type": "function", "function": {"name": "météo", "arguments": {"city": "東京", "n": [1, 2]}}}]},
          {"role": "tool", "content": "ok"}], TOOLS, {"add_generation_prompt": False, "enable_thinking": False}),
    ]
    for messages, tools, kwargs in cases:
        kwargs = dict(kwargs)
        gen = kwargs.pop("add_generation_prompt", False)
        expected = hf.apply_chat_template(messages, tools=tools, chat_template=QWEN_SOURCE, tokenize=False,
                                          add_generation_prompt=gen, **kwargs)
        assert template.render(messages, tools=tools, add_generation_prompt=gen, **kwargs) == expected


def test_uses(smollm):
    assert smollm.uses("messages") and smollm.uses("add_generation_prompt")
    assert not smollm.uses("tools") and not smollm.uses("enable_thinking")
    qwen = ChatTemplate(QWEN_SOURCE, None, None)
    assert qwen.uses("tools") and qwen.uses("enable_thinking") and qwen.uses("add_vision_id")
    assert not qwen.uses("documents") and not qwen.uses("image_count")  # image_count is set by the template


def test_template_errors():
    qwen = ChatTemplate(QWEN_SOURCE, None, None)
    with pytest.raises(ChatTemplateError, match=r"^No user query found in messages\.$"):
        qwen.render([{"role": "system", "content": "s"}])
    with pytest.raises(ChatTemplateError, match="Unexpected message role"):
        qwen.render([{"role": "user", "content": "u"}, {"role": "developer", "content": "d"}])
    with pytest.raises(ChatTemplateError):  # the sandbox refuses attribute access to internals
        ChatTemplate("{{ ''.__class__.__mro__ }}", None, None).render([])


def test_environment_features():
    t = ChatTemplate("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.content }}"
                     "{% endfor %}|{{ strftime_now('%Y') }}|{{ bos_token }}{{ eos_token }}|{{ x | tojson }}"
                     "|{% generation %}g{% endgeneration %}", "<s>", "</s>")
    msgs = [{"role": "user", "content": c} for c in "abcd"]
    year = datetime.datetime.now().year
    assert t.render(msgs, x={"k": "é<&>"}) == f'ab|{year}|<s></s>|{{"k": "é<&>"}}|g'
    # trim_blocks + lstrip_blocks: the newline after a block tag and the indentation before it go
    t = ChatTemplate("{% if true %}\n    A\n    {% endif %}\nB", None, None)
    assert t.render([]) == "    A\nB"


# ------------------------------------------------------------------------ prepare_messages

DEV_CONV = [
    {"role": "system", "content": "Sys."},
    {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
    {"role": "developer", "content": "Dev one."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1, \"b\": [true]}"}}]},
    {"role": "tool", "content": "res", "tool_call_id": "c1"},
    {"role": "developer", "content": [{"type": "text", "text": "Dev two."}]},
]
CALLS = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [True]}}}]


def test_prepare_keep():
    assert prepare_messages(DEV_CONV, "keep") == [
        {"role": "system", "content": "Sys."},
        {"role": "user", "content": "Hello there"},
        {"role": "developer", "content": "Dev one."},
        {"role": "assistant", "content": None, "tool_calls": CALLS},
        {"role": "tool", "content": "res", "tool_call_id": "c1"},
        {"role": "developer", "content": "Dev two."},
    ]
    assert DEV_CONV[3]["tool_calls"][0]["function"]["arguments"] == "{\"a\": 1, \"b\": [true]}"  # input untouched


def test_prepare_into_system():
    assert prepare_messages(DEV_CONV, "into-system") == [
        {"role": "system", "content": "Sys.\n\nDev one.\n\nDev two."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": None, "tool_calls": CALLS},
        {"role": "tool", "content": "res", "tool_call_id": "c1"},
    ]
    assert prepare_messages([{"role": "user", "content": "u"}, {"role": "developer", "content": "d"}],
                            "into-system") == [{"role": "system", "content": "d"}, {"role": "user", "content": "u"}]


def test_prepare_after_system():
    assert prepare_messages(DEV_CONV, "after-system") == [
        {"role": "system", "content": "Sys."},
        {"role": "system", "content": "Dev one."},
        {"role": "system", "content": "Dev two."},
        {"role": "user", "content": "Hello there"},
        {"role": "assistant", "content": None, "tool_calls": CALLS},
        {"role": "tool", "content": "res", "tool_call_id": "c1"},
    ]
    assert prepare_messages([{"role": "user", "content": "u"}, {"role": "developer", "content": "d"}],
                            "after-system") == [{"role": "system", "content": "d"}, {"role": "user", "content": "u"}]


@pytest.mark.parametrize("messages, field", [
    ([{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
     "messages[1].content[0].image_url.url"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": "data:image/png;base64,AA=="}]}],
     "messages[0].content[0].image_url"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}],
     "messages[0].content[0].image_url.url"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "max"}}]}],
     "messages[0].content[0].image_url.detail"),
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], "messages[0].content[0].type"),
    ([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": 3}]}],
     "messages[0].content[1].text"),
    ([{"role": "user", "content": ["text"]}], "messages[0].content[0]"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    (["not a dict"], "messages[0]"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1"}}]}],
     "messages[1].tool_calls[0].function.arguments"),
    ([{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": "[1]"}}]}],
     "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "assistant", "content": "", "tool_calls": {"x": 1}}], "messages[0].tool_calls"),
])
def test_prepare_errors_name_the_field(messages, field):
    with pytest.raises(ValueError) as info:
        prepare_messages(messages, "keep")
    assert isinstance(info.value, MessageError) and info.value.field == field
    assert str(info.value).startswith(field + ": ")


def test_image_part_is_model_unsupported_on_a_text_model():
    """A well-formed OpenAI image part is refused with model_unsupported (no model served here has a vision tower:
    the loader skips the visual weights), naming the part; it is never dropped silently."""
    msgs = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=",  # noqa: E501
                                                                             "detail": "low"}}]}]
    with pytest.raises(MessageError) as info:
        prepare_messages(msgs, "keep")
    assert info.value.code == "model_unsupported" and info.value.field == "messages[0].content[1]"
    assert "vision" in info.value.message


def test_prepare_unknown_policy():
    with pytest.raises(ValueError, match=r"^developer_message_policy: "):
        prepare_messages([{"role": "user", "content": "x"}], "sideways")


def test_prepared_renders_with_smollm(smollm):
    rendered = smollm.render(prepare_messages(DEV_CONV[:3], "into-system"))
    assert rendered == ("<|im_start|>system\nSys.\n\nDev one.<|im_end|>\n<|im_start|>user\nHello there<|im_end|>\n"
                        "<|im_start|>assistant\n")


def _ten_turn_agent_conversation() -> list[dict]:
    """A 10-turn tool-calling conversation with reasoning: user asks, the assistant reasons and calls tools
    (arguments as JSON strings, as OpenAI clients send them, and as objects), tools answer, the user follows up."""
    tools_args = [
        ("read_file", {"path": "src/main.py"}), ("run_tests", {"target": "tests/unit", "verbose": True}),
        ("grep", {"pattern": "def main", "paths": ["src", "tests"]}), ("write_file", {"path": "a.py", "text": "x = 1\n"}),  # noqa: E501
    ]
    msgs = [{"role": "system", "content": "You are a careful coding agent. Today is 2026-11-29."},
            {"role": "user", "content": "The tests fail on main. Find out why and fix it."}]
    for turn, (name, args) in enumerate(tools_args):
        arguments = json.dumps(args) if turn % 2 == 0 else args
        msgs.append({"role": "assistant", "content": f"Step {turn}: calling {name}.",
                     "reasoning_content": f"I should use {name} now (turn {turn}).",
                     "tool_calls": [{"id": f"call_{turn}", "type": "function",
                                     "function": {"name": name, "arguments": arguments}}]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": f"result {turn}: ok"})
        if turn == 1:
            msgs.append({"role": "user", "content": "Also check the linter, please."})
    msgs.append({"role": "assistant", "content": "Fixed: the import was wrong.",
                 "reasoning_content": "All four steps succeeded."})
    msgs.append({"role": "user", "content": "Thanks! Summarise the change in one line."})
    return msgs


AGENT_TOOLS = [{"type": "function", "function": {"name": n, "description": f"{n} tool", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": []}}}
    for n in ("read_file", "run_tests", "grep", "write_file")]


@pytest.mark.parametrize("enable_thinking", [True, False])
@pytest.mark.parametrize("gen", [True, False])
def test_qwen35_ten_turn_agent_conversation_equals_transformers(hf, enable_thinking, gen):
    messages = prepare_messages(_ten_turn_agent_conversation(), "into-system")
    assert sum(1 for m in messages if m["role"] == "assistant") >= 5 and len(messages) >= 10
    template = ChatTemplate(QWEN_SOURCE, hf.bos_token, hf.eos_token)
    got = template.render(messages, tools=AGENT_TOOLS, add_generation_prompt=gen, enable_thinking=enable_thinking)
    expected = hf.apply_chat_template(messages, tools=AGENT_TOOLS, chat_template=QWEN_SOURCE, tokenize=False,
                                      add_generation_prompt=gen, enable_thinking=enable_thinking)
    assert got == expected
    assert "<function=run_tests>" in got and "<parameter=verbose>\nTrue\n</parameter>" in got
