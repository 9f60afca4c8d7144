"""The request log (ignisd/request_log.py): lines written from its thread, mode 0600, rotation at the cap with three
files kept; and tool canonicalisation (ignisd/text/tool_canon.py)."""
from __future__ import annotations

import os
import stat

import orjson

from ignisd.request_log import RequestLog
from ignisd.text.tool_canon import canonical_tools


def _lines(path) -> list[dict]:
    return [orjson.loads(x) for x in open(path, "rb").read().splitlines()]


def test_lines_mode_and_secret_fields(tmp_path):
    path = tmp_path / "requests.log"
    log = RequestLog(str(path), 1 << 20)
    log.record("socket", {"op": "chat", "messages": [{"role": "user", "content": "hi"}]})
    log.record("anthropic", {"messages": [], "api_key": "sk-secret"}, "/v1/messages")
    log.flush()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    a, b = _lines(path)
    assert (a["front"], a["body"]["messages"][0]["content"], "path" in a) == ("socket", "hi", False)
    assert (b["front"], b["path"], b["body"]) == ("anthropic", "/v1/messages", {"messages": []})
    assert isinstance(a["ts"], float)
    log.close()


def test_existing_file_is_made_private(tmp_path):
    path = tmp_path / "requests.log"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    RequestLog(str(path), 4096).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_rotation_at_the_cap_keeps_three_files(tmp_path):
    path = tmp_path / "requests.log"
    body = {"messages": [{"role": "user", "content": "x" * 200}]}
    line_len = len(orjson.dumps({"ts": 1700000000.123, "front": "openai", "path": "/v1/chat/completions",
                                 "body": body})) + 1
    cap = 4 * line_len + 10           # four lines fit in one file, the fifth rotates it
    log = RequestLog(str(path), cap)
    for k in range(14):
        log.record("openai", {"messages": [{"role": "user", "content": str(k % 10) * 200}]}, "/v1/chat/completions")
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["requests.log", "requests.log.1", "requests.log.2"]
    sizes = {p.name: p.stat().st_size for p in tmp_path.iterdir()}
    assert all(s <= cap for s in sizes.values())
    # 14 lines, 4 a file: 1-4, 5-8 (dropped), 9-12 in .1 ... newest file holds lines 13-14
    newest = [ln["body"]["messages"][0]["content"][0] for ln in _lines(path)]
    older = [ln["body"]["messages"][0]["content"][0] for ln in _lines(f"{path}.1")]
    oldest = [ln["body"]["messages"][0]["content"][0] for ln in _lines(f"{path}.2")]
    assert (oldest, older, newest) == (list("4567"), list("8901"), list("23"))
    for p in tmp_path.iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o600


def test_canonical_tools_sorts_names_and_schema_keys():
    tools = [{"type": "function", "function": {"parameters": {"type": "object", "required": ["b", "a"],
                                                              "properties": {"b": {"type": "string"},
                                                                             "a": {"type": "integer"}}},
                                               "name": "zeta", "description": "z"}},
             {"function": {"name": "alpha", "parameters": {"properties": {}, "type": "object"}}, "type": "function"}]
    out = canonical_tools(tools)
    assert orjson.dumps(out) == orjson.dumps([
        {"type": "function", "function": {"name": "alpha", "parameters": {"properties": {}, "type": "object"}}},
        {"type": "function", "function": {"name": "zeta", "description": "z", "parameters": {
            "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["b", "a"],
            "type": "object"}}}])
    assert tools[0]["function"]["name"] == "zeta"       # the input is not modified
    assert canonical_tools(None) is None
