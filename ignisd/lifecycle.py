"""The model's life inside a running daemon: load, serve, idle unload, reload, stop — and honest health (issue 13).

†: imports no torch. ``ModelHost`` owns the one loaded model (a ``Loaded``: its pools, engine and edge, built by the
daemon's `load` callback) and is what the fronts hold as their edge: the Edge methods go to the model loaded now,
and a front awaits ``ready()`` before it prepares a request that needs the model (chat, completion, tokenize,
detokenize). ``ready()`` returns at once while a model serves; while one loads (at start, after an idle unload, in
a reload) it waits for it, and the wait is that request's ``timings.load_ms``. States (``status.daemon.state``,
``health.state``):

* ``loading`` — reading the weights (at start, or for the first request after an idle unload);
* ``ready`` — serving;
* ``unloaded`` — freed after server.idle_unload_s without requests (``unloading`` while the engine winds down);
  the next request loads it again. Healthy: nothing is wrong and the next request will be served;
* ``draining`` / ``reloading`` — a SIGHUP changed keys that need a reload: new requests wait, running ones finish
  (within server.shutdown_grace_s, then the rest are cancelled), then the model loads again;
* ``stopping`` — SIGTERM: requests that arrive now get ``busy``.

``health()`` is ``ok: false`` with a reason while no model can serve (loading, reloading, stopping, a failed load) and
when the round loop has not beaten (ignisd.health.Heartbeat) for longer than its threshold while requests run or
wait. While no engine runs, ``keepalive()`` feeds the systemd watchdog.
"""
from __future__ import annotations

import asyncio
import contextvars
import enum
import os
import time
from dataclasses import replace
from typing import Any, Awaitable, Callable, Protocol

from ignis_client import protocol as P

from ignisd.config import Config
from ignisd.edge_events import EdgeDone, EdgeError
from ignisd.health import Heartbeat
from ignisd.log import get_logger
from ignisd.systemd import Notifier

log = get_logger("srv")
# milliseconds the current task waited in ready() for a model to load: the reply's timings.load_ms
_LOAD_MS: contextvars.ContextVar[float] = contextvars.ContextVar("ignis_load_ms", default=0.0)


FLUSH_S = 10.0
"""Seconds an unload (stop, idle unload, reload) may spend writing retained states to KV-disk."""


class State(str, enum.Enum):
    LOADING = "loading"
    READY = "ready"
    UNLOADED = "unloaded"
    UNLOADING = "unloading"
    DRAINING = "draining"
    RELOADING = "reloading"
    STOPPING = "stopping"


class Loaded(Protocol):
    """What the daemon's load callback returns: one model serving (ignisd.daemon.LoadedModelRuntime)."""

    edge: Any          # ignisd.edge.Edge
    engine: Any        # ignisd.engine.Engine
    model_info: dict   # the `status.model` object

    async def warmup(self) -> None: ...
    def close(self) -> None: ...


def empty_status(model_info: dict) -> dict:
    """The `status` object while no model is loaded: the last model's info, zeros everywhere else."""
    return {"model": model_info, "lanes": {"total": 0, "prefill": 0, "decode": 0, "evicted": 0},
            "queue": {"waiting": 0},
            "kv_pool": {"pages_total": 0, "pages_free": 0, "pages_live": 0, "pages_retained": 0},
            "slots": {"device_total": 0, "device_free": 0, "host_total": 0, "host_free": 0},
            "tiers": [], "retained": [], "requests": [],
            "live_states": {"slots_total": 0, "slots_used": 0, "bytes_used": 0}}


