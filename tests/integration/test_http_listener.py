"""The HTTP listener of a real daemon: it answers before the model is loaded (/health 503, requests 503), then 200;
an address it cannot bind stops the start (exit 2, server.http_listen named); the Unix-socket listener takes the
socket's mode; /metrics serves the `metrics` op's text."""
from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time

import httpx2
import pytest
from daemon_support import ROOT, DaemonProc
from http_support import http, http_addr


@pytest.mark.smollm
def test_health_answers_503_while_the_model_loads(tmp_path):
    """The built-in SmolLM2 GGUF takes seconds to load: the listener is up before, and says so."""
    path = tmp_path / "http.sock"
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("d", DaemonProc(
        ["--server-http-listen", f"unix:{path}", "--lanes", "2", "--vram-kv-pool-bytes", "4Ktok"], tmp_path)))
    t.start()
    seen, refused_chat = [], None
    client = httpx2.Client(transport=httpx2.HTTPTransport(uds=str(path)), timeout=5)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            try:
                r = client.get("http://ignis/health")
            except httpx2.TransportError:   # not listening yet
                time.sleep(0.01)
                continue
            seen.append((r.status_code, r.json()))
            if r.status_code == 200:
                break
            if refused_chat is None:
                refused_chat = client.post("http://ignis/v1/chat/completions",
                                           json={"messages": [{"role": "user", "content": "hi"}]})
            time.sleep(0.01)
        t.join(300)
        assert seen[0] == (503, {"status": "loading"}) and seen[-1] == (200, {"status": "ok"}), seen
        assert all(s == (503, {"status": "loading"}) for s in seen[:-1])
        assert refused_chat.status_code == 503 and refused_chat.json()["error"]["code"] == "unavailable"
    finally:
        t.join(300)
        if "d" in box:
            box["d"].stop()


def test_an_address_in_use_stops_the_start(tiny_llama_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        r = subprocess.run([sys.executable, "-m", "ignisd", "serve", "--model", str(tiny_llama_dir), "--socket",
                            str(tmp_path / "s.sock"), "--server-http-listen", f"127.0.0.1:{port}",
                            "--reuse-kv-host-pool-bytes", "32M"],
                           capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert r.returncode == 2, r.stderr
    assert f"server.http_listen 127.0.0.1:{port}: cannot listen" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "s.sock").exists()


def test_unix_listener_mode_and_metrics(http_llama):
    path = http_addr(http_llama)[len("unix:"):]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    h = http(http_addr(http_llama))
    h.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 1})
    r = h.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    c = http_llama.conn()
    op_text = c.request({"id": "m", "op": "metrics"})["result"]["text"]
    c.close()

    def names(text):
        return {ln.split("{")[0].split()[0] for ln in text.splitlines() if ln and not ln.startswith("#")}
    assert "ignis_requests_total" in names(r.text) and names(r.text) == names(op_text)
