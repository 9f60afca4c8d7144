"""`ignis lint` on synthetic traces (client/lint.py, client/lint_causes.py, client/trace.py): each cause of a missed
prefix named at the right message, in each body shape, with the real Qwen3.5 tokenizer and chat template (tools,
reasoning) rendered as the daemon's `tokenize` op renders them (ignisd.lint, no weights). Expected positions and
token counts are computed here from the rendered texts and offsets, independently of the lint code."""
from __future__ import annotations

import orjson
import pytest
from ignis_client.lint import lint
from ignis_client.lint_view import render_json, render_report
from ignis_client.trace import TraceEntry, read_lines
from lint_support import SHAPES, SYSTEM, TOOLS, agent_session, body, reordered_keys
from text_corpus import QWEN35_DIR

from ignisd.lint import load_prompts, renderer

USER = {"role": "user", "text": "The parser test fails since the last commit; please fix it."}
CALL = {"role": "assistant", "calls": [("call_1", "read_file", {"path": "src/parser.py", "encoding": "utf-8"})]}
RESULT = {"role": "tool", "id": "call_1", "text": "def parse(text):\n    return text.split(',')\n"}
CALL2 = {"role": "assistant", "calls": [("call_2", "run_tests", {"target": "tests/test_parser.py"})]}
RESULT2 = {"role": "tool", "id": "call_2", "text": "1 failed, 12 passed"}
BILLING = "x-anthropic-billing-header: cc_version=2.0.14.e3f; cc_entrypoint=cli; cch={};\n"


@pytest.fixture(scope="module")
def prompts():
    return load_prompts(str(QWEN35_DIR))


def _run(prompts, bodies, shape, strip_billing=True):
    entries = [TraceEntry(i + 1, shape, b) for i, b in enumerate(bodies)]
    render = renderer(prompts, strip_billing)
    return lint(entries, render, 1000.0), [render(e) for e in entries]


def _first_diff(a: str, b: str) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


def _common(a: list, b: list) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


# (name, request 1 (system, tools, messages), request 2, expected message index, role, cause, theirs − ours length
# of the volatile span)
def _cases():
    grown = [USER, CALL, RESULT]
    ts = SYSTEM + " Current date: 2025-03-14 09:12:44."
    uid = SYSTEM + " Session 550e8400-e29b-41d4-a716-446655440000."
    cnt = SYSTEM + " This is request number 41 of the session."
    hexid = SYSTEM + " Checked out at commit 3f9a2b7c1d0e4f5a6b7c8d9e0f1a2b of main."
    nonce = SYSTEM + " Request nonce=Xa9bQ2kP for this turn."
    two_spaces = SYSTEM.replace("them, run", "them,  run")
    rev = list(reversed(TOOLS))
    keyed = [(n, d, reordered_keys(p)) for n, d, p in TOOLS]
    think = dict(CALL, reasoning="The parser splits on commas; read it first.")
    swapped = {"role": "assistant", "calls": [("call_1", "read_file", {"encoding": "utf-8", "path": "src/parser.py"})]}
    return [
        ("timestamp", (ts, TOOLS, [USER]), (ts.replace("09:12:44", "09:13:02"), TOOLS, grown), 0, "system",
         "timestamp", 0),
        ("id", (uid, TOOLS, [USER]), (uid.replace("446655440000", "9c1f0d3a7b22"), TOOLS, grown), 0, "system",
         "id", 0),
        ("hex_id", (hexid, TOOLS, [USER]), (hexid.replace("9e0f1a2b", "77c3d4e5"), TOOLS, grown), 0, "system", "id",
         0),
        ("nonce_value", (nonce, TOOLS, [USER]), (nonce.replace("Xa9bQ2kP", "Lm4nT8vW"), TOOLS, grown), 0, "system",
         "nonce", 0),
        ("counter", (cnt, TOOLS, [USER]), (cnt.replace("41", "42"), TOOLS, grown), 0, "system", "counter", 0),
        ("nonce", (BILLING.format("5f2a1") + SYSTEM, TOOLS, [USER]), (BILLING.format("9b3e7") + SYSTEM, TOOLS, grown),
         0, "system", "nonce", 0),
        ("whitespace", (two_spaces, TOOLS, [USER]), (SYSTEM, TOOLS, grown), 0, "system", "whitespace", -1),
        ("tools_reordered", (SYSTEM, TOOLS, [USER]), (SYSTEM, rev, grown), 0, "system", "tools_reordered", 0),
        ("json_key_order", (SYSTEM, TOOLS, [USER]), (SYSTEM, keyed, grown), 0, "system", "json_key_order", 0),
        ("json_key_order_args", (SYSTEM, TOOLS, [USER, CALL, RESULT]), (SYSTEM, TOOLS, [USER, swapped, RESULT, CALL2,
                                                                                      RESULT2]),
         2, "assistant", "json_key_order", 0),
        ("reasoning", (SYSTEM, TOOLS, [USER, think, RESULT]), (SYSTEM, TOOLS, [USER, CALL, RESULT, CALL2, RESULT2]),
         2, "assistant", "reasoning", -len(think["reasoning"])),
    ]


