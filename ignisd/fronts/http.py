"""The HTTP listener (server.http_listen): one aiohttp application on the daemon's own event loop, routing each API to
its front (DESIGN §5, HTTP fronts).

Routes: OpenAI ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models`` (``ignisd.fronts.openai``);
Anthropic ``POST /v1/messages``, ``POST /v1/messages/count_tokens`` (``ignisd.fronts.anthropic``); OpenAI
``POST /v1/responses`` (``ignisd.fronts.responses``); ``GET /health`` (503 ``{"status": "loading"}`` until the model is
loaded, 503 with the reason when the daemon's health says it is not ok, else 200 ``{"status": "ok"}``) and
``GET /metrics`` (the Prometheus text of the `metrics` op); the playground page at ``GET /`` and its JSON/SSE routes
under ``/ignis/`` (``ignisd.fronts.playground``). An unknown path is 404 in the error shape of the API its
path belongs to (Anthropic's under ``/v1/messages``, OpenAI's elsewhere).

Request ids: every reply to a generation request (and to count_tokens) carries its id, ``x-request-id`` on the
OpenAI and Responses routes, ``request-id`` on Anthropic's, refusals after the front named the request included
(``ignisd.fronts.sse.request_id``); the ``error_reply`` log line names it too. A refusal before that (auth, loading,
an unknown path) and the other routes have none.

Auth: with server.api_key_file set, every route but ``/health`` needs the key, as ``Authorization: Bearer KEY``
(OpenAI) or ``x-api-key: KEY`` (Anthropic; either header is taken on every route), compared in constant time; a
wrong or missing key is 401 in the route's error shape. The listener starts before the model loads (`attach` hands
it the edge once it is ready). †: imports no torch.
"""
from __future__ import annotations

import hmac
import os

from aiohttp import web
from ignis_client import protocol as P

from ignisd.fronts import anthropic, openai, playground, responses
from ignisd.fronts.sse import STATUS, HttpError, id_headers, id_of
from ignisd.log import get_logger
from ignisd.preflight import StartupError
from ignisd.unix_socket import prepare_socket

log = get_logger("srv")


