"""The reply parsers (ignisd.text.output_parser, ignisd.text.tool_calls): reasoning, content and tool calls of
Qwen3.5 (XML calls) and Qwen3 / Qwen3-Next (JSON calls), whole and streamed in every kind of split."""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import jinja2
import jinja2.sandbox
import pytest

from ignisd.text.output_parser import count_in_spans, make_output_parser, parse_output, prompt_starts_in_reasoning
from ignisd.text.tool_calls import xml_value_json

DATA = Path("/work/shared/data")
ROOT = Path(__file__).resolve().parents[2]


def _ids(i: int) -> str:
    return f"call_{i}"


def _tool(name: str, **props) -> dict:
    return {"type": "function", "function": {"name": name, "description": name, "parameters": {
        "type": "object", "properties": {k: ({"type": v} if isinstance(v, str) else v) for k, v in props.items()}}}}


TOOLS = [
    _tool("get_weather", city="string", days="integer"),
    _tool("write_file", path="string", content="string"),
    _tool("configure", flag="boolean", ratio="number", tags="array", opts="object", code="string",
          maybe={"type": ["integer", "null"]}, note={"anyOf": [{"type": "string"}, {"type": "integer"}]}),
]


def _final(out) -> dict:
    return {"content": out.content, "reasoning_content": out.reasoning_content, "tool_calls": out.tool_calls}


def _call(i: int, name: str, arguments) -> dict:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


def _stream(pieces, **kw):
    """Feed pieces; return (final, accumulated deltas as a message, every delta)."""
    parser = make_output_parser(make_id=_ids, **kw)
    deltas = [parser.feed(p) for p in pieces]
    out = parser.finish()
    deltas.append(out.delta)
    content, reasoning, calls = "", "", {}
    for d in deltas:
        assert set(d) <= {"content", "reasoning_content", "tool_calls"}
        assert all(d[k] for k in d), d  # no empty fields
        content += d.get("content", "")
        reasoning += d.get("reasoning_content", "")
        for piece in d.get("tool_calls", []):
            i = piece["index"]
            if i not in calls:  # the first piece of a call carries its id, type and name
                assert set(piece) == {"index", "id", "type", "function"} and piece["type"] == "function"
                calls[i] = {"id": piece["id"], "type": "function",
                            "function": {"name": piece["function"]["name"], "arguments": ""}}
            else:
                assert set(piece) == {"index", "function"} and set(piece["function"]) == {"arguments"}
            calls[i]["function"]["arguments"] += piece["function"]["arguments"]
    acc = {"content": content or None, "reasoning_content": reasoning or None,
           "tool_calls": [calls[i] for i in sorted(calls)] or None}
    return out, acc, deltas


