"""One generation over HTTP: the request body, the edge events of its run, and their answer as JSON or server-sent
events (DESIGN §5, HTTP fronts). Shared by the OpenAI, Anthropic Messages and Responses fronts.

A front parses its body (``read_json``), maps it onto a chat or completion op and prepares a ``Generation`` with the
edge, then hands it to ``answer`` together with a *renderer*: a per-request object with the front's wire shapes

* ``final(done: EdgeDone) -> dict``: the non-streamed body,
* ``head() -> bytes``, ``delta(ev: EdgeDelta) -> bytes``, ``done(ev: EdgeDone) -> bytes``,
  ``fail(ev: EdgeError) -> bytes``: the framed SSE bytes of a stream (``sse_event`` / ``sse_data`` frame them).

``answer`` owns the request flow, once for every front: the run's events come from its own task (``Run``), so a client
that drops the connection (aiohttp cancels the handler, or a write fails) cancels the request while the run still
ends normally (the `done` log line and metrics are emitted once, as on the socket). A streamed request waits up to
``FIRST_EVENT_WAIT_S`` for its first event before the response starts, so that an engine refusal (context_length,
busy) gets its HTTP status (raised as HttpError, which the route's guard answers in the API's error shape, logged and
counted as every refusal is); one that comes later is written into the stream in the API's error shape. A started
stream that has had nothing to say for ``KEEPALIVE_S`` (a long prompt still prefilling, a queue) gets a keepalive
frame, so proxies and clients with idle timeouts keep the connection: the renderer's ``keepalive() -> bytes`` when it
has one (Anthropic's ``ping`` event), else an SSE comment line, which the SSE format (and the SDKs' parsers) ignore.

Request ids: a front names each generation request (``request_id``) before it reads the body: the client's
``X-Request-Id`` (vLLM takes it as the request's id too) when it is 1 to 128 printable ASCII characters, any other
value being ignored; else the id the daemon made for the reply body (``chatcmpl-…``, ``cmpl-…``, ``resp_…``,
``msg_…``), which the body keeps either way. That id is the op's id, so the ``done`` log line (and ``op_failed``,
``http_client_gone``, ``error_reply``) and the request log name it, and every reply to the request carries it in the
front's header (``x-request-id`` on OpenAI and Responses, ``request-id`` on Anthropic), streamed or not, refusals
included (``id_headers``: ``answer`` puts it on the stream it starts, the route's guard on every reply not yet
sent). The engine's key stays ``h:`` + the body's id, unique whatever the client sends.
†: imports no torch.
"""
from __future__ import annotations

import asyncio
import secrets

import orjson
from aiohttp import web
from ignis_client import protocol as P

from ignisd.edge import Edge, Generation
from ignisd.edge_events import EdgeDelta, EdgeDone, EdgeError
from ignisd.log import get_logger

log = get_logger("srv")
FIRST_EVENT_WAIT_S = 1.0
KEEPALIVE_S = 10.0
"""Seconds of silence in a started stream after which a keepalive frame is written."""
KEEPALIVE_COMMENT = b": keepalive\n\n"
# the wire error codes (DESIGN §5) as HTTP statuses; not_found / unavailable are HTTP-only
STATUS = {"bad_json": 400, "bad_request": 400, "unknown_op": 400, "duplicate_id": 400, "context_length": 400,
          "model_unsupported": 400, "auth": 401, "not_found": 404, "too_long": 413, "busy": 429, "internal": 500,
          "unavailable": 503}
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
RETRY_AFTER_S = 1
"""Seconds a `busy` (429: the queue is full) or `unavailable` (503) answer asks the client to wait (Retry-After, which
the OpenAI and Anthropic SDKs honour in their backoff)."""


CLIENT_ID_HEADER = "X-Request-Id"
"""The request header a client may name its request with (see the module docstring)."""
# where request_id keeps (header, id) on the aiohttp request: a typed key where aiohttp has web.RequestKey (recent
# releases warn on a str key; pyproject's floor, 3.10, has none)
_ID_KEY = web.RequestKey("ignis_request_id", tuple) if hasattr(web, "RequestKey") else "ignis_request_id"


def error_headers(status: int) -> dict[str, str]:
    """Headers of an error answer with `status`: Retry-After on 429 and 503."""
    return {"Retry-After": str(RETRY_AFTER_S)} if status in (429, 503) else {}


def client_request_id(request: web.Request) -> str | None:
    """The client's ``X-Request-Id`` when it is 1 to P.MAX_ID_CHARS (128) printable ASCII characters (space to
    ``~``), else None: an absent, empty, longer or non-ASCII value is ignored."""
    v = request.headers.get(CLIENT_ID_HEADER)
    if v is None or not 1 <= len(v) <= P.MAX_ID_CHARS or not all(" " <= c <= "~" for c in v):
        return None
    return v


def request_id(request: web.Request, made: str, header: str) -> str:
    """Name `request`: the client's valid X-Request-Id (client_request_id), else `made` (the daemon's id of the
    reply). Every reply to it then carries ``header: id`` (id_headers). Returns the id."""
    rid = client_request_id(request) or made
    request[_ID_KEY] = (header, rid)
    return rid


def id_of(request: web.Request) -> str | None:
    """The id `request_id` gave `request`, or None (a route that names none, or a refusal before it did)."""
    got = request.get(_ID_KEY)
    return got[1] if got else None


def id_headers(request: web.Request) -> dict[str, str]:
    """``{header: id}`` of a request named by `request_id`, else {}."""
    got = request.get(_ID_KEY)
    return {got[0]: got[1]} if got else {}