class HttpFront:
    """The HTTP fronts of one daemon.

    api_key: the configured key or None. strip_billing_header: server.strip_billing_header (Messages). max_body_bytes:
    server.max_line_bytes (a larger body is 413 too_long). metrics: ignisd.metrics.Metrics (error replies are counted)
    or None. request_log: ignisd.request_log.RequestLog or None (every generation body is recorded, `log_request`).
    `edge` is None until `attach`.
    """

    def __init__(self, *, api_key: str | None, strip_billing_header: bool = True, max_body_bytes: int = 16 * 2**20,
                 metrics=None, request_log=None):
        self.edge = None
        self.request_log = request_log
        self.api_key = api_key
        self.strip_billing_header = strip_billing_header
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.playground = playground.PlaygroundFront(self)
        self._runner: web.AppRunner | None = None
        self._unix_path: str | None = None

    def attach(self, edge) -> None:
        """The model is loaded: serve requests with `edge` (ignisd.edge.Edge)."""
        self.edge = edge

    # ---- routing ----
    def application(self) -> web.Application:
        """The aiohttp application with every route (tests serve it directly)."""
        app = web.Application(client_max_size=self.max_body_bytes, middlewares=[self._not_found])
        oa, an, rs = openai.OpenAIFront(self), anthropic.AnthropicFront(self), responses.ResponsesFront(self)
        routes = [("POST", "/v1/chat/completions", oa.chat, openai.error),
                  ("POST", "/v1/completions", oa.completion, openai.error),
                  ("GET", "/v1/models", oa.models, openai.error),
                  ("GET", "/v1/models/{model}", oa.model, openai.error),
                  ("POST", "/v1/messages", an.messages, anthropic.error),
                  ("POST", "/v1/messages/count_tokens", an.count_tokens, anthropic.error),
                  ("POST", "/v1/responses", rs.responses, openai.error),
                  ("GET", "/metrics", self.metrics_text, openai.error)]
        routes += [(method, path, fn, openai.error) for method, path, fn in self.playground.routes()]
        for method, path, fn, err in routes:
            app.router.add_route(method, path, self._guard(fn, err))
        app.router.add_get("/health", self.health)
        self.playground.add_static(app)
        return app

    def _guard(self, fn, error):
        """`fn` behind the loading check, auth and the mapping of refusals onto `error` (the API's error shape).
        With a model host as the edge (the daemon's), a request waits while the model loads, as on the socket."""
        async def handler(request: web.Request) -> web.StreamResponse:
            try:
                if self.edge is None:
                    raise HttpError(503, "unavailable", "the model is loading; retry when GET /health answers 200")
                self.check_auth(request)
                light = request.path == "/metrics" or request.path in playground.STATUS_PATHS  # never wait or load
                if not light and self._loading():
                    raise HttpError(503, "unavailable", "the model is loading; retry when GET /health answers 200")
                ready = getattr(self.edge, "ready", None)
                if ready is not None and not light:
                    await ready()               # an idle-unloaded model loads again for this request
                reply = await fn(request)
            except HttpError as e:
                reply = self.refuse(error, e.status, e.code, e.message, e.field, id_of(request))
            except P.ProtocolError as e:
                reply = self.refuse(error, STATUS.get(e.code, 400), e.code, e.message, e.field, id_of(request))
            except Exception as e:  # the daemon stays up; the client learns what broke
                rid = id_of(request)
                log.error("op_failed", path=request.path, **({"id": rid} if rid is not None else {}), error=repr(e))
                reply = self.refuse(error, 500, "internal", f"{type(e).__name__}: {e}", None, rid)
            if not reply.prepared:                  # a started stream sent its headers already (sse.answer)
                reply.headers.update(id_headers(request))
            return reply
        return handler

    def refuse(self, error, status: int, code: str, message: str, field: str | None,
               rid: str | None = None) -> web.Response:
        """The error response `error(status, code, message, field)`, logged and counted as the socket's are; the log
        line names the request's id `rid` when it has one (ignisd.fronts.sse.request_id)."""
        named = {"id": rid} if rid is not None else {}
        log.info("error_reply", http=status, code=code, **named, field=field, message=message[:200])
        if self.metrics is not None and code in P.ERROR_CODES:
            self.metrics.error_sent(code)
        return error(status, code, message, field)

    @web.middleware
    async def _not_found(self, request: web.Request, handler):
        try:
            return await handler(request)
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as e:
            error = anthropic.error if request.path.startswith("/v1/messages") else openai.error
            if isinstance(e, web.HTTPNotFound):
                return self.refuse(error, 404, "not_found", f"no route {request.method} {request.path}", None)
            allowed = ", ".join(sorted(e.allowed_methods))
            reply = self.refuse(error, 405, "method_not_allowed",
                                f"{request.method} is not allowed on {request.path}; use {allowed}", None)
            reply.headers["Allow"] = allowed
            return reply

    def check_auth(self, request: web.Request) -> None:
        """Raise ProtocolError('auth') when a key is configured and the request lacks it."""
        if self.api_key is None:
            return
        key = request.headers.get("x-api-key")
        if key is None:
            scheme, _, value = request.headers.get("Authorization", "").partition(" ")
            key = value.strip() if scheme.lower() == "bearer" else None
        if key is None or not hmac.compare_digest(key.encode(), self.api_key.encode()):
            raise P.ProtocolError("auth", "missing or wrong API key (Authorization: Bearer KEY or x-api-key: KEY)",
                                  "api_key")

    def log_request(self, front: str, request: web.Request, body: dict, rid: str | None = None) -> None:
        """Record a generation request's `body` (front: openai, anthropic or responses) and its id `rid` in the
        request log, when one is configured. Never blocks (RequestLog.record)."""
        if self.request_log is not None:
            self.request_log.record(front, body, request.path, rid)

    # ---- health and metrics ----
    def _loading(self) -> bool:
        """The daemon's first load (or a reload) is in progress: HTTP requests get 503, as /health says."""
        health = getattr(self.edge, "health", None)
        return health is not None and health().get("state") in ("loading", "reloading")

    async def health(self, request: web.Request) -> web.Response:
        """503 while loading or unhealthy, 200 {"status": "ok"} when ready; never needs the key."""
        if self.edge is None or self._loading():
            return web.json_response({"status": "loading"}, status=503)
        h = self.edge.health()
        if not h.get("ok", False):
            return web.json_response({"status": "unavailable", **h}, status=503)
        return web.json_response({"status": "ok"})

    async def metrics_text(self, request: web.Request) -> web.Response:
        """The Prometheus exposition text (format 0.0.4)."""
        return web.Response(text=self.edge.metrics_text(), content_type="text/plain",
                            headers={"X-Content-Type-Options": "nosniff"})

    # ---- listener ----
    async def start(self, listen: str, socket_mode: int = 0o600, socket_gid: int | None = None,
                    sock=None) -> str:
        """Listen on `listen` ("HOST:PORT" or "unix:PATH"), or on `sock` (a listening socket systemd passed);
        returns the address bound (port 0 gets a free port). Raises StartupError (exit 2) when it cannot bind."""
        self._runner = web.AppRunner(self.application(), handler_cancellation=True, access_log=None,
                                     shutdown_timeout=5.0)
        await self._runner.setup()
        try:
            if sock is not None:
                site = web.SockSite(self._runner, sock)
                await site.start()
                bound = str(sock.getsockname() or "(inherited)")
            elif listen.startswith("unix:"):
                path = listen[len("unix:"):]
                try:
                    prepare_socket(path)
                except StartupError as e:
                    raise StartupError(str(e).replace("server.socket", "server.http_listen", 1), e.exit_code) \
                        from None
                site = web.UnixSite(self._runner, path)
                await site.start()
                self._unix_path = path
                os.chmod(path, socket_mode)
                if socket_gid is not None:
                    os.chown(path, -1, socket_gid)
                bound = listen
            else:
                host, _, port = listen.rpartition(":")
                site = web.TCPSite(self._runner, host.strip("[]"), int(port))
                await site.start()
                sock = site._server.sockets[0]  # noqa: SLF001 (aiohttp keeps the asyncio server there)
                h, p = sock.getsockname()[:2]
                bound = f"[{h}]:{p}" if ":" in h else f"{h}:{p}"
        except OSError as e:
            await self._runner.cleanup()
            raise StartupError(f"server.http_listen {listen}: cannot listen: {e.strerror or e}", exit_code=2) \
                from None
        log.info("http_listening", addr=bound)
        return bound

    async def stop_listening(self) -> None:
        """Accept no new connections (requests in flight go on; the playground's status streams end)."""
        self.playground.close()
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()

    async def close(self) -> None:
        """Stop listening and close the connections (requests in flight were ended by the daemon before)."""
        self.playground.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._unix_path is not None:
            try:
                os.unlink(self._unix_path)
            except FileNotFoundError:
                pass
