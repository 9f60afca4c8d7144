"""Cut points and message spans (ignisd/text/segments.py, ignisd/text/spans.py, DESIGN §4.3): hand-computed cases on
synthetic tokenizations, then the real Qwen3.5 template + tokenizer and SmolLM2's template."""
from __future__ import annotations

import json
import shutil

import pytest

from ignisd.text.chat_template import ChatTemplate, prepare_messages
from ignisd.text.segments import cut_points, token_at
from ignisd.text.spans import MessageSpan, Spans, message_at_char, message_spans
from ignisd.text.tokenizer import Tokenizer
from text_corpus import QWEN35_DIR

# SmolLM2-135M-Instruct's chat template (the GGUF's tokenizer.chat_template, verbatim; loading the GGUF tokenizer
# takes seconds, test_chat_template.py proves the renderer on it against transformers).
SMOLLM_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>'"
    " + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
SMOLLM_DEFAULT_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                         "<|im_end|>\n")

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the workspace",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}},
                   "required": ["path"]}}}]


@pytest.fixture(scope="module")
def qwen_tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen35_tok")
    shutil.copy(QWEN35_DIR / "tokenizer.json", d)
    shutil.copy(QWEN35_DIR / "chat_template.jinja", d)
    return Tokenizer.from_dir(d)


@pytest.fixture(scope="module")
def qwen(qwen_tok):
    return ChatTemplate(qwen_tok.chat_template, qwen_tok.bos_token, "<|im_end|>")


@pytest.fixture(scope="module")
def smollm():
    return ChatTemplate(SMOLLM_TEMPLATE, None, "<|im_end|>")


def prompt(template, tok, messages, tools=None, **kw):
    """Render + tokenize + spans + cut points, as the server does."""
    msgs = prepare_messages(messages, "into-system")
    text = template.render(msgs, tools=tools, add_generation_prompt=True, **kw)
    ids, offsets = tok.encode_with_offsets(text)
    spans = message_spans(template, msgs, text, tools=tools, **kw)
    return text, ids, offsets, spans, cut_points(text, ids, offsets, spans)


# ---------------------------------------------------------------- synthetic: one character per token

def synth(bounds, n_chars, roles, gen=None):
    """A text of n_chars one-character tokens, with message bounds at the given characters."""
    text = "x" * n_chars
    ids = list(range(n_chars))
    offsets = [(i, i + 1) for i in range(n_chars)]
    spans = tuple(MessageSpan(i, r, bounds[i], bounds[i + 1]) for i, r in enumerate(roles))
    return text, ids, offsets, Spans(tuple(bounds), ("probe",) * len(bounds), spans, (), gen, tuple(roles))


@pytest.mark.parametrize("block, publish", [(1, 0), (63, 0), (64, 64), (65, 64), (127, 64), (128, 128),
                                            (129, 128), (130, 128), (191, 128), (192, 192)])
def test_publish_rounds_the_system_block_down_to_a_page(block, publish):
    text, ids, offsets, spans = synth([0, block, block + 40], block + 45, ["system", "user"], gen=block + 40)
    cp = cut_points(text, ids, offsets, spans)
    assert cp.publish == publish
    assert cp.publish_char == block
    assert cp.opener == block + 40 and cp.opener_char == block + 40
    assert cp.publish_why == (None if publish else "below_page")
    assert cp.reason == (None if publish else "below_page")
    assert cp.wire() == {"publish": publish, "opener": block + 40}


def test_publish_without_system_message_is_the_preamble_end():
    # first message is a user message: the block is the template's preamble (tools, default system), [0, bounds[0])
    text, ids, offsets, spans = synth([70, 90], 100, ["user"], gen=90)
    assert cut_points(text, ids, offsets, spans).publish == 64
    text, ids, offsets, spans = synth([0, 90], 100, ["user"], gen=90)
    cp = cut_points(text, ids, offsets, spans)
    assert (cp.publish, cp.publish_why, cp.opener) == (0, "below_page", 90)


def test_page_size_is_a_parameter():
    text, ids, offsets, spans = synth([0, 50, 60], 70, ["system", "user"], gen=60)
    assert cut_points(text, ids, offsets, spans, page_tokens=16).publish == 48


def test_token_at_maps_a_cut_to_the_token_starting_there():
    # "ab" | "é" split in two byte tokens sharing the character's span | "cd"
    offsets = [(0, 2), (2, 3), (2, 3), (3, 5)]
    assert token_at(offsets, 0) == 0
    assert token_at(offsets, 2) == 1          # the first of the two tokens of "é"
    assert token_at(offsets, 3) == 3
    assert token_at(offsets, 1) is None       # inside "ab"
    assert token_at(offsets, 4) is None
    assert token_at(offsets, 5) == 4          # the end of the text
    assert token_at([], 0) == 0


