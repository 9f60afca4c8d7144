"""The request log (``server.request_log``, ``server.request_log_bytes``; DESIGN §6): every generation request's body
as the daemon received it, one JSON line each, for ``ignis lint`` / ``ignisd lint``. †: imports no torch.

Line shape: ``{"ts": unix seconds (float), "front": "socket" | "openai" | "anthropic" | "responses", "path": the
HTTP route (HTTP fronts only), "id": the request's id (HTTP fronts only: the id of its ``done`` log line and of its
replies' ``x-request-id`` / ``request-id`` header), "body": the request body}`` — for the socket the request
line without its ``id`` and ``api_key``, for HTTP the body as posted (an ``api_key`` field is dropped there too).
Bodies hold whole prompts, so the file is created mode 0600 (and chmod'ed to it when it existed), and it is
size-capped: a write that would take the file past ``max_bytes`` first rotates it (``PATH`` → ``PATH.1`` →
``PATH.2``; three files kept, the oldest dropped). A single line longer than the cap is still written whole, into a
fresh file.

Off the hot path: ``record`` only puts the line on a queue (never blocks the event loop); one daemon thread
serialises and writes. A write error is logged once per distinct error and the line dropped; the daemon goes on.
``close()`` writes what is queued and stops the thread.
"""
from __future__ import annotations

import os
import queue
import threading
import time

import orjson

from ignisd.log import get_logger

log = get_logger("srv")
KEEP_FILES = 3            # PATH, PATH.1, PATH.2
FRONTS = ("socket", "openai", "anthropic", "responses")
_STOP = object()


class RequestLog:
    """Appends request lines to `path` from a background thread (see the module docstring).

    path: the log file. max_bytes: size cap of one file (bytes, > 0). Raises OSError when the file cannot be opened
    at construction (the daemon refuses to start: server.request_log).
    """

    def __init__(self, path: str, max_bytes: int):
        self.path = str(path)
        self.max_bytes = int(max_bytes)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._fd = self._open()
        self._size = os.fstat(self._fd).st_size
        self._errors: set[str] = set()
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="ignis-request-log", daemon=True)
        self._thread.start()

    def _open(self) -> int:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)
        return fd

    def record(self, front: str, body: dict, path: str | None = None, rid: str | None = None) -> None:
        """Queue one request (front: one of FRONTS; body: the request body; path: the HTTP route; rid: the request's
        id). Returns at once; the body must not be modified afterwards (it is serialised later, in the writer
        thread)."""
        entry = {"ts": round(time.time(), 3), "front": front}
        if path is not None:
            entry["path"] = path
        if rid is not None:
            entry["id"] = rid
        entry["body"] = body
        self._q.put(entry)

    def _rotate(self) -> None:
        os.close(self._fd)
        for k in range(KEEP_FILES - 1, 0, -1):
            src = self.path if k == 1 else f"{self.path}.{k - 1}"
            if os.path.exists(src):
                os.replace(src, f"{self.path}.{k}")
        self._fd = self._open()
        self._size = 0

    def _write(self, entry: dict) -> None:
        body = entry.get("body")
        if isinstance(body, dict) and "api_key" in body:
            entry["body"] = {k: v for k, v in body.items() if k != "api_key"}
        line = orjson.dumps(entry) + b"\n"
        if self._size > 0 and self._size + len(line) > self.max_bytes:
            self._rotate()
        os.write(self._fd, line)
        self._size += len(line)

    def _run(self) -> None:
        while True:
            entry = self._q.get()
            if entry is _STOP:
                return
            if "_flush" in entry:
                entry["_flush"].set()
                continue
            try:
                self._write(entry)
            except (OSError, TypeError, ValueError) as e:   # a full disk or an odd body never stops the daemon
                self.dropped += 1
                if repr(e) not in self._errors:
                    self._errors.add(repr(e))
                    log.error("request_log_write_failed", path=self.path, error=repr(e))

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until every line queued so far is written (tests, shutdown)."""
        done = threading.Event()
        self._q.put({"_flush": done})
        done.wait(timeout)

    def close(self) -> None:
        """Write what is queued, stop the writer thread and close the file."""
        self._q.put(_STOP)
        self._thread.join(10)
        try:
            os.close(self._fd)
        except OSError:
            pass
