"""Bad input over the socket: each gets the DESIGN §5 error naming the field, the daemon stays up, other requests
keep generating, and the pool returns to idle (integrity: every page free, no live holder)."""
import os
import socket
import stat
import subprocess
import sys

import pytest



def _chat(rid, content="Hello there", **kw):
    return {"id": rid, "op": "chat", "messages": [{"role": "user", "content": content}], "temperature": 0, **kw}


@pytest.mark.parametrize("line,code,field", [
    (b"{not json", "bad_json", None),
    (b"[1, 2, 3]", "bad_json", None),
    (b'{"id": "x", "op": "chat", "messages": "\xff\xfe"}', "bad_json", None),   # invalid UTF-8
    (b'{"id": "x", "op": "frobnicate"}', "unknown_op", "op"),
    (b'{"id": 5, "op": "health"}', "bad_request", "id"),
    (b'{"id": "x", "op": "chat", "messages": []}', "bad_request", "messages"),
    (b'{"id": "x", "op": "chat", "messages": [{"role": "wizard", "content": "hi"}]}', "bad_request",
     "messages[0].role"),
    (b'{"id": "x", "op": "chat", "messages": [{"role": "user", "content": 5}]}', "bad_request",
     "messages[0].content"),
    (b'{"id": "x", "op": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}',
     "bad_request", "max_tokens"),
    (b'{"id": "x", "op": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}',
     "bad_request", "max_tokens"),
    (b'{"id": "x", "op": "chat", "messages": [{"role": "user", "content": "hi"}], "temperature": -1}',
     "bad_request", "temperature"),
    (b'{"id": "x", "op": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000}',
     "context_length", "max_tokens"),
    # the prompt alone fills the 1,024-token context and no max_tokens was sent: the error names the prompt
    (b'{"id": "x", "op": "completion", "prompt": [' + b", ".join([b"5"] * 1024) + b']}', "context_length", "prompt"),
    (b'{"id": "x", "op": "chat", "messages": [{"role": "user", "content": "' + b"river " * 1100 + b'"}]}',
     "context_length", "messages"),
    # ... and with a max_tokens sent too: lowering it cannot help, so the prompt is still the field named
    (b'{"id": "x", "op": "chat", "messages": [{"role": "user", "content": "' + b"river " * 1100 + b'"}], '
     b'"max_tokens": 8}', "context_length", "messages"),
    (b'{"id": "x", "op": "completion", "prompt": [1, 2, 99999999]}', "bad_request", "prompt[2]"),
    (b'{"id": "x", "op": "completion", "prompt": "hi", "prompt_logprobs": 50}', "bad_request", "prompt_logprobs"),
    (b'{"id": "x", "op": "chat", "messages": [{"role": "user", "content": [{"type": "text", "text": "what?"}, '
     b'{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]}', "model_unsupported",
     "messages[0].content[1]"),
    (b'{"id": "x", "op": "chat", "messages": [{"role": "user", "content": [{"type": "image_url", '
     b'"image_url": {"url": 7}}]}]}', "bad_request", "messages[0].content[0].image_url.url"),
])
def test_bad_input_gets_named_error(tiny_daemon, line, code, field):
    c = tiny_daemon.conn()
    c.send_raw(line + b"\n")
    r = c.recv()
    assert r["type"] == "error", r
    assert r["error"]["code"] == code, r
    assert r["error"]["field"] == field, r
    assert r["error"]["message"]
    if code == "bad_request" and field:        # every bad_request message starts with the field it names
        assert r["error"]["message"].startswith(field + ": "), r
    # the connection is kept and the daemon still answers on it
    assert c.request({"id": "after", "op": "health"})["result"]["ok"] is True
    c.close()
    tiny_daemon.wait_idle()