def _splits(text: str, seed: int = 1234):
    """Every fixed piece size 1..3 at every phase, every two-piece split, and random splits."""
    for k in (1, 2, 3):
        for phase in range(k):
            yield [text[:phase]] + [text[i:i + k] for i in range(phase, len(text), k)]
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    rng = random.Random(seed)
    for _ in range(20):
        cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 12))))
        yield [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def check(text: str, expected: dict, consistent: bool = True, **kw) -> None:
    """Whole and every split give ``expected``; with ``consistent``, the deltas add up to it as well."""
    kw.setdefault("family", "qwen3_5")
    whole = parse_output(text, make_id=_ids, **kw)
    assert _final(whole) == expected
    assert whole.has_tool_calls == bool(expected["tool_calls"])
    for pieces in _splits(text):
        out, acc, _ = _stream(pieces, **kw)
        assert _final(out) == expected, pieces
        assert out.reasoning_spans == whole.reasoning_spans, pieces
        if consistent:
            norm = dict(expected, content=expected["content"] or None)
            assert acc == norm, pieces


def msg(content=None, reasoning=None, calls=None) -> dict:
    return {"content": content, "reasoning_content": reasoning, "tool_calls": calls}


# -- reasoning -------------------------------------------------------------------------------------------
def test_reasoning_starts_in_prompt():
    check("Let me think.\nStep 2.\n</think>\n\nThe answer is 4.",
          msg("The answer is 4.", "Let me think.\nStep 2."), starts_in_reasoning=True)


def test_reasoning_opened_by_the_model():
    check("<think>\nhmm\n</think>\n\nHi there", msg("Hi there", "hmm"), family="qwen3")
    check("  \n<think>a</think>b", msg("b", "a"), family="qwen3")


def test_close_tag_without_reasoning_is_content():
    text = "Let me think.\n</think>\n\nThe answer is 4."
    check(text, msg(text), starts_in_reasoning=False)
    check("Hi <think>no</think> there", msg("Hi <think>no</think> there"))


def test_reasoning_cut_off_and_empty():
    check("still thinking and </thi", msg("", "still thinking and </thi"), starts_in_reasoning=True)
    check("\n\n</think>\n\nDone.", msg("Done."), starts_in_reasoning=True)
    check("<think>\nagain\n</think>\nDone.", msg("Done.", "again"), starts_in_reasoning=True)
    check("<", msg("", "<"), starts_in_reasoning=True)
    check("", msg(""), starts_in_reasoning=True)
    check("", msg(""))
    check("<thin", msg("<thin"))


def test_reasoning_spans():
    """The characters of the reasoning, [start, end): its tags included, a tool call inside it left out (a call
    that fails there stays reasoning), unclosed to the end; the same whatever the split (`check`). The expected
    offsets are counted by hand."""
    def spans(text, **kw):
        kw.setdefault("family", "qwen3_5")
        check(text, _final(parse_output(text, make_id=_ids, **kw)), consistent=False, **kw)   # split-independent
        return parse_output(text, make_id=_ids, **kw).reasoning_spans

    # "Let me think.\n" is 14 characters, "</think>" 8
    assert spans("Let me think.\n</think>\n\nThe answer.", starts_in_reasoning=True) == ((0, 22),)
    # "  \n" 3 + "<think>" 7 + "a" 1 + "</think>" 8
    assert spans("  \n<think>a</think>b", family="qwen3") == ((0, 19),)
    n = len(XML_WEATHER)
    # "<think>\nLook.\n" 14, the call, then "\nThen.\n</think>" 15
    assert spans("<think>\nLook.\n" + XML_WEATHER + "\nThen.\n</think>\n\nDone.", tools=TOOLS) == \
        ((0, 14), (14 + n, 14 + n + 15))
    # a call first: no empty span before it; "\n</think>" 9
    assert spans(XML_WEATHER + "\n</think>x", tools=TOOLS, starts_in_reasoning=True) == ((n, n + 9),)
    # "hm " 3 + "<tool_call>" 11 + "\n" 1 + "</think>" 8: the failed call is reasoning, one span
    assert spans("hm <tool_call>\n</think>\n\nok", starts_in_reasoning=True) == ((0, 23),)
    assert spans("</think>\n\nDone.", starts_in_reasoning=True) == ((0, 8),)
    assert spans("still thinking", starts_in_reasoning=True) == ((0, 14),)
    assert spans("Let me think.\n</think>\n\nThe answer.") == ()
    assert spans("<think>a</think>b", family="none") == ()


def test_count_in_spans():
    assert count_in_spans([0, 3, 8, 14, 20], ((2, 9), (14, 15))) == 3
    assert count_in_spans([0, 1, 2], ()) == 0
    assert count_in_spans([5, 5, 6], ((5, 6),)) == 2        # a token that completes no character shares an offset


def test_prompt_starts_in_reasoning():
    src = (DATA / "qwen3_5" / "chat_template.jinja").read_text()
    msgs = [{"role": "user", "content": "hi"}]
    assert prompt_starts_in_reasoning(_render(src, msgs, add_generation_prompt=True))
    assert not prompt_starts_in_reasoning(_render(src, msgs, add_generation_prompt=True, enable_thinking=False))
    qwen3 = (DATA / "qwen3" / "chat_template.jinja").read_text()
    assert not prompt_starts_in_reasoning(_render(qwen3, msgs, add_generation_prompt=True))
    assert prompt_starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_starts_in_reasoning("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


# -- content ---------------------------------------------------------------------------------------------
def test_mentions_of_tags_stay_content():
    for text in ("Use the <tool tag.", "I like <tools> and <tool_", "a <tool_call", "x <tool_calls> y <",
                 "<function=f> is not a call", "<think"):
        check(text, msg(text.strip()))


def test_none_family_is_verbatim():
    text = " <think>x</think>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n"
    check(text, msg(text), family="none")
    check(text, msg(text), family="none", starts_in_reasoning=True)


def test_unknown_family():
    with pytest.raises(ValueError):
        make_output_parser("llama")


# -- XML calls (Qwen3.5) ---------------------------------------------------------------------------------
XML_WEATHER = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
               "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def test_xml_call_with_reasoning_and_content():
    text = "The user wants weather.\n</think>\n\nI'll check.\n\n" + XML_WEATHER
    check(text, msg("I'll check.", "The user wants weather.", [_call(0, "get_weather", {"city": "Paris", "days": 3})]),
          tools=TOOLS, starts_in_reasoning=True)


def test_calls_inside_reasoning_are_calls():
    """Qwen3.5 often calls a tool before it closes its reasoning (vLLM #39056): the call is a call, the reasoning
    goes on around it, and a malformed call inside the reasoning stays reasoning text."""
    weather = _call(0, "get_weather", {"city": "Paris", "days": 3})
    check("The user wants weather.\n" + XML_WEATHER + "\n</think>\n\n",
          msg(None, "The user wants weather.", [weather]), tools=TOOLS, starts_in_reasoning=True)
    check("<think>\nLook it up.\n" + XML_WEATHER + "\nThen answer.\n</think>\n\nDone.",
          msg("Done.", "Look it up.\n\nThen answer.", [weather]), tools=TOOLS)
    json_call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    check("hm\n" + json_call, msg(None, "hm", [_call(0, "get_weather", '{"city": "Paris", "days": 3}')]),
          family="qwen3", tools=TOOLS, starts_in_reasoning=True)
    check("hm <tool_call>\n</think>\n\nok", msg("ok", "hm <tool_call>"), starts_in_reasoning=True)


def test_xml_two_calls_and_text_after():
    text = XML_WEATHER + "\n" + XML_WEATHER.replace("Paris", "Rome") + "\nthen more"
    check(text, msg("then more", None, [_call(0, "get_weather", {"city": "Paris", "days": 3}),
                                        _call(1, "get_weather", {"city": "Rome", "days": 3})]), tools=TOOLS)


def test_xml_values_by_schema():
    def call(params: dict, tools=TOOLS, name="configure"):
        body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
        out = parse_output(f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>", "qwen3_5", tools)
        assert out.content is None and len(out.tool_calls) == 1
        return json.loads(out.tool_calls[0]["function"]["arguments"])

    assert call({"flag": "True", "ratio": "0.5", "tags": '["a", "b"]', "opts": '{"x": 1}'}) == \
        {"flag": True, "ratio": 0.5, "tags": ["a", "b"], "opts": {"x": 1}}
    assert call({"flag": "false", "maybe": "None", "code": "123"}) == {"flag": False, "maybe": None, "code": "123"}
    assert call({"code": "\n  indented\nlines\n\n", "note": "7"}) == {"code": "\n  indented\nlines\n\n", "note": 7}
    assert call({"opts": "{not json", "ratio": "NaN"}) == {"opts": "{not json", "ratio": "NaN"}
    # no schema (unknown function or no tools): JSON numbers, booleans, objects and arrays; else text
    assert call({"a": "12", "b": "true", "c": "[1]", "d": "null", "e": "True", "f": "hi", "g": '"q"'}, tools=None) == \
        {"a": 12, "b": True, "c": [1], "d": "null", "e": "True", "f": "hi", "g": '"q"'}
    assert xml_value_json("", frozenset()) == '""'


def test_xml_no_parameters_and_markup_in_values():
    check("<tool_call>\n<function=ping>\n</function>\n</tool_call>", msg(None, None, [_call(0, "ping", {})]))
    body = "<parameter=x>\n</function> <parameter=y> </tool_call> </parameter\n</parameter>\n"
    check(f"<tool_call>\n<function=write_file>\n{body.replace('x', 'content')}</function>\n</tool_call>",
          msg(None, None, [_call(0, "write_file", {"content": "</function> <parameter=y> </tool_call> </parameter"})]),
          tools=TOOLS)


def test_xml_string_values_stream_before_they_close():
    parser = make_output_parser("qwen3_5", TOOLS, make_id=_ids)
    head = parser.feed("<tool_call>\n<function=write_file>\n<parameter=content>\nline one\nline")
    assert head["tool_calls"][0] == {"index": 0, "id": "call_0", "type": "function",
                                     "function": {"name": "write_file", "arguments": '{"content": "line one\\nline'}}
    assert "content" not in head
    assert parser.feed(" two\n") == {"tool_calls": [{"index": 0, "function": {"arguments": " two"}}]}
    assert parser.feed("</parameter>\n</function>\n</tool_call>") == \
        {"tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]}
    assert parser.finish().tool_calls == [_call(0, "write_file", {"content": "line one\nline two"})]


# -- JSON calls (Qwen3 / Qwen3-Next) ---------------------------------------------------------------------
def test_json_calls():
    text = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich", "n": [1, {"a": "}"}]}}\n'
            '</tool_call>\n<tool_call>\n{"name":"f","arguments":{"s":"x</tool_call>\\"<"}}\n</tool_call>')
    check(text, msg("Checking.", None, [
        _call(0, "get_weather", '{"city": "Zürich", "n": [1, {"a": "}"}]}'),
        _call(1, "f", '{"s":"x</tool_call>\\"<"}')]), family="qwen3")


def test_json_other_shapes_parsed_whole():
    text = ('<tool_call>\n{"arguments": {"b": 2}, "name": "g"}\n</tool_call>'
            '<tool_call>{"name": "h", "arguments": "{\\"c\\": 3}"}</tool_call>'
            '<tool_call>{"name": "k"}</tool_call>')
    check(text, msg(None, None, [_call(0, "g", {"b": 2}), _call(1, "h", {"c": 3}), _call(2, "k", {})]), family="qwen3")


def test_both_forms_in_both_families():
    json_call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
    for family in ("qwen3", "qwen3_5"):
        assert parse_output(XML_WEATHER, family, TOOLS).tool_calls[0]["function"]["name"] == "get_weather"
        assert json.loads(parse_output(json_call, family).tool_calls[0]["function"]["arguments"]) == \
            {"city": "Paris", "days": 3}


# -- malformed calls fall back to content -----------------------------------------------------------------
@pytest.mark.parametrize("text,consistent", [
    ('<tool_call>\n{"name": "f", "arguments": {"a": tru}}\n</tool_call>', False),  # bad JSON after the header
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1}} trailing\n</tool_call>', False),
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1 <b>\n</tool_call>', False),
    ('<tool_call>\n{"name": "f" "arguments": {}}\n</tool_call>', True),  # never a header: nothing streamed
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis", False),  # cut off
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\nstray\n</function>", False),
    ("<tool_call>\n<function=get_weather>\n", False),
    ("<tool_call>\n<function=get\nweather>\n</function>\n</tool_call>", True),
    ("<tool_call>\n<function=>\n</function>\n</tool_call>", True),
    ("<tool_call> hello there", True),
    ("<tool_call>", True),
    ("<tool_call>\n<func", True),
])
def test_malformed_calls_are_content(text, consistent):
    check("Before. " + text, msg("Before. " + text.strip()), consistent=consistent, tools=TOOLS)