CASES = _cases()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_cause_is_named_at_its_message(prompts, shape, case):
    name, one, two, index, role, cause, delta = case
    rep, (r1, r2) = _run(prompts, [body(shape, *one), body(shape, *two)], shape, strip_billing=False)
    assert not rep.errors
    first, second = rep.requests
    assert first.best is None and first.common_tokens == 0
    t1, t2 = r1["text"], r2["text"]
    common = _common(r1["tokens"], r2["tokens"])
    assert second.best == 0 and second.common_tokens == common and second.prompt_tokens == len(r2["tokens"])
    d = second.divergence
    assert (d["message_index"], d["role"], second.cause) == (index, role, cause), (name, d, second.causes)
    char = _first_diff(t1, t2)
    lo, hi = r2["offsets"][common]
    assert lo <= d["char_offset"] <= max(hi, char) and d["char_offset"] == char
    assert d["ours"] == t1[max(0, char - 40):char + 40] and d["theirs"] == t2[max(0, char - 40):char + 40]
    assert not second.new
    # a byte-stable harness would have matched the whole earlier prompt: its length, moved by the span's change
    end = len(t1) + delta
    assert second.achievable_tokens == sum(1 for _, e in r2["offsets"] if e <= end)
    assert second.achievable_tokens > second.common_tokens
    assert rep.summary.lost_tokens == second.achievable_tokens - second.common_tokens
    assert rep.summary.causes == [{"cause": cause, "requests": 1, "lost_tokens": rep.summary.lost_tokens}]
    assert rep.summary.lost_seconds == pytest.approx(rep.summary.lost_tokens / 1000.0)


@pytest.mark.parametrize("shape", SHAPES)
def test_byte_stable_harness_diverges_only_in_new_messages(prompts, shape):
    sessions = agent_session(6)
    bodies = [body(shape, SYSTEM, TOOLS, m) for m in sessions]
    rep, rendered = _run(prompts, bodies, shape)
    assert not rep.errors and len(rep.requests) == 6
    for k, r in enumerate(rep.requests[1:], 1):
        assert r.best == k - 1 and r.new and r.cause == "extended"
        earlier_messages = 1 + len(sessions[k - 1])          # the system message + the earlier request's
        first_new = rendered[k]["messages"][earlier_messages]["start"]
        assert r.divergence["char_offset"] >= first_new
        assert r.common_tokens == _common(rendered[k - 1]["tokens"], rendered[k]["tokens"])
        assert r.achievable_tokens == r.common_tokens
    s = rep.summary
    assert s.lost_tokens == 0 and s.causes == [] and s.observed_hit_rate == s.achievable_hit_rate
    total = sum(len(r["tokens"]) for r in rendered)
    shared = sum(_common(rendered[k - 1]["tokens"], rendered[k]["tokens"]) for k in range(1, 6))
    assert s.prompt_tokens == total and s.observed_hit_rate == pytest.approx(shared / total)


def test_billing_header_is_stripped_as_the_anthropic_front_strips_it(prompts):
    one = body("anthropic", BILLING.format("5f2a1") + SYSTEM, TOOLS, [USER])
    two = body("anthropic", BILLING.format("9b3e7") + SYSTEM, TOOLS, [USER, CALL, RESULT])
    rep, _ = _run(prompts, [one, two], "anthropic", strip_billing=True)
    assert rep.requests[1].cause == "extended" and rep.summary.lost_tokens == 0