def test_unaligned_cuts_are_skipped_and_reported():
    # tokens of two characters: a bound at an odd character has no token starting there
    text = "x" * 200
    offsets = [(i, i + 2) for i in range(0, 200, 2)]
    ids = list(range(100))
    spans = Spans((0, 131, 181), ("probe",) * 3, (MessageSpan(0, "system", 0, 131), MessageSpan(1, "user", 131, 181)),
                  (), 181, ("system", "user"))
    cp = cut_points(text, ids, offsets, spans)
    assert (cp.publish, cp.publish_why, cp.opener, cp.opener_why) == (0, "cut_unaligned", None, "cut_unaligned")
    assert cp.reason == "cut_unaligned"
    spans = Spans((0, 130, 181), spans.how, spans.spans, (), 180, ("system", "user"))
    cp = cut_points(text, ids, offsets, spans)
    assert (cp.publish, cp.opener, cp.reason) == (64, 90, None)


def test_missing_bounds_and_no_messages():
    text, ids, offsets, _ = synth([0, 100, 140], 150, ["system", "user"])
    spans = Spans((0, None, 140), ("probe", None, "prefix"), (None, None), (0, 1), None, ("system", "user"))
    cp = cut_points(text, ids, offsets, spans)
    assert (cp.publish, cp.publish_why, cp.reason) == (0, "no_span", "cut_unaligned")
    assert (cp.opener, cp.opener_why) == (None, "no_opener")   # text rendered without a generation prompt
    empty = Spans((None,), (None,), (), (), None, ())
    cp = cut_points(text, ids, offsets, empty)
    assert (cp.publish, cp.publish_why, cp.opener) == (0, "no_block", None)


def test_cuts_move_back_out_of_images():
    text, ids, offsets, spans = synth([0, 140, 300], 310, ["system", "user"], gen=300)
    # an image over [120, 150): the publish cut at 140 moves to 120, then rounds down to 64
    assert cut_points(text, ids, offsets, spans, image_spans=[(120, 150, "aa")]).publish == 64
    # an image over [60, 135) holds the rounded point 128: back to 60, rounded down to 0
    cp = cut_points(text, ids, offsets, spans, image_spans=[(60, 135, "aa")])
    assert (cp.publish, cp.publish_why) == (0, "below_page")
    # an image starting exactly at the page boundary does not hold it
    assert cut_points(text, ids, offsets, spans, image_spans=[(128, 135, "aa")]).publish == 128
    # the opener inside an image moves to its start
    assert cut_points(text, ids, offsets, spans, image_spans=[(290, 305, "bb")]).opener == 290


def test_cut_points_checks_its_inputs():
    with pytest.raises(ValueError):
        cut_points("abc", [1, 2], [(0, 1)], Spans((None,), (None,), (), (), None, ()))


# ---------------------------------------------------------------- real templates: Qwen3.5

def check_cover(text, spans):
    """Spans are contiguous from bounds[0] and the generation prompt follows the last one."""
    assert not spans.unresolved
    b = spans.bounds
    for i, s in enumerate(spans.spans):
        assert (s.start, s.end) == (b[i], b[i + 1])
    assert spans.generation_start == b[-1]


def test_qwen_rendered_examples_spans(qwen):
    for ex in json.loads((QWEN35_DIR / "rendered_examples.json").read_text()):
        kw = dict(ex["kwargs"])
        gen = kw.pop("add_generation_prompt")
        text = qwen.render(ex["messages"], tools=ex["tools"], add_generation_prompt=gen, **kw)
        assert text == ex["rendered"]
        spans = message_spans(qwen, ex["messages"], text, tools=ex["tools"], add_generation_prompt=gen, **kw)
        check_cover(text, spans)
        assert text[spans.generation_start:].startswith("<|im_start|>assistant\n")
        for m, s in zip(ex["messages"], spans.spans):
            piece = text[s.start:s.end]
            if m["role"] != "system" and isinstance(m.get("content"), str) and m["content"]:
                assert m["content"].split("</think>")[-1].strip() in piece, (ex["name"], m)
            if m["role"] == "tool" and ex["messages"][s.index - 1]["role"] == "tool":
                assert piece.startswith("\n<tool_response>")     # grouped tool results share one block
            else:
                assert piece.startswith("<|im_start|>")
        if ex["messages"][0]["role"] == "system":
            assert spans.bounds[0] == 0          # tools render inside the system message's span
            assert text[:spans.bounds[1]].endswith(ex["messages"][0]["content"] + "<|im_end|>\n")
        wire = spans.wire()
        assert [w["role"] for w in wire] == [m["role"] for m in ex["messages"]]
        assert all(w["start"] is not None for w in wire)