class ModelHost:
    """The daemon's model across its lifetime, and the edge the fronts call.

    cfg: the configuration in force. load: ``async load(cfg) -> Loaded`` (reads the weights; raises on failure).
    heartbeat: the round loop's Heartbeat (shared by every engine loaded). notifier: sd_notify. metrics:
    ignisd.metrics.Metrics or None. model_info: the `status.model` object known before the load (preflight).
    """

    def __init__(self, cfg: Config, load: Callable[[Config], Awaitable[Loaded]], *, heartbeat: Heartbeat,
                 notifier: Notifier, metrics=None, model_info: dict | None = None):
        self.cfg = cfg
        self._load = load
        self.heartbeat = heartbeat
        self.notifier = notifier
        self.metrics = metrics
        self.model_info = model_info or {}
        self.current: Loaded | None = None
        self.state = State.LOADING
        self.since = time.monotonic()
        self.started = time.monotonic()
        self.last_active = time.monotonic()
        self.inflight = 0
        self.loads = 0
        self.load_error: str | None = None
        self._engine_task: asyncio.Task | None = None
        self._load_task: asyncio.Task | None = None
        self._changed = asyncio.Event()      # set on every state change (ready() waiters recheck)

    # ---- state ----
    def _set(self, state: State) -> None:
        self.state, self.since = state, time.monotonic()
        if self.metrics is not None:
            self.metrics.model_loaded.set(1 if state is State.READY else 0)
        self._changed.set()
        self._changed = asyncio.Event()

    def busy(self) -> bool:
        """Requests are in flight or the engine has work."""
        return self.inflight > 0 or (self.current is not None and not self.current.engine.scheduler.idle())

    # ---- loading ----
    async def load(self, reason: str) -> None:
        """Load the model of self.cfg, run one warm-up round, start its engine; state ready. Raises what the load
        callback raises (the state is then unloaded)."""
        self._set(State.LOADING if self.state is not State.RELOADING else State.RELOADING)
        t0 = time.monotonic()
        self.notifier.status(f"loading {self.model_info.get('name') or 'the model'} ({reason})")
        log.info("load", reason=reason, model=self.model_info.get("name"))
        loaded = None
        try:
            loaded = await self._load(self.cfg)
            loaded.engine.heartbeat = self.heartbeat
            self._engine_task = asyncio.create_task(loaded.engine.run())
            await loaded.warmup()
        except BaseException as e:
            self.load_error = str(e) or type(e).__name__
            if loaded is not None:
                loaded.engine.stop()
                if self._engine_task is not None:
                    await self._engine_task
                self._engine_task = None
                loaded.close()
            self._set(State.UNLOADED)
            raise
        self.current, self.model_info, self.load_error = loaded, loaded.model_info, None
        self.loads += 1
        self.last_active = time.monotonic()
        self._set(State.READY)
        log.info("loaded", reason=reason, model=self.model_info.get("name"),
                 load_ms=f"{(time.monotonic() - t0) * 1e3:.0f}")

    async def _load_once(self, reason: str) -> None:
        """Start a load unless one is running; wait for it (its exception included)."""
        if self._load_task is None or self._load_task.done():
            self._load_task = asyncio.create_task(self.load(reason))
        await asyncio.shield(self._load_task)

    async def ready(self) -> float:
        """Wait until a model serves; returns the milliseconds waited (also the reply's timings.load_ms). An
        unloaded model is loaded now. Raises ProtocolError: busy while stopping, internal when the load failed."""
        t0 = time.monotonic()
        self.last_active = t0
        waited = False
        while self.state is not State.READY:
            waited = True
            if self.state is State.STOPPING:
                raise P.ProtocolError("busy", "the daemon is shutting down", None)
            if self.state is State.UNLOADED:
                self.notifier.status("loading the model for a request")
                try:
                    await self._load_once("request")
                except Exception:
                    raise P.ProtocolError("internal", f"the model failed to load: {self.load_error}", None) from None
                continue
            await self._changed.wait()
        ms = round((time.monotonic() - t0) * 1e3, 3) if waited else 0.0
        self.last_active = time.monotonic()
        _LOAD_MS.set(ms)
        return ms

    async def unload(self, reason: str, next_state: State = State.UNLOADED) -> None:
        """Stop the engine and free the model and its pools, then enter `next_state`. Meanwhile the state is
        `unloading` (or `next_state` itself when that is not `unloaded`), so ready() waits."""
        loaded, task = self.current, self._engine_task
        if loaded is None:
            self._set(next_state)
            return
        # while the engine winds down, ready() waits (it must not start a load beside the model being freed)
        self._set(State.UNLOADING if next_state is State.UNLOADED else next_state)
        self.current, self._engine_task = None, None
        loaded.engine.stop()
        if task is not None:
            try:
                await task
            except Exception as e:               # it had died already (the monitor unloads a dead engine)
                log.error("engine_failed", error=repr(e))
        # KV-disk on: the retained states outlive the model (stop, idle unload, reload): written first, by rank
        await loaded.engine.flush_to_disk(asyncio.get_running_loop().time() + FLUSH_S)
        loaded.close()
        if self.metrics is not None:
            self.metrics.set_pool(0, 0, 0)
            self.metrics.lanes_busy.set(0)
            self.metrics.queue_depth.set(0)
        self._set(next_state)
        log.info("unloaded", reason=reason, model=self.model_info.get("name"))

    async def reload(self, cfg: Config, grace_s: float) -> bool:
        """Drain, free the model and load it again under `cfg` (a SIGHUP that changed keys needing a reload).
        When the new configuration fails to load, the previous one is loaded back. An unloaded model only takes
        the new configuration (it loads on the next request). Returns whether `cfg` is now in force."""
        if self.state is State.UNLOADED and self.current is None:
            self.cfg = cfg
            return True
        old = self.cfg
        self.notifier.reloading("draining requests for a reload")
        self._set(State.DRAINING)
        await self.drain(grace_s)
        await self.unload("reload", State.RELOADING)
        self.cfg = cfg
        ok = True
        try:
            await self.load("reload")
        except Exception as e:
            ok = False
            log.error("reload_failed", error=f"{type(e).__name__}: {e}", action="loading the previous configuration")
            self.cfg = old
            self._set(State.RELOADING)
            try:
                await self.load("reload_failed")
            except Exception as e2:
                log.error("load_failed", error=f"{type(e2).__name__}: {e2}")
        self.notifier.ready(self.status_line())
        return ok

    def begin_stop(self) -> None:
        """SIGTERM: from now on ready() answers `busy` and health says stopping; requests in flight go on."""
        self._set(State.STOPPING)

    # ---- draining ----
    async def drain(self, grace_s: float, hurry: asyncio.Event | None = None) -> int:
        """Wait up to grace_s for the requests in flight to finish (less when `hurry` is set), then cancel the
        rest and wait for their ends (5 s at most; 1 s when hurried). Returns how many were cancelled."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while self.busy() and loop.time() < deadline and not (hurry is not None and hurry.is_set()):
            await asyncio.sleep(0.02)
        if not self.busy() or self.current is None:
            return 0
        n = self.current.engine.cancel_all()
        log.warning("shutdown_cancel", requests=n)
        deadline = loop.time() + 5.0
        while self.busy() and loop.time() < deadline:
            if hurry is not None and hurry.is_set():
                deadline = min(deadline, loop.time() + 1.0)
            await asyncio.sleep(0.01)
        return n

    # ---- background duties ----
    async def monitor(self) -> None:
        """Forever: idle unload after cfg.server.idle_unload_s without requests, the watchdog while no engine
        runs, and a STATUS= line whenever what it says changes."""
        last_status = None
        while True:
            idle_s = self.cfg.server.idle_unload_s
            now = time.monotonic()
            task = self._engine_task
            if self.state is State.READY and task is not None and task.done():
                # the round loop ended by itself (an error it could not contain): its requests cannot finish;
                # unload it (they get an error at the unload) and the next request loads a fresh one
                err = task.exception() if not task.cancelled() else None
                log.error("engine_stopped", error=repr(err))
                await self.unload("the engine stopped")
                continue
            if self.busy():
                self.last_active = now
            if self.state is not State.READY:
                self.heartbeat.keepalive()
            elif idle_s > 0 and now - self.last_active >= idle_s and not self.busy():
                await self.unload(f"idle for {idle_s:g} s")
            text = self.status_line()
            if text != last_status:
                self.notifier.status(text)
                last_status = text
            await asyncio.sleep(min(0.25, max(0.02, idle_s / 8)) if idle_s > 0 else 0.25)

    def status_line(self) -> str:
        """The STATUS= line of the state now ("serving NAME: 2 running, 1 waiting", "idle: model unloaded...")."""
        name = self.model_info.get("name") or "the model"
        if self.state is State.READY and self.current is not None:
            c = self.current.engine.scheduler.counts()
            running, waiting = c["prefill"] + c["decode"], c["waiting"]
            return f"serving {name}: {running} running, {waiting} waiting" if running or waiting else \
                f"serving {name}: idle"
        if self.state is State.UNLOADED:
            return f"idle: {name} unloaded; it loads on the next request"
        return f"{self.state.value} {name}"

    # ---- the Edge the fronts see ----
    @property
    def edge(self):
        """The Edge of the model serving now. Raises RuntimeError when none is loaded (await ready() first)."""
        if self.current is None:
            raise RuntimeError(f"no model is loaded (state {self.state.value}); a front awaits ready() first")
        return self.current.edge

    def __getattr__(self, name: str):   # prepare_chat, prepare_completion, tokenize, detokenize, ...
        if name.startswith("_") or "current" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.edge, name)

    async def stream(self, gen):
        """Edge.stream of the model serving now, with the wait of ready() as the reply's timings.load_ms; the
        request counts as in flight until its last event."""
        load_ms = _LOAD_MS.get()
        edge = self.edge
        self.inflight += 1
        counted = True

        def ended() -> None:     # at the last event, not when the consumer closes the generator (maybe never)
            nonlocal counted
            if counted:
                counted = False
                self.inflight -= 1
                self.last_active = time.monotonic()

        try:
            async for ev in edge.stream(gen):
                if isinstance(ev, EdgeDone):
                    if load_ms:
                        ev = replace(ev, timings=replace(ev.timings, load_ms=load_ms))
                    ended()
                elif isinstance(ev, EdgeError):
                    ended()
                yield ev
        finally:
            ended()

    def cancel(self, rid, reason=None) -> bool:
        if self.current is None:
            return False
        return self.edge.cancel(rid) if reason is None else self.edge.cancel(rid, reason)

    def reset(self) -> int:
        return self.edge.reset() if self.current is not None else 0

    def metrics_text(self) -> str:
        return self.metrics.render() if self.metrics is not None else ""

    def status(self) -> dict:
        """The `status` op: the model's status (empty_status while none is loaded) plus `daemon`: state, pid,
        uptime_s, state_s (seconds in this state), loads, idle_unload_s, heartbeat_age_s, inflight."""
        st = self.current.edge.status() if self.current is not None else empty_status(self.model_info)
        now = time.monotonic()
        st["daemon"] = {"state": self.state.value, "pid": os.getpid(), "uptime_s": round(now - self.started, 3),
                        "state_s": round(now - self.since, 3), "loads": self.loads,
                        "idle_unload_s": self.cfg.server.idle_unload_s,
                        "heartbeat_age_s": round(self.heartbeat.age_s(), 3), "inflight": self.inflight}
        return st

    def health(self) -> dict:
        """The `health` op, honestly: ok, model, state, reason (None when ok), heartbeat_age_s (seconds since the
        round loop last beat), inflight (requests in flight)."""
        reason = None
        if self.state is State.READY:
            reason = self.heartbeat.stalled(self.busy())
        elif self.state in (State.UNLOADED, State.UNLOADING):
            reason = f"load_failed: {self.load_error}" if self.load_error else None
        elif self.state in (State.LOADING, State.RELOADING):
            reason = "loading: the model is not loaded yet"
        elif self.state is State.DRAINING:
            reason = "reloading: draining requests before the model loads again"
        else:
            reason = "stopping"
        return {"ok": reason is None, "model": self.model_info.get("name"), "state": self.state.value,
                "reason": reason, "heartbeat_age_s": round(self.heartbeat.age_s(), 3), "inflight": self.inflight}