def test_identical_request_and_best_earlier_request(prompts):
    a = body("openai", SYSTEM, TOOLS, [USER])
    b = body("openai", SYSTEM + " Other project.", TOOLS, [USER])
    rep, rendered = _run(prompts, [a, b, a], "openai")
    third = rep.requests[2]
    assert third.best == 0 and third.cause == "none" and third.divergence is None
    assert third.common_tokens == third.achievable_tokens == len(rendered[0]["tokens"])


def test_bad_lines_are_named_and_lint_goes_on(prompts):
    good = body("openai", SYSTEM, TOOLS, [USER])
    bad_role = {"messages": [{"role": "system", "content": "s"}, {"role": "wizard", "content": "x"}]}
    lines = [orjson.dumps(good), b"{not json", orjson.dumps({"prompt_x": 1}), orjson.dumps(bad_role),
             orjson.dumps({"front": "socket", "body": good}), orjson.dumps({"front": "carrier-pigeon", "body": {}})]
    entries, errors = read_lines(lines)
    assert [(e.line, e.field) for e in errors] == [(2, "body"), (3, "messages"), (6, "front")]
    assert "unknown body shape" in errors[1].message
    rep = lint(entries, renderer(prompts), None, errors)
    assert [(e.line, e.field) for e in rep.errors] == [(2, "body"), (3, "messages"), (4, "messages[1].role"),
                                                       (6, "front")]
    assert [r.line for r in rep.requests] == [1, 5] and rep.requests[1].cause == "none"
    assert rep.requests[1].front == "socket" and rep.summary.lost_seconds is None


def test_shape_detection():
    from ignis_client.trace import detect_shape
    for shape in SHAPES:
        assert detect_shape(body(shape, SYSTEM, TOOLS, [USER, CALL, RESULT])) == shape
    assert detect_shape({"messages": [{"role": "user", "content": "hi"}]}) == "openai"
    assert detect_shape({"input": "hi"}) == "responses"


def test_terminal_colour_only_when_asked_and_json(prompts):
    one = body("openai", SYSTEM + " Current date: 2025-03-14.", TOOLS, [USER])
    two = body("openai", SYSTEM + " Current date: 2025-03-15.", TOOLS, [USER])
    rep, _ = _run(prompts, [one, two], "openai")
    plain, coloured = render_report(rep, colour=False), render_report(rep, colour=True)
    assert "\x1b[" not in plain and "\x1b[31mtimestamp\x1b[0m" in coloured
    lines = plain.splitlines()
    assert lines[0].startswith("#0 ") and "first request" in lines[0]
    assert lines[1].startswith("#1 ") and "timestamp at msg 0 system" in lines[1]
    doc = orjson.loads(render_json(rep))
    assert doc["requests"][1]["cause"] == "timestamp" and doc["summary"]["causes"][0]["cause"] == "timestamp"
    # counts read as English: one request of two lost to the timestamp, no unusable line
    assert "summary: 2 requests, 0 unusable lines, " in plain and "timestamp (1 request, " in plain


def test_tokenize_op_takes_an_http_front_body():
    from ignis_client import protocol as P
    an = body("anthropic", SYSTEM, TOOLS, [USER])
    op = P.parse_request({"id": "t", "op": "tokenize", "api": "anthropic", "body": an})
    assert (op.api, op.body, op.chat) == ("anthropic", an, None)
    op = P.parse_request({"id": "t", "op": "tokenize", "api": "openai", "body": body("openai", SYSTEM, TOOLS, [USER])})
    assert op.chat.messages[1] == {"role": "user", "content": USER["text"]}
    for bad, field in [({"api": "gemini", "body": {}}, "api"), ({"api": "responses"}, "body"),
                       ({"api": "openai", "body": {"messages": [{"role": "wizard", "content": "x"}]}},
                        "body.messages[0].role"),
                       ({"api": "openai", "body": {}, "text": "x"}, "api")]:
        with pytest.raises(P.ProtocolError) as e:
            P.parse_request({"id": "t", "op": "tokenize", **bad})
        assert e.value.field == field, bad