def test_qwen_system_tools_block_publish(qwen, qwen_tok):
    system = "You are a careful coding agent. " * 12
    text, ids, offsets, spans, cp = prompt(qwen, qwen_tok, [{"role": "system", "content": system},
                                                            {"role": "user", "content": "list the files"}], TOOLS)
    user_at = spans.bounds[1]
    assert text[user_at:].startswith("<|im_start|>user\n")
    cut = token_at(offsets, user_at)
    assert ids[cut] == qwen_tok.token_to_id("<|im_start|>")
    assert cp.publish == cut - cut % 64 and cp.publish >= 64 and cp.publish_why is None
    assert ids[cp.opener] == qwen_tok.token_to_id("<|im_start|>")
    assert text[offsets[cp.opener][0]:] == "<|im_start|>assistant\n<think>\n"
    assert len(ids) - cp.opener == qwen_tok.encode("<|im_start|>assistant\n<think>\n").__len__()


def test_qwen_tools_without_system_message(qwen, qwen_tok):
    text, ids, offsets, spans, cp = prompt(qwen, qwen_tok, [{"role": "user", "content": "hi"}], TOOLS * 3)
    assert text[:spans.bounds[0]].startswith("<|im_start|>system\n# Tools")
    assert text[spans.bounds[0]:].startswith("<|im_start|>user\nhi")
    cut = token_at(offsets, spans.bounds[0])
    assert cp.publish == cut - cut % 64 > 0


def test_qwen_burst_shares_the_published_prefix(qwen, qwen_tok):
    system = "Follow the repository's conventions. " * 20
    runs = [prompt(qwen, qwen_tok, [{"role": "system", "content": system}, {"role": "user", "content": task}], TOOLS)
            for task in ("fix the bug in parser.py", "write tests", "x" * 700, "?")]
    publishes = {r[4].publish for r in runs}
    assert len(publishes) == 1
    p = publishes.pop()
    assert p > 0 and p % 64 == 0
    assert len({tuple(r[1][:p]) for r in runs}) == 1


def find_system(qwen, qwen_tok, target):
    """A system message whose block ends (the user block starts) at token `target`, built of one-token words."""
    for reps in range(0, 200):
        msgs = [{"role": "system", "content": "Be brief" + " hello" * reps}, {"role": "user", "content": "go"}]
        text, ids, offsets, spans, cp = prompt(qwen, qwen_tok, msgs)
        cut = token_at(offsets, spans.bounds[1])
        if cut == target:
            return cp
        assert cut < target
    raise AssertionError(target)


@pytest.mark.parametrize("target, publish", [(63, 0), (64, 64), (65, 64), (127, 64), (128, 128), (129, 128)])
def test_qwen_blocks_around_page_multiples(qwen, qwen_tok, target, publish):
    cp = find_system(qwen, qwen_tok, target)
    assert cp.publish == publish
    assert cp.reason == (None if publish else "below_page")


def test_qwen_turn_two_shares_turn_one_opener(qwen, qwen_tok):
    """The opener is the last point a later turn provably shares: reasoning dropped, tool arguments re-serialised."""
    sys_user = [{"role": "system", "content": "You are terse. " * 10}, {"role": "user", "content": "Read main.py"}]
    t1 = prompt(qwen, qwen_tok, sys_user, TOOLS)
    o1 = t1[4].opener
    call = {"role": "assistant", "content": "", "reasoning_content": "I should read it",
            "tool_calls": [{"type": "function", "function": {"name": "read_file",
                                                             "arguments": '{"path":"main.py","lines":20}'}}]}
    t2 = prompt(qwen, qwen_tok, sys_user + [call, {"role": "tool", "content": "print('hi')"}], TOOLS)
    assert t2[1][:o1] == t1[1][:o1]
    assert t2[1][o1:o1 + 3] == t1[1][o1:o1 + 3]        # "<|im_start|>assistant\n" re-read by the next turn
    o2 = t2[4].opener
    answer = {"role": "assistant", "content": "It prints hi.", "reasoning_content": "easy"}
    t3 = prompt(qwen, qwen_tok, sys_user + [call, {"role": "tool", "content": "print('hi')"}, answer,
                                            {"role": "user", "content": "thanks"}], TOOLS)
    # turn 3 drops the reasoning of turn 2's messages (before the last user query): turn 2's opener is shared
    # only up to turn 1's; turn 1's opener still is
    assert t3[1][:o1] == t1[1][:o1]
    assert "I should read it" in t2[0] and "I should read it" not in t3[0]
    assert t3[1][:o2] != t2[1][:o2]
    assert all(r[4].publish == t1[4].publish for r in (t2, t3))