def test_line_over_limit_is_too_long_and_connection_kept(start_daemon, tiny_llama_dir):
    d = start_daemon(["--model", str(tiny_llama_dir), "--server-max-line-bytes", "4K", "--model-context-tokens",
                      "512", "--vram-kv-pool-bytes", "1Ktok", "--lanes", "1", "--server-max-queue", "1"])
    c = d.conn()
    c.send_raw(b'{"id": "big", "op": "tokenize", "text": "' + b"a" * 10000 + b'"}\n')
    r = c.recv()
    assert r["type"] == "error" and r["error"]["code"] == "too_long" and r["id"] is None
    assert c.request({"id": "ok", "op": "tokenize", "text": "hello"})["type"] == "result"
    c.close()
    # an over-long last line with no newline, then EOF on the client's write side: still answered too_long
    c = d.conn()
    c.send_raw(b'{"id": "tail", "op": "tokenize", "text": "' + b"b" * 20000)
    c.sock.shutdown(socket.SHUT_WR)
    r = c.recv()
    assert r["type"] == "error" and r["error"]["code"] == "too_long"
    c.close()
    d.wait_idle()


def test_duplicate_inflight_id(tiny_daemon):
    c = tiny_daemon.conn()
    c.send(_chat("dup", max_tokens=200, stream=True))
    c.send(_chat("dup", max_tokens=5))
    errs = []
    while True:
        r = c.recv()
        if r["type"] == "error":
            errs.append(r)
        if r["type"] == "done":
            break
    assert len(errs) == 1 and errs[0]["error"]["code"] == "duplicate_id" and errs[0]["error"]["field"] == "id"
    assert errs[0]["error"]["message"] == 'id "dup" is already in flight on this connection'    # JSON's spelling
    c.close()
    tiny_daemon.wait_idle()


def test_cancel_ends_with_usage_so_far(tiny_daemon):
    c = tiny_daemon.conn()
    c.send(_chat("long", max_tokens=400, stream=True))
    first = c.recv()
    assert first["id"] == "long" and first["type"] == "delta"
    c.send({"id": "k", "op": "cancel", "target": "long"})
    got = {}
    while len(got) < 2:
        r = c.recv()
        if r["type"] in ("done", "result"):
            got[r["id"]] = r
    assert got["k"]["result"] == {"cancelled": True}
    done = got["long"]
    assert done["finish_reason"] == "cancelled"
    assert 1 <= done["usage"]["completion_tokens"] < 400
    assert c.request({"id": "k2", "op": "cancel", "target": "nope"})["result"] == {"cancelled": False}
    c.close()
    tiny_daemon.wait_idle()


def test_disconnect_cancels_and_frees_pages(tiny_daemon):
    c = tiny_daemon.conn()
    c.send(_chat("gone", max_tokens=500, stream=True))
    c.recv()
    c.close()
    tiny_daemon.wait_idle()


def test_busy_past_max_queue(start_daemon, tiny_llama_dir):
    d = start_daemon(["--model", str(tiny_llama_dir), "--lanes", "1", "--server-max-queue", "1",
                      "--model-context-tokens", "512", "--vram-kv-pool-bytes", "1Ktok"])
    c = d.conn()
    for i in range(4):
        c.send(_chat(f"r{i}", max_tokens=300))
    finals = {}
    while len(finals) < 4:
        r = c.recv()
        if r["type"] in ("done", "error"):
            finals[r["id"]] = r
    codes = sorted(r["error"]["code"] if r["type"] == "error" else "done" for r in finals.values())
    # one running, one waiting, the rest refused
    assert codes == ["busy", "busy", "done", "done"], finals
    c.close()
    d.wait_idle()


def test_other_requests_keep_generating_through_bad_input(tiny_daemon):
    good = tiny_daemon.conn()
    good.send(_chat("g", max_tokens=120, stream=True))
    good.recv()
    bad = tiny_daemon.conn()
    for junk in (b"\xff\xff\n", b"{}\n", b'{"id": "b", "op": "chat"}\n', b"null\n"):
        bad.send_raw(junk)
        assert bad.recv()["type"] == "error"
    bad.close()
    deltas, done = good.until_done("g")
    assert done["type"] == "done" and done["finish_reason"] in ("length", "stop")
    assert done["usage"]["completion_tokens"] >= 1
    good.close()
    tiny_daemon.wait_idle()


