"""``Client``: the blocking ignisd client over its Unix socket (one connection, replies matched to requests by id).

Standard library + orjson only (no torch). Re-exported by ``ignis_client.client``.
"""
from __future__ import annotations

import socket
from collections import deque
from typing import Any, Iterator

from .framing import TERMINAL, ReplyTimeout, _Base, _messages, _raise_error, _terminal
from .protocol import DEFAULT_MAX_LINE_BYTES


class Client(_Base):
    """Blocking client. socket_path: default protocol.resolve_socket_path(); timeout: seconds for the connect and
    for each socket read (None: wait forever; a read past it raises ReplyTimeout, a TimeoutError); api_key: sent with
    every op but health. Not thread-safe."""

    def __init__(self, socket_path: str | None = None, timeout: float | None = None, api_key: str | None = None,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES):
        super().__init__(socket_path, timeout, api_key, max_line_bytes)
        self._sock: socket.socket | None = None
        self._buf = bytearray()
        self._queues: dict[str, deque] = {}      # in-flight id → events not yet consumed
        self._answered: set[str] = set()         # in-flight ids that got at least one event
        self._discard: set[str] = set()          # abandoned ids whose remaining events are dropped

    def connect(self) -> None:
        """Open the connection now (otherwise the first request does). Raises DaemonNotRunning."""
        if self._sock is not None:
            return
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        try:
            s.connect(self.socket_path)
        except OSError as e:
            s.close()
            raise self._connect_error(e) from None
        self._sock, self._buf = s, bytearray()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._queues.clear()
        self._answered.clear()
        self._discard.clear()

    def __enter__(self) -> "Client":
        self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _send(self, op: str, fields: dict) -> str:
        rid, line = self._body(op, fields)
        self.connect()
        self._queues[rid] = deque()
        try:
            self._sock.sendall(line)
        except OSError:
            self._queues.pop(rid, None)
            self.close()
            raise
        return rid

    def _read_line(self) -> bytes:
        while True:
            i = self._buf.find(b"\n")
            if i >= 0:
                line = bytes(self._buf[:i])
                del self._buf[:i + 1]
                return line
            try:
                chunk = self._sock.recv(1 << 16)
            except TimeoutError:
                raise ReplyTimeout(self.timeout) from None
            if not chunk:
                self.close()
                raise ConnectionError("ignisd closed the connection")
            self._buf += chunk

    def _next_event(self, rid: str) -> dict:
        q = self._queues[rid]
        while not q:
            ev = self._decode(self._read_line())
            target = ev.get("id")
            if target is None and ev.get("type") == "error":
                for r in [r for r in self._queues if r not in self._answered]:
                    self._queues[r].append(ev)     # an unparsed line: it can only be a request with no reply yet
            elif target in self._discard:
                if ev.get("type") in TERMINAL:
                    self._discard.discard(target)
            elif target in self._queues:
                self._queues[target].append(ev)
                self._answered.add(target)
        return q.popleft()

    def _finish(self, rid: str) -> None:
        self._queues.pop(rid, None)
        self._answered.discard(rid)

    def request(self, op: str, /, **fields: Any) -> dict:
        """Send one request and return its terminal reply (``done`` or ``result``; deltas are skipped).
        Raises IgnisError on an ``error`` reply."""
        rid = self._send(op, fields)
        try:
            while True:
                ev = self._next_event(rid)
                if _terminal(ev):
                    return ev
        finally:
            self._finish(rid)

    def stream(self, op: str, /, **fields: Any) -> Iterator[dict]:
        """Send a generating request with stream=true and iterate its events (deltas, then done). Closing the
        iterator early cancels the request."""
        rid = self._send(op, {**fields, "stream": True})
        return self._iterate(rid)

    def _iterate(self, rid: str) -> Iterator[dict]:
        finished = False
        try:
            while True:
                ev = self._next_event(rid)
                kind = ev.get("type")
                if kind in TERMINAL:
                    finished = True
                if kind == "error":
                    _raise_error(ev)
                yield ev
                if finished:
                    return
        finally:
            self._finish(rid)
            if not finished and self._sock is not None:
                self._discard.add(rid)
                try:
                    self._discard.add(self._send("cancel", {"target": rid}))
                except OSError:
                    pass

    def chat(self, messages: list[dict] | str, stream: bool = False, **fields: Any) -> dict | Iterator[dict]:
        """A chat completion (a str is one user message). stream=False: the done dict; True: an event iterator."""
        if stream:
            return self.stream("chat", messages=_messages(messages), **fields)
        return self.request("chat", messages=_messages(messages), stream=False, **fields)

    def completion(self, prompt: str | list[int], stream: bool = False, **fields: Any) -> dict | Iterator[dict]:
        """A text completion of prompt (text or token ids); same return as chat()."""
        if stream:
            return self.stream("completion", prompt=prompt, **fields)
        return self.request("completion", prompt=prompt, stream=False, **fields)

    def tokenize(self, text: str | None = None, messages: list[dict] | None = None, **fields: Any) -> dict:
        """{"tokens", "offsets", "text", ...} for text or a chat body (messages + tools, chat_template_kwargs)."""
        return self.request("tokenize", text=text, messages=messages, **fields)["result"]

    def detokenize(self, tokens: list[int]) -> dict:
        return self.request("detokenize", tokens=tokens)["result"]

    def status(self) -> dict:
        return self.request("status")["result"]

    def metrics(self) -> dict:
        """{"text": Prometheus exposition}."""
        return self.request("metrics")["result"]

    def health(self) -> dict:
        return self.request("health")["result"]

    def cancel(self, target: str) -> dict:
        """{"cancelled": bool}; the target request then ends with finish_reason "cancelled"."""
        return self.request("cancel", target=target)["result"]

    def reset(self) -> dict:
        """{"dropped": n}: drops retained states."""
        return self.request("reset")["result"]
