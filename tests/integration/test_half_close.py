"""End of input is not a disconnect: a client that sends its requests and shuts its write side (`shutdown(SHUT_WR)`,
what `nc -N` does) gets every reply, then the daemon closes the connection. A client that closes the socket, before
or after shutting its write side, still cancels what it had in flight."""
import re
import socket
import time

import orjson
import pytest


def _chat(rid, **kw):
    return {"id": rid, "op": "chat", "messages": [{"role": "user", "content": "Hello there"}], "temperature": 0, **kw}


def _send_then_half_close(d, data: bytes) -> list[dict]:
    """Send `data`, shut the write side, read until the daemon closes; every reply line ends with a newline."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(120)
    s.connect(d.socket)
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    buf = b""
    while True:
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
    s.close()
    assert buf.endswith(b"\n"), buf[-200:]
    return [orjson.loads(line) for line in buf.split(b"\n")[:-1]]


def _line(obj: dict) -> bytes:
    return orjson.dumps(obj) + b"\n"


@pytest.mark.parametrize("stream", [False, True])
def test_chat_then_half_close_is_answered(tiny_daemon, stream):
    replies = _send_then_half_close(tiny_daemon, _line(_chat("hc", max_tokens=12, stream=stream)))
    done = replies[-1]
    assert done["id"] == "hc" and done["type"] == "done", replies
    assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 12
    deltas = replies[:-1]
    assert all(r["type"] == "delta" and r["id"] == "hc" for r in deltas)
    assert bool(deltas) == stream
    if stream:
        assert "".join(r["text"] for r in deltas) == done["text"]
    tiny_daemon.wait_idle()


@pytest.mark.parametrize("stream", [False, True])
def test_completion_then_half_close_is_answered(tiny_daemon, stream):
    req = {"id": "hcc", "op": "completion", "prompt": "The capital of France is", "max_tokens": 9,
           "temperature": 0, "stream": stream}
    replies = _send_then_half_close(tiny_daemon, _line(req))
    assert replies[-1]["type"] == "done" and replies[-1]["usage"]["completion_tokens"] == 9, replies
    if stream:
        assert "".join(r["text"] for r in replies[:-1]) == replies[-1]["text"]
    tiny_daemon.wait_idle()


def test_last_line_without_newline_then_half_close_is_answered(tiny_daemon):
    replies = _send_then_half_close(tiny_daemon, orjson.dumps(_chat("nonl", max_tokens=7)))
    assert [r["type"] for r in replies] == ["done"] and replies[0]["id"] == "nonl", replies
    assert replies[0]["usage"]["completion_tokens"] == 7
    tiny_daemon.wait_idle()


def test_pipelined_requests_then_half_close_are_all_answered(tiny_daemon):
    data = (_line(_chat("p1", max_tokens=20, stream=True))
            + _line({"id": "p2", "op": "completion", "prompt": [1, 2, 3, 4], "max_tokens": 6, "temperature": 0})
            + _line({"id": "p3", "op": "tokenize", "text": "hello"})
            + orjson.dumps({"id": "p4", "op": "health"}))
    replies = _send_then_half_close(tiny_daemon, data)
    finals = {r["id"]: r for r in replies if r["type"] != "delta"}
    assert set(finals) == {"p1", "p2", "p3", "p4"}, replies
    assert finals["p1"]["type"] == "done" and finals["p1"]["usage"]["completion_tokens"] == 20
    assert finals["p2"]["type"] == "done" and finals["p2"]["usage"]["completion_tokens"] == 6
    assert finals["p3"]["result"]["text"] == "hello" and finals["p4"]["result"]["ok"] is True
    assert "".join(r["text"] for r in replies if r["type"] == "delta") == finals["p1"]["text"]
    tiny_daemon.wait_idle()


def _finishes(d, prefix: str) -> dict[str, str]:
    """finish_reason of every `done` log line whose id starts with `prefix`."""
    return dict(re.findall(rf"\bdone id=({re.escape(prefix)}\S*) .*?finish=(\w+)", d.log()))


@pytest.fixture(scope="module")
def one_lane(start_module_daemon, tiny_llama_dir):
    """One lane, so queued requests wait: cancelling them is seen in how they finish."""
    return start_module_daemon(["--model", str(tiny_llama_dir), "--lanes", "1", "--model-context-tokens", "1024",
                               "--vram-kv-pool-bytes", "1Ktok", "--server-max-queue", "8"])


@pytest.mark.parametrize("half_close_first", [False, True])
def test_closed_socket_still_cancels(one_lane, half_close_first):
    """Four long non-streaming requests (about 3 s of work on one lane); the client closes the socket (after a
    half-close and a short wait, or at once): no request runs to its length, each ends cancelled or never starts."""
    prefix = f"gone{int(half_close_first)}-"
    c = one_lane.conn()
    c.send_raw(b"".join(_line(_chat(f"{prefix}{i}", max_tokens=900)) for i in range(4)))
    if half_close_first:
        c.sock.shutdown(socket.SHUT_WR)
        time.sleep(0.2)
    c.close()
    one_lane.wait_idle()
    time.sleep(0.5)   # the done lines are logged just after the engine lets the requests go
    finishes = _finishes(one_lane, prefix)
    assert "length" not in finishes.values(), finishes
    assert all(f == "cancelled" for f in finishes.values()), finishes