_runs: set[asyncio.Task] = set()   # runs whose client is gone still end normally: keep their tasks referenced


class HttpError(Exception):
    """A request refused before it reaches the edge: an HTTP status, a code (a wire code or not_found /
    unavailable), a message and the field it names."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field


def new_id(prefix: str) -> str:
    """A fresh response / item id: prefix + 24 hex digits."""
    return prefix + secrets.token_hex(12)


def dumps(obj) -> bytes:
    """Compact UTF-8 JSON."""
    return orjson.dumps(obj)


def sse_data(obj) -> bytes:
    """One SSE frame without an event name (OpenAI chat / completions)."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def sse_event(name: str, obj) -> bytes:
    """One SSE frame with an event name (Anthropic Messages, Responses)."""
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


async def read_json(request: web.Request, max_bytes: int) -> dict:
    """The request body as a JSON object. Raises ProtocolError: too_long over `max_bytes` (server.max_line_bytes),
    bad_json for invalid UTF-8 / JSON or JSON that is not an object."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise P.ProtocolError("too_long", f"body of {request.content_length} bytes exceeds the limit of {max_bytes} "
                                          "bytes (server.max_line_bytes)")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise P.ProtocolError("too_long", f"body exceeds the limit of {max_bytes} bytes (server.max_line_bytes)") \
            from None
    if not raw.strip():
        raise P.ProtocolError("bad_json", "the request body is empty; send a JSON object")
    return P.decode_line(raw, max_bytes, what="body")


def parse_op(obj: dict, op: str, rid: str):
    """Validate a wire body as op `op` (chat, completion, tokenize) with the socket's own parser: the same checks and
    error codes. Raises ProtocolError."""
    body = {k: v for k, v in obj.items() if k != "api_key"}
    body["id"], body["op"] = rid, op
    return P.parse_request(body)


class Run:
    """The edge events of one generation, produced by their own task (see the module docstring)."""

    def __init__(self, edge: Edge, gen: Generation):
        self.edge, self.gen = edge, gen
        self.queue: asyncio.Queue = asyncio.Queue()
        self.started = asyncio.Event()
        self.first = None          # the first event, once it came
        self.ended = False
        self.abandoned = False
        self.task = asyncio.create_task(self._pump())
        _runs.add(self.task)
        self.task.add_done_callback(_runs.discard)

    async def _pump(self) -> None:
        if self.abandoned:   # the client left before the request was submitted: submit nothing
            self.queue.put_nowait(EdgeError("internal", "the client went away"))
            return
        try:
            async for ev in self.edge.stream(self.gen):   # the first step submits (no await before it)
                self.queue.put_nowait(ev)
                if self.first is None:
                    self.first = ev
                    self.started.set()
        except Exception as e:  # the daemon stays up; the client learns what broke
            log.error("op_failed", id=self.gen.client_id, error=repr(e))
            self.queue.put_nowait(EdgeError("internal", f"{type(e).__name__}: {e}"))
        self.started.set()

    async def next(self):
        """The next edge event (EdgeDelta, then one EdgeDone or EdgeError)."""
        ev = await self.queue.get()
        if not isinstance(ev, EdgeDelta):
            self.ended = True
        return ev

    def abandon(self) -> None:
        """The client is gone: cancel the request unless it already ended (its run still ends normally)."""
        if not self.ended and not self.abandoned:
            self.abandoned = True
            self.edge.cancel(self.gen.request.rid)
            log.info("http_client_gone", id=self.gen.client_id)


async def answer(request: web.Request, edge: Edge, gen: Generation, r) -> web.StreamResponse:
    """Run `gen` and answer it with renderer `r` (see the module docstring): one JSON body, or an SSE stream."""
    run = Run(edge, gen)
    resp = None
    try:
        if not gen.stream:
            ev = await run.next()
            if isinstance(ev, EdgeError):        # refused by the edge: HttpFront logs and counts it (refuse)
                raise HttpError(STATUS.get(ev.code, 500), ev.code, ev.message, ev.field)
            return web.Response(body=dumps(r.final(ev)), content_type="application/json")   # id: the route guard
        if not run.started.is_set():
            try:
                async with asyncio.timeout(FIRST_EVENT_WAIT_S):
                    await run.started.wait()
            except TimeoutError:
                pass
        first = run.first
        if isinstance(first, EdgeError):
            await run.next()
            raise HttpError(STATUS.get(first.code, 500), first.code, first.message, first.field)
        resp = web.StreamResponse(headers={**SSE_HEADERS, **id_headers(request)})
        await resp.prepare(request)
        await resp.write(r.head())
        keepalive = getattr(r, "keepalive", lambda: KEEPALIVE_COMMENT)
        while True:
            try:
                ev = await asyncio.wait_for(run.next(), KEEPALIVE_S)    # a cancelled queue get loses no event
            except TimeoutError:
                await resp.write(keepalive())
                continue
            if isinstance(ev, EdgeDelta):
                out = r.delta(ev)
            elif isinstance(ev, EdgeDone):
                out = r.done(ev)
            else:
                out = r.fail(ev)
            if out:
                await resp.write(out)
            if run.ended:
                break
        await resp.write_eof()
        return resp
    except ConnectionError:   # a write to a client that is gone
        run.abandon()
        return resp if resp is not None else web.Response(status=400)
    finally:   # also on CancelledError: aiohttp cancels the handler when the client drops the connection
        run.abandon()