def test_socket_mode_and_second_daemon_refused(tiny_daemon, tiny_llama_dir):
    assert stat.S_IMODE(os.stat(tiny_daemon.socket).st_mode) == 0o600
    r = subprocess.run([sys.executable, "-m", "ignisd", "serve", "--model", str(tiny_llama_dir),
                        "--socket", tiny_daemon.socket], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "already serving" in r.stderr and tiny_daemon.socket in r.stderr
    assert tiny_daemon.status()["model"]["page_tokens"] == 64


@pytest.mark.parametrize("args,needle", [
    (["--server-lanes", "0"], "server.lanes"),
    (["--lanes", "many"], "server.lanes"),
    (["--vram-kv-pool-bytes", "12Q"], "vram.kv_pool_bytes"),
    (["--model-kv-format", "fp8"], "model.kv_format"),
    (["--server-no-such-key", "1"], "no-such-key"),
    (["--server-log-level", "loud"], "server.log_level"),
])
def test_config_errors_stop_the_start(args, needle, tmp_path):
    r = subprocess.run([sys.executable, "-m", "ignisd", "serve", "--socket", str(tmp_path / "s.sock"), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr, r.stderr


def test_config_file_error_names_key(tmp_path):
    cfg = tmp_path / "ignisd.toml"
    cfg.write_text('[server]\nprefill_chunk = "big"\n')
    r = subprocess.run([sys.executable, "-m", "ignisd", "serve", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "server.prefill_chunk" in r.stderr and "big" in r.stderr


def test_stale_socket_file_is_replaced(start_daemon, tiny_llama_dir, tmp_path):
    import socket as socketlib
    import tempfile
    from pathlib import Path

    from daemon_support import DaemonProc
    d = Path(tempfile.mkdtemp(prefix="ignis-stale-", dir="/tmp"))
    stale = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    stale.bind(str(d / "ignisd.sock"))          # a socket file nobody listens on (a crashed daemon's)
    stale.close()
    assert (d / "ignisd.sock").is_socket()
    proc = DaemonProc(["--model", str(tiny_llama_dir), "--model-context-tokens", "256",
                       "--vram-kv-pool-bytes", "512tok", "--lanes", "1"], d)
    try:
        assert proc.status()["kv_pool"]["pages_total"] == 8
    finally:
        assert proc.stop() == 0
    assert not (d / "ignisd.sock").exists()      # a clean stop removes the socket


def test_sigterm_mid_stream_ends_requests_cleanly(start_daemon, tiny_llama_dir):
    """SIGTERM gives running requests server.shutdown_grace_s, then cancels the rest: the client still gets its
    `done` (finish_reason cancelled) and the daemon exits 0 and removes its socket."""
    import signal
    from pathlib import Path
    d = start_daemon(["--model", str(tiny_llama_dir), "--model-context-tokens", "1024", "--vram-kv-pool-bytes",
                      "2Ktok", "--lanes", "2", "--server-shutdown-grace-s", "0.3"])
    c = d.conn()
    c.send(_chat("long", max_tokens=900, stream=True))
    assert c.recv()["type"] == "delta"
    d.proc.send_signal(signal.SIGTERM)
    deltas, done = c.until_done("long")
    assert done["type"] == "done" and done["finish_reason"] == "cancelled"
    assert 1 <= done["usage"]["completion_tokens"] < 900
    assert d.proc.wait(30) == 0
    assert not Path(d.socket).exists()
    log = d.log()
    assert "shutdown_cancel" in log and "Traceback" not in log


@pytest.mark.parametrize("args,code,needle", [
    (["--model", "/nonexistent/model.gguf"], 1, "model.path /nonexistent/model.gguf"),
    (["--model-kv-format", "q4_0"], 2, "model.kv_format"),
    (["--server-socket-group", "no-such-group-xyz"], 2, "server.socket_group"),
])
def test_startup_errors_are_one_clean_line(args, code, needle, tmp_path):
    r = subprocess.run([sys.executable, "-m", "ignisd", "serve", "--socket", str(tmp_path / "s.sock"), *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "s.sock").exists()
