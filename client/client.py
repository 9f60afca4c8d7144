"""Clients of ignisd over its Unix socket: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

Standard library + orjson only (no torch). One connection carries any number of in-flight requests; replies are
matched to requests by id. Generating ops return the ``done`` reply (or, with ``stream=True``, an iterator of
events that ends with ``done``); the other ops return their ``result`` object. An ``error`` reply raises
``IgnisError``; a daemon that is not listening raises ``DaemonNotRunning`` naming the socket path tried.
"""
from __future__ import annotations

import asyncio
import itertools
import secrets
import socket
from collections import deque
from typing import Any, AsyncIterator, Iterator

import orjson

from .protocol import DEFAULT_MAX_LINE_BYTES, encode, resolve_socket_path

TERMINAL = ("done", "result", "error")
_READ_LIMIT = 2**30   # replies (prompt_logprobs, status) can be large; requests are bounded by max_line_bytes


class IgnisError(Exception):
    """An ``error`` reply: code (protocol.ERROR_CODES), message, field (path such as ``messages[0].role``)."""

    def __init__(self, code: str, message: str, field: str | None = None, id: str | None = None):
        super().__init__(f"{code}: {message}" + (f" (field {field})" if field else ""))
        self.code, self.message, self.field, self.id = code, message, field, id


class DaemonNotRunning(ConnectionError):
    """Nothing listens on socket_path (missing file or connection refused)."""

    def __init__(self, socket_path: str, reason: str):
        super().__init__(f"no ignisd listening on {socket_path} ({reason})")
        self.socket_path = socket_path


def _raise_error(ev: dict) -> None:
    err = ev.get("error") or {}
    raise IgnisError(err.get("code", "internal"), err.get("message", ""), err.get("field"), ev.get("id"))


def _messages(messages: Any) -> Any:
    return [{"role": "user", "content": messages}] if isinstance(messages, str) else messages


