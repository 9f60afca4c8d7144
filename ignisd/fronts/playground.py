"""The playground's routes on the HTTP front (issue 15): the page, its static files, and the small JSON/SSE routes
it reads besides the OpenAI front.

* ``GET /`` (and ``/playground``): the page; ``GET /playground/{file}``: its static files (shipped as package data in
  ``ignisd/fronts/static/``: plain HTML, CSS and JavaScript modules, no build step, nothing fetched from
  elsewhere: every answer carries a Content-Security-Policy that allows this origin only). These never need the key:
  the page asks for it and sends it on the routes below.
* ``POST /ignis/tokenize``: the `tokenize` op (body: its fields, ``text`` or a chat body) → its result.
* ``POST /ignis/reuse``: a chat body → what it would resume if sent now (``ignisd.reuse_probe``).
* ``GET /ignis/status``: the `status` op's object plus ``counters`` (the running totals the Monitor's strip chart
  differences: requests, reuse lookups / hits / restored tokens, TTFT sum and count, prefilled tokens).
* ``GET /ignis/status/stream``: the same object as server-sent events (``event: status``), one every
  ``?interval=`` seconds (default 1, 0.2 to 10), until the client leaves or the listener stops.

The JSON routes sit behind the front's guard (auth, loading; errors in OpenAI's shape); the status routes answer
while the model loads or is unloaded (the host's status says so) and never load it. †: imports no torch.
"""
from __future__ import annotations

import asyncio
import importlib.resources
import re

from aiohttp import web
from ignis_client.wire import _shown
from prometheus_client.parser import text_string_to_metric_families

from ignisd.fronts.sse import SSE_HEADERS, HttpError, dumps, new_id, parse_op, read_json, sse_event
from ignisd.reuse_probe import probe

STATIC = importlib.resources.files("ignisd.fronts") / "static"
CSP = ("default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
TYPES = {".html": "text/html", ".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml",
         ".png": "image/png", ".ico": "image/x-icon"}
NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
STATUS_PATHS = frozenset({"/ignis/status", "/ignis/status/stream"})   # answered while loading; never load the model
# counter families summed over their labels → the `counters` key they appear under
COUNTERS = {"ignis_requests": "requests", "ignis_reuse_lookups": "reuse_lookups", "ignis_reuse_hits": "reuse_hits",
            "ignis_reuse_tokens_restored": "reuse_tokens_restored", "ignis_prefill_tokens": "prefill_tokens",
            "ignis_prompt_tokens": "prompt_tokens"}


def counters(metrics_text: str) -> dict:
    """The running totals of the Monitor's strip chart from a Prometheus exposition (zeros for absent families):
    requests, reuse_lookups, reuse_hits, reuse_tokens_restored, prefill_tokens, prompt_tokens, ttft_sum_s,
    ttft_count."""
    out = dict.fromkeys([*COUNTERS.values(), "ttft_sum_s", "ttft_count"], 0.0)
    for fam in text_string_to_metric_families(metrics_text or ""):
        if fam.name in COUNTERS:
            out[COUNTERS[fam.name]] = sum(s.value for s in fam.samples if s.name.endswith("_total"))
        elif fam.name == "ignis_ttft_seconds":
            for s in fam.samples:
                if s.name.endswith("_sum"):
                    out["ttft_sum_s"] = s.value
                elif s.name.endswith("_count"):
                    out["ttft_count"] = s.value
    return out


class PlaygroundFront:
    """The playground routes of `http` (ignisd.fronts.http.HttpFront: its edge and body limit)."""

    def __init__(self, http):
        self.http = http
        self.closing = asyncio.Event()   # set when the listener stops: open status streams end

    # ---- static files ----
    @staticmethod
    def _file(name: str) -> web.Response:
        path = STATIC / name
        suffix = name[name.rfind("."):] if "." in name else ""
        if not NAME.match(name) or suffix not in TYPES or not path.is_file():
            raise web.HTTPNotFound()
        return web.Response(body=path.read_bytes(), content_type=TYPES[suffix],
                            charset="utf-8" if TYPES[suffix].startswith("text/") else None,
                            headers={"Cache-Control": "no-cache", "Content-Security-Policy": CSP,
                                     "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})

    async def page(self, request: web.Request) -> web.Response:
        """GET /: the playground page."""
        return self._file("index.html")

    async def static(self, request: web.Request) -> web.Response:
        """GET /playground/{name}: one shipped static file (404 for anything else)."""
        return self._file(request.match_info["name"])

    # ---- JSON routes ----
    async def tokenize(self, request: web.Request) -> web.Response:
        """POST /ignis/tokenize: the `tokenize` op."""
        body = await read_json(request, self.http.max_body_bytes)
        op = parse_op(body, "tokenize", new_id("tok-"))
        return web.Response(body=dumps(self.http.edge.tokenize(op)), content_type="application/json")

    async def reuse(self, request: web.Request) -> web.Response:
        """POST /ignis/reuse: a chat body → {"prompt_tokens", "reuse"}: what it would resume if sent now."""
        body = await read_json(request, self.http.max_body_bytes)
        op = parse_op(body, "chat", new_id("probe-"))
        return web.Response(body=dumps(probe(self.http.edge, op)), content_type="application/json")

    def snapshot(self) -> dict:
        """The `status` object plus `counters`."""
        edge = self.http.edge
        return {**edge.status(), "counters": counters(edge.metrics_text())}

    async def status(self, request: web.Request) -> web.Response:
        """GET /ignis/status: the status object with counters."""
        return web.Response(body=dumps(self.snapshot()), content_type="application/json")

    async def status_stream(self, request: web.Request) -> web.StreamResponse:
        """GET /ignis/status/stream: the status object with counters as SSE, every ?interval= seconds."""
        raw = request.query.get("interval", "1")
        try:
            interval = float(raw)
        except ValueError:
            interval = float("nan")
        if not 0.2 <= interval <= 10.0:          # also NaN
            raise HttpError(400, "bad_request", f"interval: {_shown(raw)} is not a number of seconds from 0.2 to 10",
                            "interval")
        resp = web.StreamResponse(headers=SSE_HEADERS)
        await resp.prepare(request)
        try:
            while not self.closing.is_set():
                await resp.write(sse_event("status", self.snapshot()))
                try:
                    await asyncio.wait_for(self.closing.wait(), interval)
                except TimeoutError:
                    pass
            await resp.write_eof()
        except ConnectionError:   # the page went away
            pass
        return resp

    def routes(self) -> list[tuple[str, str, object]]:
        """(method, path, handler) of the guarded JSON routes."""
        return [("POST", "/ignis/tokenize", self.tokenize), ("POST", "/ignis/reuse", self.reuse),
                ("GET", "/ignis/status", self.status), ("GET", "/ignis/status/stream", self.status_stream)]

    def add_static(self, app: web.Application) -> None:
        """Add the page and its static files (no key needed) to `app`."""
        app.router.add_get("/", self.page)
        app.router.add_get("/playground", self.page)
        app.router.add_get("/playground/{name}", self.static)

    def close(self) -> None:
        """End the open status streams (the listener is stopping)."""
        self.closing.set()
