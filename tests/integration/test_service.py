"""ignisd as a workstation service, end to end on the tiny random Llama (issue 13): sd_notify on a fake NOTIFY_SOCKET
(READY=1, WATCHDOG=1 pings, STOPPING=1), journald lines, the HTTP metrics listener, socket activation (LISTEN_FDS),
the API key and the socket's mode and group, graceful and forced shutdown, SIGHUP and idle unload."""
from __future__ import annotations

import grp
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from daemon_support import DaemonProc, RawConn
from ignisd.log import parse_line

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--model-context-tokens", "512", "--lanes", "2"]


def tmpdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="ignis-svc-", dir="/tmp"))


def chat(rid: str, **kw) -> dict:
    return {"id": rid, "op": "chat", "messages": [{"role": "user", "content": "Say something."}],
            "temperature": 0, **kw}


def wait_for(pred, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (v := pred()):
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def names(text: str) -> set[str]:
    return {s.name for fam in text_string_to_metric_families(text) for s in fam.samples}


class NotifyListener:
    """A datagram socket standing in for systemd's NOTIFY_SOCKET; collects (monotonic time, message)."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._run = True
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while self._run:
            try:
                self.messages.append((time.monotonic(), self.sock.recv(4096).decode()))
            except TimeoutError:
                pass

    def first(self, prefix: str) -> float:
        return next(t for t, m in self.messages if m.startswith(prefix))

    def close(self):
        self._run = False
        self.thread.join()
        self.sock.close()


@pytest.fixture(scope="module")
def service(tiny_llama_dir):
    """One daemon under a fake systemd: NOTIFY_SOCKET with a 1 s watchdog, stderr as the journal stream, and a
    metrics listener on a free port."""
    d = tmpdir()
    notify = NotifyListener(d / "notify")
    log = d / "ignisd.log"
    log.touch()
    st = os.stat(log)     # DaemonProc truncates this same file: its device and inode are the journal stream's
    env = {"NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "1000000", "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
    proc = DaemonProc(["--model", str(tiny_llama_dir), *BASE, "--vram-kv-pool-bytes", "2Ktok",
                       "--server-metrics-listen", "127.0.0.1:0"], d, env=env)
    yield proc, notify
    proc.stop()
    notify.close()


def test_notify_ready_after_load_then_watchdog_pings_from_the_loop(service):
    proc, notify = service
    c = proc.conn()
    done = c.request(chat("n1", max_tokens=4))
    assert done["type"] == "done"
    c.close()
    time.sleep(2.2)
    msgs = [m for _, m in notify.messages]
    assert any(m.startswith("STATUS=loading") for m in msgs)
    ready = notify.first("READY=1")
    assert notify.first("STATUS=loading") < ready
    pings = [t for t, m in notify.messages if m == "WATCHDOG=1" and t > ready]
    assert len(pings) >= 3, msgs
    gaps = [b - a for a, b in zip(pings, pings[1:])]
    assert max(gaps) < 1.0                    # every half timeout or so, never a whole timeout apart
    assert not any(m.startswith("STOPPING=1") for m in msgs)


def test_journal_lines_carry_priorities_no_timestamps_and_the_done_line_parses_back(service):
    proc, _ = service
    c = proc.conn()
    done = c.request(chat("journal-1", max_tokens=3))
    c.close()
    lines = wait_for(lambda: [ln for ln in proc.log().splitlines() if " done id=journal-1 " in ln] and
                     proc.log().splitlines(), what="the done line")
    assert lines and all(re.match(r"<[0-7]>[A-Z]+ ", ln) for ln in lines), lines
    assert not any(re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", ln) for ln in lines)
    row = parse_line(next(ln for ln in lines if " done id=journal-1 " in ln))
    assert (row.priority, row.component, row.event) == (6, "srv", "done")
    assert row.fields["id"] == "journal-1" and row.fields["prompt"] == done["usage"]["prompt_tokens"]
    assert row.fields["generated"] == done["usage"]["completion_tokens"] and row.fields["finish"] == "length"
    assert set(row.fields) >= {"cached", "prefilled", "tier", "kind", "ttft_ms", "tok_s"}


def test_ignis_metrics_and_the_http_listener_serve_the_same_names(service):
    proc, _ = service
    addr = re.search(r"metrics_listening address=(\S+)", proc.log()).group(1)
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        http = r.read().decode()
    r = subprocess.run([sys.executable, "-m", "ignis_client.cli", "metrics", "--socket", proc.socket],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert names(r.stdout) == names(http)
    for name in ("ignis_requests_running", "ignis_requests_waiting", "ignis_kv_usage_ratio",
                 "ignis_prefix_cache_query_tokens_total", "ignis_prefix_cache_hit_tokens_total",
                 "ignis_prompt_tokens_total", "ignis_generation_tokens_total", "ignis_ttft_seconds_bucket",
                 "ignis_inter_token_seconds_bucket", "ignis_preemptions_total", "ignis_model_loaded"):
        assert name in names(http), name
    gen = next(s.value for f in text_string_to_metric_families(http) for s in f.samples
               if s.name == "ignis_generation_tokens_total")
    assert gen >= 7           # the two requests above (4 + 3 tokens); the warm-up is not counted


def test_stopping_is_notified_last(service):
    proc, notify = service
    assert proc.stop() == 0
    time.sleep(0.3)
    msgs = [m for _, m in notify.messages]
    assert msgs[-1].startswith("STOPPING=1") or any(m.startswith("STOPPING=1") for m in msgs[-3:]), msgs[-5:]
    assert notify.first("READY=1") < notify.first("STOPPING=1")


def test_socket_activation_serves_a_chat_on_the_passed_socket(tiny_llama_dir):
    d = tmpdir()
    path = d / "activated.sock"
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(str(path))
    lsock.listen()
    fd = lsock.fileno()
    wrapper = ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh", sys.executable, "-m", "ignisd", "serve"]
    proc = DaemonProc(["--model", str(tiny_llama_dir), *BASE, "--vram-kv-pool-bytes", "2Ktok"], d,
                      env={"LISTEN_FDS": "1", "LISTEN_FDNAMES": "ndjson"}, command=wrapper,
                      popen={"preexec_fn": lambda: os.dup2(fd, 3), "pass_fds": (3,)}, socket=str(path))
    try:
        c = RawConn(str(path))
        deltas, done = c.until_done(c.send(chat("act", max_tokens=5, stream=True)) or "act")
        assert done["type"] == "done" and done["usage"]["completion_tokens"] == 5 and deltas
        c.close()
        assert f"listening socket={path}" in proc.log() and "inherited=true" in proc.log()
        assert not (d / "ignisd.sock").exists()          # the --socket path was never bound
    finally:
        assert proc.stop() == 0
        lsock.close()
    assert path.is_socket()                               # the passed socket belongs to systemd: left in place


def test_socket_activation_serves_the_http_front_on_its_named_socket(tiny_llama_dir):
    """Two passed sockets, named by LISTEN_FDNAMES: the NDJSON socket and the HTTP front (FileDescriptorName=http)."""
    import json as _json
    d = tmpdir()
    nd, hp = d / "ndjson.sock", d / "http.sock"
    socks = []
    for p in (nd, hp):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(p))
        s.listen()
        socks.append(s)
    fds = [s.fileno() for s in socks]

    def place() -> None:
        os.dup2(fds[0], 3)
        os.dup2(fds[1], 4)
    wrapper = ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh", sys.executable, "-m", "ignisd", "serve"]
    proc = DaemonProc(["--model", str(tiny_llama_dir), *BASE, "--vram-kv-pool-bytes", "2Ktok"], d,
                      env={"LISTEN_FDS": "2", "LISTEN_FDNAMES": "ndjson:http"}, command=wrapper,
                      popen={"preexec_fn": place, "pass_fds": (3, 4)}, socket=str(nd))
    try:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.settimeout(60)
        c.connect(str(hp))
        body = _json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                            "temperature": 0}).encode()
        c.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: ignis\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        raw = b""
        while chunk := c.recv(65536):
            raw += chunk
        head, _, payload = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), raw[:300]
        reply = _json.loads(payload)
        assert reply["usage"]["completion_tokens"] == 3 and reply["choices"][0]["message"]["role"] == "assistant"
        assert "inherited_socket_unused" not in proc.log()
    finally:
        assert proc.stop() == 0
        for s in socks:
            s.close()


@pytest.fixture(scope="module")
def guarded(tiny_llama_dir):
    d = tmpdir()
    key = d / "key"
    key.write_text("sekrit-key-123\n")
    other = next(g for g in grp.getgrall() if g.gr_gid != os.getgid())
    proc = DaemonProc(["--model", str(tiny_llama_dir), *BASE, "--vram-kv-pool-bytes", "2Ktok",
                       "--server-api-key-file", str(key), "--server-socket-mode", "0660",
                       "--server-socket-group", other.gr_name], d)
    yield proc, key, other
    proc.stop()


def test_the_api_key_is_required_and_a_refusal_reveals_nothing(guarded):
    proc, key, _ = guarded
    c = proc.conn()
    assert c.request({"id": "h", "op": "health"})["result"]["ok"] is True      # health needs no key
    missing = c.request({"id": "s1", "op": "status"})
    wrong = c.request({"id": "s2", "op": "status", "api_key": "sekrit-key-124"})
    almost = c.request(chat("c1", api_key="sekrit-key-12"))
    for r, rid in ((missing, "s1"), (wrong, "s2"), (almost, "c1")):
        assert r["type"] == "error" and r["id"] == rid
        assert r["error"] == {"code": "auth", "message": "missing or wrong api_key", "field": "api_key"}
    ok = c.request(chat("c2", max_tokens=2, api_key="sekrit-key-123"))
    assert ok["type"] == "done" and ok["usage"]["completion_tokens"] == 2
    c.close()
    assert "sekrit" not in proc.log()


def test_socket_mode_and_group_widen_access(guarded):
    proc, _, other = guarded
    st = os.stat(proc.socket)
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == other.gr_gid


def test_ignis_status_draws_the_bars_of_the_daemon(guarded):
    proc, key, _ = guarded
    r = subprocess.run([sys.executable, "-m", "ignis_client.cli", "status", "--socket", proc.socket,
                        "--api-key-file", str(key)], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ignisd    ") and "ready" in lines[0]
    assert re.fullmatch(r"KV pool   \[\.{32}\] 0 B used of 1\.50 MiB, 1\.50 MiB free", lines[1]), lines[1]
    assert lines[2].startswith("          0 live + 0 retained of 32 pages")
    assert "lanes     [" in r.stdout and "0 of 2 busy" in r.stdout and "queue     0 waiting" in r.stdout


def test_graceful_shutdown_lets_running_requests_finish(tiny_llama_dir):
    proc = DaemonProc(["--model", str(tiny_llama_dir), *BASE, "--vram-kv-pool-bytes", "2Ktok",
                       "--server-shutdown-grace-s", "30"], tmpdir())
    c = proc.conn()
    c.send(chat("g", max_tokens=60, stream=True))
    assert c.recv()["type"] == "delta"
    proc.proc.send_signal(signal.SIGTERM)
    deltas, done = c.until_done("g")
    assert done["type"] == "done" and done["finish_reason"] == "length"          # finished, not cancelled
    assert done["usage"]["completion_tokens"] == 60
    assert proc.proc.wait(30) == 0
    assert not Path(proc.socket).exists()
    log = proc.log()
    assert "stopping running=1" in log and "stopped forced=false" in log and "shutdown_cancel" not in log


def test_a_second_sigterm_exits_at_once(tiny_llama_dir):
    proc = DaemonProc(["--model", str(tiny_llama_dir), "--model-context-tokens", "2048", "--lanes", "1",
                       "--vram-kv-pool-bytes", "2Ktok", "--server-shutdown-grace-s", "120"], tmpdir())
    c = proc.conn()
    c.send(chat("f", max_tokens=1990, stream=True))
    assert c.recv()["type"] == "delta"
    proc.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert proc.proc.poll() is None                       # the first one waits for the request (grace 120 s)
    assert c.recv()["type"] == "delta"                    # ...which still generates
    t0 = time.monotonic()
    proc.proc.send_signal(signal.SIGTERM)
    deltas, done = c.until_done("f")
    assert done["finish_reason"] == "cancelled" and done["usage"]["completion_tokens"] < 1990
    assert proc.proc.wait(10) == 0 and time.monotonic() - t0 < 5
    assert not Path(proc.socket).exists()
    assert "shutdown_cancel" in proc.log()


def test_sighup_applies_some_keys_at_once_and_reloads_for_the_others(tiny_llama_dir):
    d = tmpdir()
    cfg = d / "ignisd.toml"

    def write(**server):
        body = {"socket_mode": '"0600"', "default_max_tokens": "3", **server}
        kv = server.pop("kv", '"2Ktok"')
        cfg.write_text("[vram]\nkv_pool_bytes = " + kv + "\n[server]\n"
                       + "".join(f"{k} = {v}\n" for k, v in body.items() if k != "kv"))

    write()
    proc = DaemonProc(["--model", str(tiny_llama_dir), *BASE, "--config", str(cfg)], d)
    try:
        c = proc.conn()
        assert c.request(chat("a", max_tokens=5))["finish_reason"] == "length"   # greedy: 5 tokens, no stop
        assert c.request(chat("b"))["usage"]["completion_tokens"] == 3               # default_max_tokens 3

        def reload_line(n):
            return wait_for(lambda: len(re.findall(r"INFO srv reloaded ", proc.log())) >= n and
                            re.findall(r"INFO srv reload config=.*", proc.log())[n - 1], what=f"reload {n}")

        write(socket_mode='"0640"', default_max_tokens="5")
        proc.proc.send_signal(signal.SIGHUP)
        row = parse_line(reload_line(1))
        assert row.fields["applied_now"] == "server.default_max_tokens,server.socket_mode"
        assert row.fields["reloading"] is None and row.fields["restart_needed"] is None
        assert stat.S_IMODE(os.stat(proc.socket).st_mode) == 0o640
        assert c.request(chat("c"))["usage"]["completion_tokens"] == 5
        assert proc.status()["daemon"]["loads"] == 1                                # nothing reloaded

        c.send(chat("running", max_tokens=300, stream=True))
        assert c.recv()["type"] == "delta"
        write(socket_mode='"0640"', default_max_tokens="5", kv='"4Ktok"', metrics_listen='"127.0.0.1:0"')
        proc.proc.send_signal(signal.SIGHUP)
        row = parse_line(reload_line(2))
        assert row.fields["reloading"] == "vram.kv_pool_bytes"
        assert row.fields["restart_needed"] == "server.metrics_listen"
        _, done = c.until_done("running")
        assert done["finish_reason"] == "length" and done["usage"]["completion_tokens"] == 300   # drained
        st = wait_for(lambda: (s := proc.status())["daemon"]["loads"] == 2 and s, what="the reload")
        assert st["kv_pool"]["pages_total"] == 64 and st["daemon"]["state"] == "ready"
        assert c.request(chat("d", max_tokens=2))["type"] == "done"
        assert "metrics_listening" not in proc.log()                                # listeners wait for a restart

        cfg.write_text("[server]\nlanes = \"many\"\n")
        proc.proc.send_signal(signal.SIGHUP)
        wait_for(lambda: "reload_refused" in proc.log(), what="the refusal")
        assert "server.lanes" in proc.log().split("reload_refused")[1].splitlines()[0]
        assert c.request(chat("e", max_tokens=2))["type"] == "done"                  # still serving as before
        c.close()
    finally:
        assert proc.stop() == 0


def test_idle_unload_frees_the_model_and_the_next_request_waits_for_the_load(tiny_llama_dir):
    proc = DaemonProc(["--model", str(tiny_llama_dir), *BASE, "--vram-kv-pool-bytes", "2Ktok",
                       "--server-idle-unload-s", "1"], tmpdir())
    try:
        c = proc.conn()
        first = c.request(chat("warm", max_tokens=3))
        assert first["timings"]["load_ms"] == 0
        h = wait_for(lambda: (r := c.request({"id": "h", "op": "health"})["result"])["state"] == "unloaded" and r,
                     timeout=20, what="the idle unload")
        assert h["ok"] is True and h["reason"] is None
        st = proc.status()
        assert st["daemon"]["state"] == "unloaded" and st["kv_pool"]["pages_total"] == 0
        assert "unloaded reason=\"idle for 1 s\"" in proc.log()
        again = c.request(chat("cold", max_tokens=3))
        assert again["type"] == "done" and again["usage"]["completion_tokens"] == 3
        assert again["timings"]["load_ms"] > 0
        assert again["text"] == first["text"]                                       # the same model again
        assert proc.status()["daemon"]["loads"] == 2 and "load reason=request" in proc.log()
        c.close()
    finally:
        assert proc.stop() == 0