class _Base:
    def __init__(self, socket_path: str | None, timeout: float | None, api_key: str | None, max_line_bytes: int):
        self.socket_path = socket_path or resolve_socket_path()
        self.timeout, self.api_key, self.max_line_bytes = timeout, api_key, max_line_bytes
        self._ids = (f"{secrets.token_hex(3)}-{n}" for n in itertools.count(1))

    def _body(self, op: str, fields: dict) -> tuple[str, bytes]:
        rid = next(self._ids)
        body = {"id": rid, "op": op, **{k: v for k, v in fields.items() if v is not None}}
        if self.api_key is not None and op != "health":
            body["api_key"] = self.api_key
        line = encode(body)
        if len(line) - 1 > self.max_line_bytes:
            raise IgnisError("too_long", f"request of {len(line) - 1} bytes exceeds max_line_bytes "
                                         f"({self.max_line_bytes})", None, rid)
        return rid, line

    @staticmethod
    def _decode(line: bytes) -> dict:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise ConnectionError(f"daemon sent invalid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ConnectionError("daemon sent a line that is not a JSON object")
        return obj

    def _connect_error(self, e: OSError) -> Exception:
        if isinstance(e, (FileNotFoundError, ConnectionRefusedError)):
            return DaemonNotRunning(self.socket_path, e.strerror or type(e).__name__)
        return e


class Client(_Base):
    """Blocking client. socket_path: default protocol.resolve_socket_path(); timeout: seconds per socket read
    (None: wait forever; exceeded: TimeoutError); api_key: sent with every op but health. Not thread-safe."""

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
            chunk = self._sock.recv(1 << 16)
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

    def request(self, op: str, **fields: Any) -> dict:
        """Send one request and return its terminal reply (``done`` or ``result``; deltas are skipped).
        Raises IgnisError on an ``error`` reply."""
        rid = self._send(op, fields)
        try:
            while True:
                ev = self._next_event(rid)
                if ev.get("type") == "error":
                    _raise_error(ev)
                if ev.get("type") in TERMINAL:
                    return ev
        finally:
            self._finish(rid)

    def stream(self, op: str, **fields: Any) -> Iterator[dict]:
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


class _Closed:
    def __init__(self, exc: BaseException):
        self.exc = exc


class AsyncClient(_Base):
    """asyncio client; same methods as Client as coroutines. ``chat(..., stream=True)`` and ``stream()`` return an
    AsyncEventStream (``async for ev in client.chat(m, stream=True)``; awaiting it also works). A background task
    reads the connection and routes replies by id, so requests may run concurrently on one connection."""

    def __init__(self, socket_path: str | None = None, timeout: float | None = None, api_key: str | None = None,
                 max_line_bytes: int = DEFAULT_MAX_LINE_BYTES):
        super().__init__(socket_path, timeout, api_key, max_line_bytes)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task | None = None
        self._queues: dict[str, asyncio.Queue] = {}
        self._answered: set[str] = set()
        self._lock: asyncio.Lock | None = None

    async def connect(self) -> None:
        """Open the connection now (otherwise the first request does). Raises DaemonNotRunning."""
        if self._writer is not None and self._task is not None and not self._task.done():
            return
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(self.socket_path, limit=_READ_LIMIT)
        except OSError as e:
            raise self._connect_error(e) from None
        self._lock = asyncio.Lock()
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        self._reader = self._writer = self._task = None

    async def __aenter__(self) -> "AsyncClient":
        await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _read_loop(self) -> None:
        exc: BaseException = ConnectionError("ignisd closed the connection")
        try:
            while True:
                line = await self._reader.readline()
                if not line:
                    break
                ev = self._decode(line.rstrip(b"\n"))
                target = ev.get("id")
                if target is None and ev.get("type") == "error":
                    for r in [r for r in self._queues if r not in self._answered]:
                        self._queues[r].put_nowait(ev)
                elif target in self._queues:
                    self._answered.add(target)
                    self._queues[target].put_nowait(ev)
        except asyncio.CancelledError:
            exc = ConnectionError("client closed")
            raise
        except Exception as e:            # noqa: BLE001 - every waiter must learn the connection is gone
            exc = e if isinstance(e, ConnectionError) else ConnectionError(f"connection failed: {e!r}")
        finally:
            for q in self._queues.values():
                q.put_nowait(_Closed(exc))
            if self._writer is not None:
                self._writer.close()
            self._writer = None

    async def _open(self, op: str, fields: dict) -> tuple[str, asyncio.Queue]:
        rid, line = self._body(op, fields)
        await self.connect()
        q: asyncio.Queue = asyncio.Queue()
        self._queues[rid] = q
        try:
            async with self._lock:
                self._writer.write(line)
                await self._writer.drain()
        except (OSError, AttributeError) as e:
            self._finish(rid)
            raise ConnectionError(f"cannot send to ignisd: {e!r}") from None
        return rid, q

    async def _get(self, q: asyncio.Queue) -> dict:
        ev = await asyncio.wait_for(q.get(), self.timeout) if self.timeout is not None else await q.get()
        if isinstance(ev, _Closed):
            raise ev.exc
        return ev

    def _finish(self, rid: str) -> None:
        self._queues.pop(rid, None)
        self._answered.discard(rid)

    async def request(self, op: str, **fields: Any) -> dict:
        """Send one request and return its terminal reply (``done`` or ``result``). Raises IgnisError."""
        rid, q = await self._open(op, fields)
        try:
            while True:
                ev = await self._get(q)
                if ev.get("type") == "error":
                    _raise_error(ev)
                if ev.get("type") in TERMINAL:
                    return ev
        finally:
            self._finish(rid)

    def stream(self, op: str, **fields: Any) -> "AsyncEventStream":
        """An AsyncEventStream over a generating request sent with stream=true."""
        return AsyncEventStream(self, op, {**fields, "stream": True})

    def chat(self, messages: list[dict] | str, stream: bool = False, **fields: Any):
        """stream=False: a coroutine giving the done dict; stream=True: an AsyncEventStream of events."""
        if stream:
            return self.stream("chat", messages=_messages(messages), **fields)
        return self.request("chat", messages=_messages(messages), stream=False, **fields)

    def completion(self, prompt: str | list[int], stream: bool = False, **fields: Any):
        """Like chat() for a text completion (prompt is text or token ids)."""
        if stream:
            return self.stream("completion", prompt=prompt, **fields)
        return self.request("completion", prompt=prompt, stream=False, **fields)

    async def tokenize(self, text: str | None = None, messages: list[dict] | None = None, **fields: Any) -> dict:
        return (await self.request("tokenize", text=text, messages=messages, **fields))["result"]

    async def detokenize(self, tokens: list[int]) -> dict:
        return (await self.request("detokenize", tokens=tokens))["result"]

    async def status(self) -> dict:
        return (await self.request("status"))["result"]

    async def metrics(self) -> dict:
        return (await self.request("metrics"))["result"]

    async def health(self) -> dict:
        return (await self.request("health"))["result"]

    async def cancel(self, target: str) -> dict:
        return (await self.request("cancel", target=target))["result"]

    async def reset(self) -> dict:
        return (await self.request("reset"))["result"]


class AsyncEventStream:
    """The events of one streamed request: deltas, then ``done`` (an ``error`` raises IgnisError). The request is
    sent on the first iteration (or on ``await``). ``aclose()`` / leaving ``async with`` before ``done`` cancels it."""

    def __init__(self, client: AsyncClient, op: str, fields: dict):
        self._client, self._op, self._fields = client, op, fields
        self._rid: str | None = None
        self._q: asyncio.Queue | None = None
        self._finished = False

    @property
    def id(self) -> str | None:
        """The request id once sent."""
        return self._rid

    async def _start(self) -> None:
        if self._rid is None:
            self._rid, self._q = await self._client._open(self._op, self._fields)

    def __await__(self):
        async def started():
            await self._start()
            return self
        return started().__await__()

    def __aiter__(self) -> AsyncIterator[dict]:
        return self

    async def __anext__(self) -> dict:
        if self._finished:
            raise StopAsyncIteration
        await self._start()
        try:
            ev = await self._client._get(self._q)
        except BaseException:
            self._finished = True
            self._client._finish(self._rid)
            raise
        if ev.get("type") in TERMINAL:
            self._finished = True
            self._client._finish(self._rid)
            if ev.get("type") == "error":
                _raise_error(ev)
        return ev

    async def aclose(self) -> None:
        """Stop reading; a request still running is cancelled (its remaining events are dropped)."""
        if self._rid is not None and not self._finished:
            self._finished = True
            self._client._finish(self._rid)
            try:
                await self._client.cancel(self._rid)
            except (IgnisError, ConnectionError):
                pass

    async def __aenter__(self) -> "AsyncEventStream":
        await self._start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