def test_qwen_no_thinking_opener(qwen, qwen_tok):
    text, ids, offsets, spans, cp = prompt(qwen, qwen_tok, [{"role": "user", "content": "hi"}], enable_thinking=False)
    assert text[offsets[cp.opener][0]:] == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert len(ids) - cp.opener <= 8


# ---------------------------------------------------------------- real templates: SmolLM2

def test_smollm_spans_by_hand(smollm, qwen_tok):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Bye"}]
    text = smollm.render(msgs)
    spans = message_spans(smollm, msgs, text)
    d = len(SMOLLM_DEFAULT_SYSTEM)
    u1 = len("<|im_start|>user\nHi<|im_end|>\n")
    a1 = len("<|im_start|>assistant\nHello!<|im_end|>\n")
    u2 = len("<|im_start|>user\nBye<|im_end|>\n")
    assert spans.bounds == (d, d + u1, d + u1 + a1, d + u1 + a1 + u2)
    assert spans.how == ("probe", "prefix", "prefix", "prefix")
    assert spans.generation_start == d + u1 + a1 + u2 == len(text) - len("<|im_start|>assistant\n")
    assert spans.wire() == [{"role": "user", "start": d, "end": d + u1},
                            {"role": "assistant", "start": d + u1, "end": d + u1 + a1},
                            {"role": "user", "start": d + u1 + a1, "end": d + u1 + a1 + u2}]
    assert spans.message_at(d) == spans.spans[0] and spans.message_at(0) is None
    assert spans.message_at(len(text) - 1) is None
    # the default system block is the preamble: shorter than a page → no prefix, and why
    ids, offsets = qwen_tok.encode_with_offsets(text)
    cp = cut_points(text, ids, offsets, spans)
    assert (cp.publish, cp.reason) == (0, "below_page")
    assert text[offsets[cp.opener][0]:] == "<|im_start|>assistant\n"


def test_smollm_system_block(smollm, qwen_tok):
    system = "You are SmolLM, a tiny model. Answer in one line. " * 8
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "2+2?"}]
    text = smollm.render(msgs)
    spans = message_spans(smollm, msgs, text)
    assert spans.bounds[:2] == (0, len(f"<|im_start|>system\n{system}<|im_end|>\n"))
    ids, offsets = qwen_tok.encode_with_offsets(text)
    cp = cut_points(text, ids, offsets, spans)
    cut = token_at(offsets, spans.bounds[1])
    assert cp.publish == cut - cut % 64 and cp.publish > 0
    # without a generation prompt there is no opener
    text2 = smollm.render(msgs, add_generation_prompt=False)
    spans2 = message_spans(smollm, msgs, text2, add_generation_prompt=False)
    assert spans2.generation_start is None and spans2.bounds[-1] == len(text2)
    ids2, offsets2 = qwen_tok.encode_with_offsets(text2)
    cp2 = cut_points(text2, ids2, offsets2, spans2)
    assert (cp2.publish, cp2.opener, cp2.opener_why) == (cp.publish, None, "no_opener")


# ---------------------------------------------------------------- graceful fallback

class Refusing:
    """A template that renders only whole conversations and has no known marker: nothing can be located."""

    source = "{{ whatever }}"

    def __init__(self, full):
        self.full = full

    def render(self, messages, tools=None, add_generation_prompt=True, **kw):
        if len(messages) != self.full:
            raise ValueError("partial conversation")
        return "[" + "|".join(m["content"] for m in messages) + "]>"


def test_unlocatable_spans_are_reported():
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    spans = message_spans(Refusing(2), msgs)
    assert spans.spans == (None, None) and spans.unresolved == (0, 1)
    assert spans.wire() == [{"role": "system", "start": None, "end": None},
                            {"role": "user", "start": None, "end": None}]
    text = "[s|u]>"
    cp = cut_points(text, list(range(6)), [(i, i + 1) for i in range(6)], spans)
    assert (cp.publish, cp.opener, cp.reason) == (0, None, "cut_unaligned")


