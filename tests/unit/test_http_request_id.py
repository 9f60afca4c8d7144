"""Request ids over HTTP: every reply to a generation request carries its id (``x-request-id`` on the OpenAI and
Responses fronts, ``request-id`` on Anthropic's), streamed or not, refusals included; the id is the reply body's own
id and the ``id`` of the request's ``done`` (or ``error_reply``) log line and request-log line. A client's valid
``X-Request-Id`` becomes the id. Real HTTP to the daemon's HttpFront over a scripted engine (tests/http_support); the
log lines are the daemon's own format, read back with ignisd.log.parse_line."""
from __future__ import annotations

import io
import logging

import orjson
import pytest
from http_support import anthropic_client, http, openai_client, sse

from ignisd.log import ROOT, LineFormatter, parse_line
from ignisd.request_log import RequestLog

USER = [{"role": "user", "content": "Hi?"}]
CHAT = {"model": "m", "messages": USER, "max_tokens": 8}
MESSAGES = {"model": "m", "max_tokens": 8, "messages": USER}


@pytest.fixture
def srv(scripted):
    s, engine = scripted
    engine.text = "</think>\n\nHello there."
    return s, engine


@pytest.fixture
def logs():
    """The daemon's log lines written during the test: logs(event) → the fields of each line of that event."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(LineFormatter())
    logger = logging.getLogger(ROOT)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    def lines(event: str) -> list[dict]:
        handler.flush()
        parsed = [parse_line(line) for line in buf.getvalue().splitlines()]
        return [p.fields for p in parsed if p.event == event]
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def done_ids(logs) -> list:
    return [f["id"] for f in logs("done")]


def test_each_reply_carries_the_id_of_its_done_line(srv, logs):
    s, engine = srv
    h = http(s.addr)
    seen = []
    # OpenAI chat, whole: the SDK reads the header as the reply's request id
    raw = openai_client(s.addr).chat.completions.with_raw_response.create(**CHAT)
    r = raw.parse()
    assert raw.headers["x-request-id"] == r.id == r._request_id and r.id.startswith("chatcmpl-")
    seen.append(r.id)
    # OpenAI chat, streamed: the header is sent before the first chunk, every chunk names the same id
    resp = h.post("/v1/chat/completions", json={**CHAT, "stream": True})
    chunk_ids = {d["id"] for _, d in sse(resp.content) if d != "[DONE]"}
    assert chunk_ids == {resp.headers["x-request-id"]}
    seen.append(resp.headers["x-request-id"])
    # completions
    resp = h.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 8})
    assert resp.headers["x-request-id"] == resp.json()["id"] and resp.json()["id"].startswith("cmpl-")
    seen.append(resp.json()["id"])
    # Responses, whole and streamed
    resp = h.post("/v1/responses", json={"input": "Hi?", "max_output_tokens": 8})
    assert resp.headers["x-request-id"] == resp.json()["id"] and resp.json()["id"].startswith("resp_")
    seen.append(resp.json()["id"])
    resp = h.post("/v1/responses", json={"input": "Hi?", "max_output_tokens": 8, "stream": True})
    evs = sse(resp.content)
    assert evs[-1][0] == "response.completed" and evs[0][1]["response"]["id"] == evs[-1][1]["response"]["id"]
    assert resp.headers["x-request-id"] == evs[0][1]["response"]["id"]
    seen.append(resp.headers["x-request-id"])
    # Anthropic, whole (the SDK reads request-id) and streamed; no OpenAI header there
    raw = anthropic_client(s.addr).messages.with_raw_response.create(**MESSAGES)
    m = raw.parse()
    assert raw.headers["request-id"] == m.id == m._request_id and m.id.startswith("msg_")
    assert "x-request-id" not in raw.headers
    seen.append(m.id)
    resp = h.post("/v1/messages", json={**MESSAGES, "stream": True})
    start = sse(resp.content)[0][1]
    assert start["type"] == "message_start" and resp.headers["request-id"] == start["message"]["id"]
    seen.append(start["message"]["id"])
    assert len(set(seen)) == len(seen) == 7
    assert done_ids(logs) == seen                             # one done line per reply, naming the header's id
    assert [q.rid for q in engine.submitted] == ["h:" + i for i in seen]   # the engine's keys: the body ids
    # count_tokens answers under Anthropic's header too (its id names no done line: nothing is generated)
    resp = h.post("/v1/messages/count_tokens", json={"model": "m", "messages": USER})
    assert resp.status_code == 200 and resp.headers["request-id"].startswith("count_")


def test_refusals_carry_the_id_their_error_line_names(srv, logs):
    s, engine = srv
    h = http(s.addr)
    # refused by the engine, whole and before a stream starts: 429 with Retry-After and the id
    engine.error = ("busy", "256 requests waiting", None)
    busy = [h.post("/v1/chat/completions", json=CHAT), h.post("/v1/chat/completions", json={**CHAT, "stream": True}),
            h.post("/v1/messages", json=MESSAGES)]
    assert [(r.status_code, r.headers["retry-after"]) for r in busy] == [(429, "1")] * 3
    busy_ids = [busy[0].headers["x-request-id"], busy[1].headers["x-request-id"], busy[2].headers["request-id"]]
    assert [q.rid for q in engine.submitted] == ["h:" + i for i in busy_ids]     # the engine saw these ids
    engine.error = None
    # refused by the front: a bad field, a body that is not JSON, a Messages body without max_tokens
    bad = [h.post("/v1/chat/completions", json={"messages": "hi"}),
           h.post("/v1/responses", content=b"{not json", headers={"Content-Type": "application/json"}),
           h.post("/v1/messages", json={"messages": USER})]
    assert [r.status_code for r in bad] == [400, 400, 400]
    bad_ids = [bad[0].headers["x-request-id"], bad[1].headers["x-request-id"], bad[2].headers["request-id"]]
    assert [i.split("-")[0].split("_")[0] for i in bad_ids] == ["chatcmpl", "resp", "msg"]
    assert "x-request-id" not in bad[2].headers and "request-id" not in bad[0].headers
    errors = logs("error_reply")
    assert [(e["http"], e["id"]) for e in errors] == [(429, i) for i in busy_ids] + [(400, i) for i in bad_ids]
    assert len(set(busy_ids + bad_ids)) == 6 and not done_ids(logs)
    # no id before a front names the request: an unknown path
    resp = h.get("/v1/nothing")
    assert resp.status_code == 404 and "x-request-id" not in resp.headers and "request-id" not in resp.headers
    assert "id" not in logs("error_reply")[-1]


def test_an_error_inside_a_stream_has_the_stream_id(srv, logs):
    s, engine = srv
    engine.text, engine.error, engine.error_after = "</think>\n\nHello there friend", ("internal", "boom", None), 4
    resp = http(s.addr).post("/v1/responses", json={"input": "hi", "stream": True})
    evs = sse(resp.content)
    assert evs[-1][0] == "response.failed"
    assert resp.headers["x-request-id"] == evs[-1][1]["response"]["id"]


def test_the_request_log_names_the_id(srv, tmp_path):
    s, engine = srv
    log = RequestLog(str(tmp_path / "requests.jsonl"), 1 << 20)
    s.front.request_log = log
    try:
        h = http(s.addr)
        a = h.post("/v1/chat/completions", json=CHAT).headers["x-request-id"]
        b = h.post("/v1/responses", json={"input": "Hi?", "max_output_tokens": 8}).headers["x-request-id"]
        c = h.post("/v1/messages", json=MESSAGES).headers["request-id"]
        d = h.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "mine-1"}).headers["x-request-id"]
        log.flush()
    finally:
        s.front.request_log = None
        log.close()
    lines = [orjson.loads(x) for x in (tmp_path / "requests.jsonl").read_bytes().splitlines()]
    assert [(x["front"], x["id"]) for x in lines] == [("openai", a), ("responses", b), ("anthropic", c),
                                                      ("openai", "mine-1")]
    assert d == "mine-1" and lines[0]["body"] == CHAT


def test_a_valid_client_id_is_the_request_id(srv, logs):
    """A client's X-Request-Id of 1 to 128 printable ASCII characters is the request's id: echoed in the header, named
    by the done log line (quoted there when it holds a space or a quote); the body keeps the daemon's id, and the
    engine's key stays unique when two requests send the same id. Any other value is ignored."""
    s, engine = srv
    h = http(s.addr)
    mine = 'trace 42/"a=b"'
    r1 = h.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": mine})
    r2 = h.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": mine})
    assert r1.headers["x-request-id"] == r2.headers["x-request-id"] == mine
    body_ids = [r1.json()["id"], r2.json()["id"]]
    assert body_ids[0] != body_ids[1] and all(i.startswith("chatcmpl-") for i in body_ids)
    assert [q.rid for q in engine.submitted] == ["h:" + i for i in body_ids]
    assert done_ids(logs) == [mine, mine]
    m = h.post("/v1/messages", json=MESSAGES, headers={"x-request-id": "claude-7"})
    assert m.headers["request-id"] == "claude-7" and m.json()["id"].startswith("msg_")
    edge = "~" * 128
    resp = h.post("/v1/responses", json={"input": "Hi?", "max_output_tokens": 8}, headers={"X-Request-Id": edge})
    assert resp.headers["x-request-id"] == edge
    assert done_ids(logs)[-2:] == ["claude-7", edge]
    # ignored: too long, not ASCII, a control character, empty
    for value in ["x" * 129, "caf\u00e9".encode(), "a\tb", ""]:
        resp = h.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": value})
        assert resp.status_code == 200 and resp.headers["x-request-id"] == resp.json()["id"], value
        assert done_ids(logs)[-1] == resp.json()["id"]
    # a refusal names the client's id too
    resp = h.post("/v1/chat/completions", json={"messages": "hi"}, headers={"X-Request-Id": "bad-1"})
    assert resp.status_code == 400 and resp.headers["x-request-id"] == "bad-1"
    assert logs("error_reply")[-1]["id"] == "bad-1"
