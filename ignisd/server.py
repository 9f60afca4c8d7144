"""The Unix-socket server: framing, per-connection tasks, backpressure, dispatch (DESIGN §2, §5).

One JSON object per line in both directions. Each connection has a reader loop (framing and dispatch) and one task
per request; replies are written under a per-connection lock and drained, so a slow client only slows itself. The
ops are answered by a front (``ignisd.fronts.ndjson.NdjsonFront``).

End of input (the client shut its write side, as `nc -N` does) means no more requests: everything already sent is
answered, then the connection is closed. A client that is gone — it closed the socket (POLLHUP on a Unix socket),
or a write to it failed — cancels all its requests. †: imports no torch.
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import select

from ignis_client import protocol as P
from ignis_client.wire import _shown

from ignisd.fronts.ndjson import NdjsonFront
from ignisd.log import get_logger

log = get_logger("srv")
_conn_ids = itertools.count(1)
GONE_POLL_S = 0.1   # after end of input, how often a connection checks whether its client closed the socket


class Connection:
    """One client connection: its writer, in-flight requests (client id → task) and engine rids."""

    def __init__(self, server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.num = next(_conn_ids)
        self.inflight: dict[str, asyncio.Task] = {}
        self.rids: dict[str, str] = {}   # client id -> engine rid of a generation request
        self._wlock = asyncio.Lock()
        self.closed = False      # the client is gone: nothing more is written

    def rid(self, client_id: str) -> str:
        """The engine-wide key of this connection's request `client_id`."""
        return f"c{self.num}:{client_id}"

    async def send(self, obj: dict) -> None:
        """Write one reply line and wait for the socket buffer to drain (backpressure)."""
        if self.closed:
            return
        if obj.get("type") == "error":
            err = obj["error"]
            log.info("error_reply", id=obj.get("id"), code=err["code"], field=err.get("field"),
                     message=err["message"][:200])
            if self.server.metrics is not None:
                self.server.metrics.error_sent(err["code"])
        async with self._wlock:
            try:
                self.writer.write(P.encode(obj))
                await self.writer.drain()
            except (ConnectionError, RuntimeError):
                self.disconnect()

    def disconnect(self) -> None:
        """The client is gone: write nothing more and cancel every generation request it has in flight."""
        self.closed = True
        for rid in list(self.rids.values()):
            self.server.front.edge.cancel(rid)

    def peer_gone(self) -> bool:
        """Whether the client closed its socket (not only its write side) or a write to it failed."""
        if self.closed or self.writer.is_closing():
            return True
        sock = self.writer.get_extra_info("socket")
        if sock is None:
            return False
        p = select.poll()
        p.register(sock.fileno(), select.POLLIN)   # POLLHUP / POLLERR are reported whatever is asked
        return any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, ev in p.poll(0))

    async def lines(self):
        """Yield complete lines (bytes without the newline); a line over the limit yields None once."""
        limit = self.server.max_line_bytes
        buf = bytearray()
        discarding = False
        while True:
            chunk = await self.reader.read(1 << 16)
            if not chunk:             # EOF (the client may have shut only its write side: it still reads)
                if discarding:
                    yield None
                elif buf:
                    yield bytes(buf)
                return
            buf += chunk
            while True:
                i = buf.find(b"\n")
                if i < 0:
                    if len(buf) > limit:
                        if not discarding:
                            discarding = True
                        buf.clear()
                    break
                line = bytes(buf[:i])
                del buf[:i + 1]
                if discarding or len(line) > limit:
                    discarding = False
                    yield None
                else:
                    yield line

    async def serve(self) -> None:
        """Read and dispatch lines until end of input; then answer what is in flight (cancelled instead when the
        client is gone) and close."""
        try:
            async for line in self.lines():
                if line is None:
                    await self.send(P.error(None, "too_long", f"line exceeds server.max_line_bytes "
                                                             f"({self.server.max_line_bytes} bytes)", None))
                    continue
                if not line.strip():
                    continue
                await self.dispatch(line)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.disconnect()
        except asyncio.CancelledError:
            self.disconnect()
            raise
        finally:
            await self._finish()

    async def _finish(self) -> None:
        """After end of input: let every request in flight finish and write its replies, cancelling them all as soon
        as the client turns out to be gone (then waiting at most 5 s for their ends); then close the connection."""
        try:
            while not self.closed:
                pending = [t for t in self.inflight.values() if not t.done()]
                if not pending:
                    break
                if self.peer_gone():
                    self.disconnect()
                    break
                await asyncio.wait(pending, timeout=GONE_POLL_S)
            pending = [t for t in self.inflight.values() if not t.done()]
            if pending:
                await asyncio.wait(pending, timeout=5)
        except asyncio.CancelledError:  # the loop is shutting down: nothing left to wait for
            pass
        try:
            self.writer.close()
        except RuntimeError:
            pass

    async def dispatch(self, line: bytes) -> None:
        """Parse one request line and answer it (generation requests run as their own task)."""
        try:
            obj = P.decode_line(line, self.server.max_line_bytes)
            self.server.check_auth(obj)
            op = P.parse_request(obj)
        except P.ProtocolError as e:
            await self.send(e.reply())
            return
        if op.id in self.inflight:
            await self.send(P.error(op.id, "duplicate_id",
                                    f"id {_shown(op.id)} is already in flight on this connection", "id"))
            return
        if len(self.inflight) >= self.server.max_inflight:
            await self.send(P.error(op.id, "busy", f"{len(self.inflight)} requests in flight on this connection "
                                                   f"(server.max_inflight_per_connection = "
                                                   f"{self.server.max_inflight})", None))
            return
        self.server.front.log_request(obj, op)
        task = asyncio.create_task(self._run_op(op))
        self.inflight[op.id] = task

    async def _run_op(self, op) -> None:
        if self.closed:   # the client left before this request started: submit nothing for it
            self.inflight.pop(op.id, None)
            return
        try:   # no await comes before a generation request is submitted and in self.rids (disconnect() sees it)
            await self.server.front.answer(self, op)
        except P.ProtocolError as e:
            await self.send(P.error(op.id, e.code, e.message, e.field))
        except Exception as e:  # the daemon stays up; the client learns what broke
            log.error("op_failed", id=op.id, error=repr(e))
            await self.send(P.error(op.id, "internal", f"{type(e).__name__}: {e}", None))
        finally:
            self.inflight.pop(op.id, None)
            self.rids.pop(op.id, None)