def test_marker_can_be_forced(smollm):
    msgs = [{"role": "user", "content": "Hi"}]
    spans = message_spans(smollm, msgs, marker=None)        # no probe: the first message's start is unknown
    assert spans.bounds[0] is None and spans.unresolved == (0,)
    assert spans.bounds[1] == len(SMOLLM_DEFAULT_SYSTEM) + len("<|im_start|>user\nHi<|im_end|>\n")


class Counting:
    """Counts renders of a wrapped template."""

    def __init__(self, inner):
        self.inner, self.source, self.calls = inner, inner.source, 0

    def render(self, *a, **kw):
        self.calls += 1
        return self.inner.render(*a, **kw)


def agent_conversation(turns):
    msgs = [{"role": "system", "content": "You are a coding agent. " * 20}, {"role": "user", "content": "go"}]
    for i in range(turns):
        msgs.append({"role": "assistant", "content": "", "reasoning_content": f"step {i}",
                     "tool_calls": [{"type": "function",
                                     "function": {"name": "read_file", "arguments": {"path": f"f{i}.py"}}}]})
        msgs.append({"role": "tool", "content": f"contents of f{i}.py"})
        if i % 3 == 2:
            msgs.append({"role": "tool", "content": f"more of f{i}.py"})
    return msgs


def test_cuts_only_costs_a_few_renders_and_agrees(qwen, qwen_tok):
    msgs = agent_conversation(20)
    text = qwen.render(msgs, tools=TOOLS)
    ids, offsets = qwen_tok.encode_with_offsets(text)
    full = message_spans(qwen, msgs, text, tools=TOOLS)
    check_cover(text, full)
    counting = Counting(qwen)
    cuts = message_spans(counting, msgs, text, tools=TOOLS, only="cuts")
    assert counting.calls <= 6
    assert cuts.bounds[0] == full.bounds[0] and cuts.bounds[1] == full.bounds[1]
    assert cuts.bounds[-1] == full.bounds[-1] and cuts.generation_start == full.generation_start
    assert cuts.how[2:-1] == ("skipped",) * (len(msgs) - 2) and cuts.unresolved == ()
    assert cut_points(text, ids, offsets, cuts) == cut_points(text, ids, offsets, full)
    assert cuts.spans[0] == full.spans[0] and cuts.spans[1] is None
    sub = message_spans(qwen, msgs, text, tools=TOOLS, only=[3, 4])
    assert sub.spans[3] == full.spans[3] and sub.unresolved == ()


def test_message_at_char_binary_search(qwen):
    msgs = agent_conversation(20)
    text = qwen.render(msgs, tools=TOOLS)
    full = message_spans(qwen, msgs, text, tools=TOOLS)
    for s in full.spans[::5] + full.spans[-2:]:
        for char in (s.start, (s.start + s.end) // 2, s.end - 1):
            counting = Counting(qwen)
            assert message_at_char(counting, msgs, text, char, tools=TOOLS) == s
            assert counting.calls <= 3 * 9
    assert message_at_char(qwen, msgs, text, len(text) - 1, tools=TOOLS) is None     # the generation prompt
    assert message_at_char(qwen, [], text, 0) is None
    smol = ChatTemplate(SMOLLM_TEMPLATE, None, "<|im_end|>")
    m = [{"role": "user", "content": "Hi"}]
    assert message_at_char(smol, m, smol.render(m), 0) is None                        # the default system preamble


def test_history_rerendered_after_a_new_user_message(qwen):
    """After a new user query Qwen3.5 drops the reasoning of every earlier assistant message, so no prefix render of
    the tool loop is a prefix of the text: every bound inside it comes from the probe."""
    msgs = agent_conversation(6) + [{"role": "user", "content": "thanks, now summarise"}]
    text = qwen.render(msgs, tools=TOOLS)
    full = message_spans(qwen, msgs, text, tools=TOOLS)
    check_cover(text, full)
    assert full.how.count("probe") > len(msgs) // 2
    for m, s in zip(msgs, full.spans):
        piece = text[s.start:s.end]
        grouped = m["role"] == "tool" and msgs[s.index - 1]["role"] == "tool"
        assert piece.startswith("\n<tool_response>" if grouped else "<|im_start|>"), (s, piece)
        if m["role"] == "tool":
            assert m["content"] in piece
        if m["role"] == "assistant":
            assert m["tool_calls"][0]["function"]["arguments"]["path"] in piece and "<think>" not in piece
    for s in full.spans:
        assert message_at_char(qwen, msgs, text, s.end - 1, tools=TOOLS) == s
