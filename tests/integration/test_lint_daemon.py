"""`ignis lint` through a daemon, the request log round trip, and server.canonicalize_tools (issue 14), on the tiny
real-vocabulary Qwen3.5 hybrid (its template renders tools). One daemon of this module has the request log, the HTTP
fronts and tool canonicalisation on; the shared `qwen_daemon` (tests/conftest.py) has neither."""
from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import orjson
import pytest
from http_support import http, http_addr
from lint_support import SYSTEM, TOOLS, body, reordered_keys

from ignis_client.cli import main as ignis_main

USER = {"role": "user", "text": "The parser test fails since the last commit; please fix it."}
CALL = {"role": "assistant", "calls": [("call_1", "read_file", {"path": "src/parser.py"})]}
RESULT = {"role": "tool", "id": "call_1", "text": "def parse(text):\n    return text.split(',')\n"}
ROUTES = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages", "responses": "/v1/responses"}


@pytest.fixture(scope="module")
def logged(start_module_daemon, tiny_qwen35_real_dir):
    """(daemon, request log path): request log, HTTP fronts on 127.0.0.1 and --server-canonicalize-tools."""
    log = Path(tempfile.mkdtemp(prefix="ignis-reqlog-", dir="/tmp")) / "requests.log"
    d = start_module_daemon(["--model", str(tiny_qwen35_real_dir), "--lanes", "2", "--vram-kv-pool-bytes", "4Ktok",
                            "--model-context-tokens", "2048", "--server-http-listen", "127.0.0.1:0",
                            "--server-request-log", str(log), "--server-canonicalize-tools"])
    return d, log


def _trace() -> list[tuple[str, str, dict]]:
    """(how it is sent: socket or http, shape, body) of a short session with a changed timestamp and tools."""
    s1 = SYSTEM + " Current time: 2025-03-14 09:12:44."
    s2 = s1.replace("09:12:44", "09:20:13")
    grown = [USER, CALL, RESULT]
    return [("http", "openai", body("openai", s1, TOOLS, [USER])),
            ("http", "anthropic", body("anthropic", s1, TOOLS, grown)),
            ("http", "responses", body("responses", s2, TOOLS, grown)),
            ("socket", "openai", body("openai", s2, TOOLS, grown)),
            ("http", "openai", body("openai", s2, list(reversed(TOOLS)), [USER]))]


def _lint_json(capsys, argv: list[str], main=ignis_main) -> dict:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def _comparable(doc: dict) -> dict:
    return {"requests": [{k: v for k, v in r.items() if k != "front"} for r in doc["requests"]],
            "summary": doc["summary"], "errors": doc["errors"]}


def test_request_log_round_trip_and_lint_through_the_daemon(logged, capsys, tmp_path):
    d, log = logged
    trace = _trace()
    client = http(http_addr(d))
    for k, (how, shape, b) in enumerate(trace):
        if how == "socket":
            c = d.conn()
            r = c.request({"id": f"r{k}", "op": "chat", **b})
            c.close()
            assert r["type"] == "done", r
        else:
            resp = client.post(ROUTES[shape], content=orjson.dumps(b))
            assert resp.status_code == 200, resp.text
    path = tmp_path / "trace.jsonl"
    path.write_bytes(b"".join(orjson.dumps(b) + b"\n" for _, _, b in trace))
    d.conn().request({"id": "st", "op": "status"})          # the log's writer thread keeps up with the replies
    lines = [orjson.loads(x) for x in log.read_bytes().splitlines()]
    assert [ln["front"] for ln in lines] == ["openai", "anthropic", "responses", "socket", "openai"]
    assert stat.S_IMODE(os.stat(log).st_mode) == 0o600
    assert lines[3]["body"]["messages"] == trace[3][2]["messages"] and "id" not in lines[3]["body"]
    from_trace = _lint_json(capsys, ["lint", str(path), "--json", "--socket", d.socket])
    from_log = _lint_json(capsys, ["lint", str(log), "--json", "--socket", d.socket])
    assert _comparable(from_log) == _comparable(from_trace)
    assert [r["front"] for r in from_log["requests"]] == ["openai", "anthropic", "responses", "socket", "openai"]
    reqs = from_trace["requests"]
    # 2 grows 1 (another shape, the same rendering); 3 changes the time; 4 repeats 3 over the socket; 5 goes back to
    # the first turn with its tools reordered, which this daemon canonicalises: its prompt is a prefix of 4's
    assert [r["cause"] for r in reqs] == [None, "extended", "timestamp", "none", "extended"]
    assert reqs[2]["divergence"]["message_index"] == 0 and reqs[2]["divergence"]["role"] == "system"
    assert reqs[3]["best"] == 2 and reqs[3]["common_tokens"] == reqs[3]["prompt_tokens"]
    assert reqs[4]["best"] == 3 and reqs[4]["achievable_tokens"] == reqs[4]["common_tokens"] > 400
    rate = d.status()["model"]["prefill_tokens_per_s"]
    assert rate > 0 and from_trace["summary"]["prefill_tokens_per_s"] == rate
    lost = reqs[2]["achievable_tokens"] - reqs[2]["common_tokens"]
    assert lost > 0 and from_trace["summary"]["lost_tokens"] == lost
    assert from_trace["summary"]["lost_seconds"] == pytest.approx(lost / rate)


def _chat(d, rid: str, tools, user: str) -> dict:
    b = body("openai", SYSTEM, tools, [{"role": "user", "text": user}])
    c = d.conn()
    try:
        return c.request({"id": rid, "op": "chat", **b, "max_tokens": 1})
    finally:
        c.close()


def _tools(tag: str):
    return [(f"{tag}_{n}", desc, p) for n, desc, p in TOOLS]


@pytest.mark.parametrize("canonical", [True, False], ids=["canonicalize", "as_sent"])
def test_canonicalize_tools_shares_the_prefix(logged, qwen_daemon, canonical):
    d = logged[0] if canonical else qwen_daemon
    tag = "canon" if canonical else "plain"
    tools = _tools(tag)
    shuffled = [(n, desc, reordered_keys(p)) for n, desc, p in reversed(tools)]
    first = _chat(d, "c1", tools, "List the files of the repository.")
    assert first["type"] == "done" and first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    d.wait_idle()
    second = _chat(d, "c2", shuffled, "Now run the tests, please.")
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    reuse = second["ignis"]["reuse"]
    c = d.conn()
    tok = c.request({"id": "t", "op": "tokenize", **body("openai", SYSTEM, shuffled,
                                                           [{"role": "user", "text": "Now run the tests, please."}])})
    c.close()
    publish = tok["result"]["cut_points"]["publish"]
    assert publish >= 64 and publish % 64 == 0
    if canonical:   # the same bytes up to the end of the tools block: resumes from the retained prefix
        assert cached == publish and reuse["kind"] == "prefix", reuse
    else:           # the first tool differs: nothing a page long is shared
        assert cached == 0 and reuse["kind"] is None, reuse
