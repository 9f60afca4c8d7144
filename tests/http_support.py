"""HTTP-front test support: the address a daemon's HTTP listener bound, clients for it (the official openai and
anthropic SDKs, and plain httpx), an SSE parser, and an in-process HttpFront over a scripted engine (canned model
output, exact and deterministic) served from a thread. (A plain module, like daemon_support.)"""
from __future__ import annotations

import asyncio
import re
import tempfile
import threading
import time
from pathlib import Path

import anthropic
import httpx2
import openai
import orjson

from ignisd.request import DoneEvent, ErrorEvent, FinishReason, ReuseInfo, TokenEvent

HTTP_KEY = "sk-ignis-test-key"   # the key of the http_llama_keyed daemon (tests/conftest.py)


def http_addr(d) -> str:
    """The address daemon `d` logged as its HTTP listener ("127.0.0.1:PORT" or "unix:/path")."""
    m = re.search(r"http_listening addr=(\S+)", d.log())
    assert m, d.log()
    return m[1]


def _split(addr: str) -> tuple[str, httpx2.HTTPTransport | None]:
    if addr.startswith("unix:"):
        return "http://ignis", httpx2.HTTPTransport(uds=addr[len("unix:"):])
    return f"http://{addr}", None


def http(addr: str, timeout: float = 120.0) -> httpx2.Client:
    """A plain HTTP client whose base URL is the daemon's root."""
    base, transport = _split(addr)
    return httpx2.Client(base_url=base, transport=transport, timeout=timeout)


def openai_client(addr: str, key: str = "none") -> openai.OpenAI:
    """The official OpenAI SDK pointed at the daemon (no retries)."""
    base, transport = _split(addr)
    hc = httpx2.Client(transport=transport, timeout=120) if transport else None
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, http_client=hc)


def anthropic_client(addr: str, key: str = "none") -> anthropic.Anthropic:
    """The official Anthropic SDK pointed at the daemon (no retries)."""
    base, transport = _split(addr)
    hc = httpx2.Client(transport=transport, timeout=120) if transport else None
    return anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, http_client=hc)


def status(d, key: str | None = None) -> dict:
    """The `status` op of daemon `d` over its socket (with `key` when it has one)."""
    c = d.conn()
    try:
        return c.request({"id": "st", "op": "status", **({"api_key": key} if key else {})})["result"]
    finally:
        c.close()


def wait_idle(d, key: str | None = None, timeout: float = 60.0) -> dict:
    """Wait until daemon `d` runs and queues nothing and holds no live page (as DaemonProc.wait_idle, with a key)."""
    deadline = time.monotonic() + timeout
    while True:
        st = status(d, key)
        kv = st["kv_pool"]
        if not st["requests"] and kv["pages_live"] == 0 and kv["pages_free"] + kv["pages_retained"] == \
                kv["pages_total"]:
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"daemon did not return to idle: {st}")
        time.sleep(0.05)


def done_line(d, rid: str) -> dict:
    """The fields of daemon `d`'s `done` log line for request `rid` (waits up to 30 s for it)."""
    deadline = time.monotonic() + 30
    while True:
        for line in d.log().splitlines():
            if " done " in line and f" id={rid} " in line:
                return dict(kv.split("=", 1) for kv in line.split()[3:] if "=" in kv)
        if time.monotonic() > deadline:
            raise AssertionError(f"no done line for {rid}:\n{d.log()[-3000:]}")
        time.sleep(0.05)


def sse(raw: bytes | str) -> list[tuple[str | None, object]]:
    """Server-sent events as (event name or None, decoded data); `data: [DONE]` stays the string "[DONE]"."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    out = []
    for frame in text.split("\n\n"):
        if not frame.strip():
            continue
        name, data = None, []
        for line in frame.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if not data:            # a comment frame (": keepalive"): no event, as the SSE format says
            continue
        payload = "\n".join(data)
        out.append((name, payload if payload == "[DONE]" else orjson.loads(payload)))
    return out


class ScriptedEngine:
    """Answers every submit with the token ids of `text` (set per test), then a DoneEvent whose cached_tokens are
    `cached` (or `error` = (code, message, field) instead). Records submits and cancels."""

    def __init__(self, tok):
        self.tok = tok
        self.text, self.cached, self.error, self.finish = "", 0, None, FinishReason.STOP
        self.error_after: int | None = None   # tokens sent before `error` (None: the error comes first)
        self.delay_s = 0.0                     # seconds before the first event (a long prefill)
        self.submitted, self.cancels = [], []

    def submit(self, req):
        self.submitted.append(req)
        q = asyncio.Queue()
        ids = self.tok.encode(self.text)
        if self.error:
            events = [TokenEvent(req.rid, t) for t in ids[:self.error_after or 0]]
            events.append(ErrorEvent(req.rid, *self.error))
        else:
            events = [TokenEvent(req.rid, t) for t in ids]
            n = len(req.prompt_ids)
            reuse = ReuseInfo(tier="device", kind="checkpoint", cached_tokens=self.cached, reason=None) \
                if self.cached else ReuseInfo()
            events.append(DoneEvent(req.rid, self.finish, n, self.cached, n - self.cached, len(ids), 0.5, 2.0, 100.0,
                                    50.0, reuse=reuse))
        if self.delay_s:
            asyncio.get_running_loop().call_later(self.delay_s, lambda: [q.put_nowait(e) for e in events])
        else:
            for e in events:
                q.put_nowait(e)
        return q

    def cancel(self, rid, reason=FinishReason.CANCELLED):
        self.cancels.append((rid, reason))
        return True

    def status(self):
        return {"lanes": {}, "queue": {}, "kv_pool": {}, "slots": {}, "tiers": [], "retained": [], "requests": [],
                "live_states": {}}

    def reset(self):
        return 0


class InProcess:
    """An HttpFront served on a Unix socket from a thread with its own event loop; `addr` is "unix:/path" (or, with
    `listen` "HOST:PORT", the TCP address it bound: a browser needs one)."""

    def __init__(self, edge=None, api_key: str | None = None, strip_billing_header: bool = True,
                 max_body_bytes: int = 16 * 2**20, listen: str | None = None):
        from ignisd.fronts.http import HttpFront
        self.dir = Path(tempfile.mkdtemp(prefix="ignis-http-"))
        self.addr = f"unix:{self.dir / 'http.sock'}"
        self.front = HttpFront(api_key=api_key, strip_billing_header=strip_billing_header,
                               max_body_bytes=max_body_bytes)
        if edge is not None:
            self.front.attach(edge)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        bound = self.call(self.front.start(listen or self.addr))
        if listen:
            self.addr = bound

    def call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.call(self.front.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