def test_malformed_then_valid_call():
    text = "<tool_call> oops " + XML_WEATHER
    check(text, msg("<tool_call> oops", None, [_call(0, "get_weather", {"city": "Paris", "days": 3})]), tools=TOOLS)


def test_finish_is_idempotent_and_feed_after_finish_raises():
    parser = make_output_parser("qwen3_5", starts_in_reasoning=True)
    parser.feed("a</think>b <tool")
    out = parser.finish()
    assert out.delta == {"content": " <tool"} and parser.finish() is out
    assert out.message() == {"role": "assistant", "content": "b <tool", "reasoning_content": "a", "tool_calls": None}
    with pytest.raises(RuntimeError):
        parser.feed("x")


def test_random_ids_are_unique():
    out = parse_output(XML_WEATHER + XML_WEATHER, "qwen3_5")
    ids = [c["id"] for c in out.tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") and len(i) == 29 for i in ids)


# -- round trips through the real chat templates ----------------------------------------------------------
def _render(source: str, messages, tools=None, **kw) -> str:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, **k: json.dumps(x, ensure_ascii=False, **k)

    def _raise(message):
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = _raise
    return env.from_string(source).render(messages=messages, tools=tools, **kw)


ROUND_TRIP_ARGS = [
    ("get_weather", {"city": "São Paulo", "days": 3}),
    ("configure", {"flag": True, "ratio": 0.25, "tags": ["x", "y z"], "opts": {"k": [1, None], "t": "ü"},
                   "code": "007", "maybe": None, "note": "hello"}),
    ("write_file", {"path": "/tmp/a b.py", "content": "\ndef f():\n    return '<tool_call>'\n\n"}),
    ("configure", {"flag": False, "code": "true", "tags": []}),
]


@pytest.mark.parametrize("family,template", [("qwen3_5", "qwen3_5"), ("qwen3", "qwen3")])
def test_template_round_trip(family, template):
    source = (DATA / template / "chat_template.jinja").read_text()
    calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in ROUND_TRIP_ARGS]
    assistant = {"role": "assistant", "content": "Let me do it.", "reasoning_content": "Plan: call the tools.",
                 "tool_calls": calls}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go."}, assistant]
    rendered = _render(source, messages, tools=TOOLS, add_generation_prompt=False)
    turn = rendered[rendered.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n"):]
    turn = turn[:turn.index("<|im_end|>")]
    assert turn.startswith("<think>\n") and turn.endswith("</tool_call>")
    out = parse_output(turn, family, TOOLS, make_id=_ids)
    assert out.content == "Let me do it." and out.reasoning_content == "Plan: call the tools."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in out.tool_calls] == ROUND_TRIP_ARGS
    for pieces in [[turn[i:i + 2] for i in range(0, len(turn), 2)], [turn[:37], turn[37:]]]:
        streamed, acc, _ = _stream(pieces, family=family, tools=TOOLS)
        assert _final(streamed) == _final(out) == acc
    # the reply re-renders as the same text: the parse inverts the render
    again = dict(assistant, tool_calls=[{"type": "function", "function": {
        "name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}} for c in out.tool_calls])
    assert _render(source, messages[:2] + [again], tools=TOOLS, add_generation_prompt=False) == rendered


def test_transformers_renders():
    """The assistant turns of transformers' own renders (rendered_examples.json) parse back to their messages."""
    examples = json.loads((DATA / "qwen3_5" / "rendered_examples.json").read_text())
    seen = 0
    for ex in examples:
        rendered = ex["rendered"]
        thinking = ex["kwargs"].get("enable_thinking", True)
        assert prompt_starts_in_reasoning(rendered) == thinking, ex["name"]
        turns = rendered.split("<|im_start|>assistant\n")[1:]
        for m, turn in zip([m for m in ex["messages"] if m["role"] == "assistant"], turns):
            out = parse_output(turn[:turn.index("<|im_end|>")], "qwen3_5", ex.get("tools"))
            content = (m["content"] or "").split("</think>")[-1].strip()  # the template splits reasoning off content
            assert out.content == (content or None if m.get("tool_calls") else content)
            if out.reasoning_content is not None:
                assert out.reasoning_content == m["reasoning_content"]
            want = [(c["function"]["name"], c["function"]["arguments"]) for c in m.get("tool_calls") or []]
            got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in out.tool_calls or []]
            assert got == want
            seen += len(want)
    assert seen == 3


def test_fuzz_whole_equals_streamed():
    """Calls of both forms, reasoning and text, cut short or with a character replaced: every split
    gives the whole text's result, content and reasoning deltas add up to it, and every final call's
    streamed pieces add up to it."""
    rng = random.Random(7)
    values = ["x", "", "\n", "a\nb\n", "12", "True", '{"k": [1, "<"]}', "</tool_call>", "ü \\ \"q\""]

    def xml_call():
        params = "".join(f"<parameter={rng.choice(['content', 'path', 'n'])}>\n{rng.choice(values)}\n</parameter>\n"
                         for _ in range(rng.randint(0, 3)))
        return f"<tool_call>\n<function={rng.choice(['write_file', 'f'])}>\n{params}</function>\n</tool_call>"

    def json_call():
        args = {rng.choice("abc"): rng.choice([1, "</tool_call>", [1, {"y": "}"}], None])
                for _ in range(rng.randint(0, 2))}
        obj = {"arguments": args, "name": "f"} if rng.random() < 0.3 else {"name": "f", "arguments": args}
        return "<tool_call>\n" + json.dumps(obj) + "\n</tool_call>"

    text_bits = ["text", "\n", " <tool", "<think>", "ok </think>"]
    n_calls = 0
    for _ in range(300):
        parts = ["<think>\nhm <tool_call>\n</think>\n\n"] if rng.random() < 0.3 else []
        parts += [rng.choice([xml_call, json_call, lambda: rng.choice(text_bits)])() for _ in range(rng.randint(0, 3))]
        text, r = "".join(parts), rng.random()
        if text and r < 0.2:
            text = text[:rng.randint(0, len(text))]
        elif text and r < 0.4:
            i = rng.randint(0, len(text))
            text = text[:i] + rng.choice(["<", "x", "\n", "}", '"', "</parameter>", "<tool_call>"]) + text[i + 1:]
        kw = {"family": rng.choice(["qwen3_5", "qwen3"]), "tools": TOOLS, "starts_in_reasoning": rng.random() < 0.2}
        parsed = parse_output(text, make_id=_ids, **kw)
        whole, whole_spans = _final(parsed), parsed.reasoning_spans
        n_calls += len(whole["tool_calls"] or [])
        for _ in range(3):
            cuts = sorted(rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randint(1, 20))))
            out, acc, _ = _stream([text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])], **kw)
            assert _final(out) == whole, text
            assert out.reasoning_spans == whole_spans, text
            assert (acc["content"], acc["reasoning_content"]) == (out.content or None, out.reasoning_content), text
            streamed = {c["id"]: c for c in acc["tool_calls"] or []}
            assert all(streamed[c["id"]] == c for c in out.tool_calls or []), text
    assert n_calls > 150


def test_no_torch_import():
    code = ("import sys; sys.modules['torch'] = None; import ignisd.text.output_parser as p; "
            "print(p.parse_output('<think>a</think>b', 'qwen3').content)")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == "b", run.stderr
