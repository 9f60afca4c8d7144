"""``AsyncClient`` and ``AsyncEventStream``: the asyncio ignisd client over its Unix socket (a background task routes
replies by id, so requests may run concurrently on one connection).

Standard library + orjson only (no torch). Re-exported by ``ignis_client.client``.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

from .framing import TERMINAL, IgnisError, ReplyTimeout, _Base, _messages, _raise_error, _terminal
from .protocol import DEFAULT_MAX_LINE_BYTES

_READ_LIMIT = 2**30   # replies (prompt_logprobs, status) can be large; requests are bounded by max_line_bytes


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
        try:
            ev = await asyncio.wait_for(q.get(), self.timeout) if self.timeout is not None else await q.get()
        except TimeoutError:
            raise ReplyTimeout(self.timeout) from None
        if isinstance(ev, _Closed):
            raise ev.exc
        return ev

    def _finish(self, rid: str) -> None:
        self._queues.pop(rid, None)
        self._answered.discard(rid)

    async def request(self, op: str, /, **fields: Any) -> dict:
        """Send one request and return its terminal reply (``done`` or ``result``). Raises IgnisError."""
        rid, q = await self._open(op, fields)
        try:
            while True:
                ev = await self._get(q)
                if _terminal(ev):
                    return ev
        finally:
            self._finish(rid)

    def stream(self, op: str, /, **fields: Any) -> "AsyncEventStream":
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