def test_tokenize_of_each_body_equals_the_fronts_rendering(prompts):
    """The three shapes of one conversation render the same text (the fronts map them onto the same chat)."""
    conv = [USER, dict(CALL, reasoning="Read it first."), RESULT]
    texts = {shape: renderer(prompts)(TraceEntry(1, shape, body(shape, SYSTEM, TOOLS, conv)))["text"]
             for shape in SHAPES}
    assert texts["openai"] == texts["anthropic"] == texts["responses"]
    assert "<tools>" in texts["openai"] and "Read it first." in texts["openai"]


def test_an_unopenable_request_log_stops_the_start(tmp_path):
    from ignisd.config import parse_serve_args
    from ignisd.daemon import _open_request_log
    from ignisd.preflight import StartupError
    cfg = parse_serve_args(["--server-request-log", str(tmp_path / "missing-dir" / "requests.log")])
    with pytest.raises(StartupError) as e:
        _open_request_log(cfg)
    assert e.value.exit_code == 2 and "server.request_log" in str(e.value)
    assert _open_request_log(parse_serve_args([])) is None


def test_ignisd_lint_command_colours_only_a_terminal(tmp_path, capsys):
    from ignisd.cli import main as ignisd_main
    trace = tmp_path / "trace.jsonl"
    one = body("openai", SYSTEM + " Current date: 2025-03-14.", TOOLS, [USER])
    two = body("openai", SYSTEM + " Current date: 2025-03-15.", TOOLS, [USER])
    trace.write_bytes(orjson.dumps(one) + b"\n" + orjson.dumps(two) + b"\n")
    base = ["lint", "--model", str(QWEN35_DIR), str(trace), "--prefill-rate", "500"]
    assert ignisd_main(base) == 0                       # stdout is captured here: not a terminal
    auto = capsys.readouterr().out
    assert "\x1b[" not in auto and "timestamp at msg 0 system" in auto and "s at 500 prefill tokens/s" in auto
    assert ignisd_main(base + ["--color", "always"]) == 0
    assert "\x1b[31mtimestamp\x1b[0m" in capsys.readouterr().out
    assert ignisd_main(["lint", "--model", str(tmp_path / "nope"), str(trace)]) == 2
    assert ignisd_main(["lint", "--model", str(QWEN35_DIR), str(tmp_path / "missing.jsonl")]) == 1


def test_ignisd_lint_reads_model_builtin_as_serve_does(tmp_path, capsys):
    """`--model builtin` (serve's word for the built-in model, model.path) renders with the SmolLM2 GGUF, as the
    file's own path does; it used to be taken for a path ("builtin: no such file or directory", exit 2)."""
    from daemon_support import smollm_gguf

    from ignisd.cli import main as ignisd_main
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(orjson.dumps(body("openai", SYSTEM, [], [USER])) + b"\n")
    assert ignisd_main(["lint", "--model", "builtin", str(trace), "--json"]) == 0
    by_word = orjson.loads(capsys.readouterr().out)
    assert ignisd_main(["lint", "--model", str(smollm_gguf()), str(trace), "--json"]) == 0
    assert by_word == orjson.loads(capsys.readouterr().out)
    assert by_word["summary"]["requests"] == 1 and by_word["requests"][0]["prompt_tokens"] > 0
    with pytest.raises(SystemExit) as e:                  # a value model.path refuses: argparse's exit 2
        ignisd_main(["lint", "--model", "a\0b", str(trace)])
    assert e.value.code == 2
    assert ('argument --model: model.path: invalid value "a\\u0000b" (from flag --model); allowed: a path, or '
            '"builtin"') in capsys.readouterr().err


def test_lint_imports_without_torch():
    import subprocess
    import sys
    code = ("import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
            "import ignis_client.cli, ignis_client.lint, ignis_client.lint_view, ignis_client.trace\n"
            "import ignisd.lint, ignisd.request_log, ignisd.fronts.bodies, ignisd.text.tool_canon\n"
            "bad = [m for m in sys.modules if m.startswith(('torch', 'numpy')) and sys.modules[m] is not None]\n"
            "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