class Server:
    """Listens on `socket_path`; `front` answers ops.

    max_line_bytes: framing limit (bytes). max_inflight: per-connection in-flight requests. api_key: when set, every
    op but `health` must carry it (SHA-256 digests compared in constant time, so neither the key's content nor its
    length shows in the reply time). A SIGHUP may change these three while serving. metrics:
    ignisd.metrics.Metrics (error replies are counted) or None.
    """

    def __init__(self, front: NdjsonFront, *, max_line_bytes: int, max_inflight: int, api_key: str | None = None,
                 metrics=None):
        self.front = front
        self.max_line_bytes = max_line_bytes
        self.max_inflight = max_inflight
        self.api_key = api_key
        self.metrics = metrics
        self.connections: set[Connection] = set()
        self._server: asyncio.AbstractServer | None = None

    def check_auth(self, obj: dict) -> None:
        """Raise ProtocolError('auth') when an api key is configured and `obj` lacks it (health is exempt)."""
        if self.api_key is None or obj.get("op") == "health":
            return
        key = obj.get("api_key")
        # digests of equal length: the comparison takes the same time whatever the key's length and content
        if not isinstance(key, str) or not hmac.compare_digest(
                hashlib.sha256(key.encode(errors="surrogatepass")).digest(),
                hashlib.sha256(self.api_key.encode()).digest()):
            rid = obj.get("id") if isinstance(obj.get("id"), str) and 0 < len(obj["id"]) <= 128 else None
            raise P.ProtocolError("auth", "missing or wrong api_key", "api_key", id=rid)

    async def _on_connect(self, reader, writer) -> None:
        conn = Connection(self, reader, writer)
        self.connections.add(conn)
        try:
            await conn.serve()
        finally:
            self.connections.discard(conn)

    async def start(self, socket_path: str | None = None, sock=None) -> None:
        """Serve on `sock` (a listening Unix socket: bound by ignisd.unix_socket.bind_socket, or passed by systemd),
        or bind and listen on `socket_path` (the caller prepared the path and sets its mode)."""
        if sock is not None:
            self._server = await asyncio.start_unix_server(self._on_connect, sock=sock, limit=1 << 20)
        else:
            self._server = await asyncio.start_unix_server(self._on_connect, path=socket_path, limit=1 << 20)

    def stop_listening(self) -> None:
        """Accept no new connections (connections already open keep being served)."""
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        """Stop listening, let pending replies drain, and close every connection."""
        self.stop_listening()
        for conn in list(self.connections):
            try:
                await asyncio.wait_for(conn.writer.drain(), timeout=2)
            except (TimeoutError, ConnectionError, RuntimeError):
                pass
        for conn in list(self.connections):
            try:
                conn.writer.close()
            except RuntimeError:
                pass
