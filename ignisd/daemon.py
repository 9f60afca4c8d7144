"""Composition root and process lifecycle: listeners, the model host, signals, sd_notify (DESIGN §2-§3, issue 13).

Start: every check that needs no weights (exit 2 naming the key), then the socket listens — bound here with its
mode and group set before it listens, or passed by systemd (LISTEN_FDS, ignisd.systemd) — so `health` answers
``ok: false, state: loading`` while the weights load in a worker thread (a tqdm bar on a terminal, STATUS= lines
under systemd). After one warm-up round: READY=1. The model itself (pools, engine, edge) is ignisd.model_stack;
its life (idle unload, reload, honest health) is ignisd.lifecycle.ModelHost.

Signals: SIGTERM / SIGINT stop accepting, give running requests server.shutdown_grace_s, cancel the rest (each ends
with its `done`), remove the socket (not one systemd passed) and exit 0; a second one cuts the grace and exits at
once. SIGHUP re-reads the configuration (the --config file, then the same flags): keys that need a reload drain and
reload, the others apply at once, listener keys wait for a restart; one `reload` log line says which
(ignisd.reload).
"""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path

from ignisd.config import Config, ConfigError, parse_serve_args
from ignisd.fronts.http import HttpFront
from ignisd.fronts.ndjson import NdjsonFront
from ignisd.health import Heartbeat
from ignisd.lifecycle import ModelHost, State
from ignisd.log import get_logger, set_level
from ignisd.metrics import Metrics, MetricsListener
from ignisd.model_stack import ModelStack, preflight
from ignisd.preflight import StartupError, read_api_key
from ignisd.progress import LoadProgress
from ignisd.reload import effective_config, plan_reload
from ignisd.server import Server
from ignisd.systemd import Notifier, inherited_sockets, match_sockets
from ignisd.torch_threads import run_in_fresh_thread
from ignisd.unix_socket import bind_socket, prepare_socket, set_socket_access, socket_gid

log = get_logger("srv")


class Daemon:
    """The whole process. Build with ``Daemon(cfg, argv)`` (argv: the `ignisd serve` flags, re-parsed on SIGHUP),
    run with ``await daemon.run()``. Raises StartupError for what cannot start."""

    def __init__(self, cfg: Config, argv: list[str] | None = None):
        self.cfg, self.argv = cfg, list(argv) if argv is not None else None
        self.notifier = Notifier()
        try:
            socks = inherited_sockets()
        except ValueError as e:
            raise StartupError(f"socket activation: {e}", exit_code=2) from None
        self.listeners, unused = match_sockets(socks)
        for s in unused:
            log.warning("inherited_socket_unused", name=s.name, address=s.describe(),
                        expected="FileDescriptorName=ndjson or http")
            s.sock.close()
        self.inherited = "ndjson" in self.listeners
        if not self.inherited:   # everything that can be refused without the weights is refused before they load
            prepare_socket(cfg.server.socket)
        self.socket_gid = socket_gid(cfg.server.socket_group)
        self._plan = preflight(cfg)
        self.metrics = Metrics()
        self.heartbeat = Heartbeat(self.notifier)
        self.host = ModelHost(cfg, self._load, heartbeat=self.heartbeat, notifier=self.notifier,
                              metrics=self.metrics, model_info=self._plan.model_info())
        self._api_key = self._plan.api_key
        self.request_log = _open_request_log(cfg)
        self.server = Server(NdjsonFront(self.host, cfg.server.strip_billing_header, self.request_log),
                             max_line_bytes=cfg.server.max_line_bytes,
                             max_inflight=cfg.server.max_inflight_per_connection, api_key=self._api_key,
                             metrics=self.metrics)
        self.http: HttpFront | None = None
        self.socket_path = cfg.server.socket
        self.metrics_listener: MetricsListener | None = None
        self._reload_lock = asyncio.Lock()

    async def _load(self, cfg: Config) -> ModelStack:
        """The host's load callback: preflight (the start's own, once) and the weights in a thread of their own that
        exits after the load (torch_threads: its OpenMP team must not outlive it)."""
        plan, self._plan = (self._plan, None) if self._plan is not None and self._plan.cfg is cfg else \
            (None, None)
        if plan is None:
            plan = preflight(cfg)
        progress = LoadProgress(plan.source.spec.name, self.notifier)
        return await run_in_fresh_thread(ModelStack, plan, self.metrics, progress)

    # ---- run ----
    async def run(self) -> None:
        """Listen, load, serve until SIGTERM / SIGINT, then stop (see the module docstring)."""
        loop = asyncio.get_running_loop()
        self._stop, self._hurry = asyncio.Event(), asyncio.Event()

        def on_stop() -> None:
            (self._hurry if self._stop.is_set() else self._stop).set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_stop)
        loop.add_signal_handler(signal.SIGHUP, lambda: asyncio.ensure_future(self.reload()))
        monitor = asyncio.create_task(self.host.monitor())
        try:
            await self._listen()
            loading = asyncio.create_task(self.host.load("start"))
            stopping = asyncio.create_task(self._stop.wait())
            await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not loading.done():      # stopped while the weights load: nothing to save, exit now
                self.notifier.stopping("stopped while loading")
                self._remove_socket()
                log.info("stopped", during="load")
                logging.shutdown()
                os._exit(0)
            stopping.cancel()
            loading.result()            # raises StartupError when the load failed
            self.notifier.ready(self.host.status_line())
            log.info("ready", model=self.host.model_info.get("name"), socket=self.socket_path,
                     watchdog_s=self.notifier.watchdog_timeout_s)
            await self._stop.wait()
            await self._shutdown()
        finally:
            monitor.cancel()
            if self.request_log is not None:
                self.request_log.close()
            if self.metrics_listener is not None:
                self.metrics_listener.close()
            if self.http is not None:
                await self.http.close()
            self._remove_socket()

    async def _listen(self) -> None:
        cfg = self.cfg.server
        sock = self.listeners.get("ndjson")
        if sock is None:
            sock = bind_socket(self.socket_path, cfg.socket_mode, self.socket_gid)
        else:
            self.socket_path = sock.getsockname() or "(inherited)"
        await self.server.start(sock=sock)
        inherited_http = self.listeners.pop("http", None)
        if cfg.http_listen or inherited_http is not None:   # HTTP fronts on the same loop, over the model host
            self.http = HttpFront(api_key=self._api_key, strip_billing_header=cfg.strip_billing_header,
                                  max_body_bytes=cfg.max_line_bytes, metrics=self.metrics,
                                  request_log=self.request_log)
            self.http.attach(self.host)
            await self.http.start(cfg.http_listen or "", cfg.socket_mode, self.socket_gid, sock=inherited_http)
        if cfg.metrics_listen:
            try:
                self.metrics_listener = MetricsListener(self.metrics, cfg.metrics_listen)
            except (OSError, ValueError) as e:
                raise StartupError(f"server.metrics_listen {cfg.metrics_listen}: cannot listen: {e}",
                                   exit_code=2) from None
            host, port = self.metrics_listener.address
            log.info("metrics_listening", address=f"{host}:{port}")
        log.info("listening", socket=self.socket_path, pid=os.getpid(), inherited=self.inherited)

    def _remove_socket(self) -> None:
        if not self.inherited:      # a socket systemd passed belongs to the socket unit
            try:
                if Path(self.socket_path).is_socket():
                    Path(self.socket_path).unlink()
            except OSError:
                pass

    async def _shutdown(self) -> None:
        host = self.host
        self.notifier.stopping("stopping: finishing running requests")
        sched = host.current.engine.scheduler if host.current is not None else None
        log.info("stopping", running=len(sched.running) if sched else 0, waiting=len(sched.waiting) if sched else 0,
                 grace_s=self.cfg.server.shutdown_grace_s)
        host.begin_stop()
        self.server.stop_listening()
        if self.http is not None:
            await self.http.stop_listening()
        await host.drain(self.cfg.server.shutdown_grace_s, self._hurry)
        await self.server.close()
        if self.http is not None:
            await self.http.close()
        if self._hurry.is_set():     # a second signal: do not wait for a long round to end
            done, _ = await asyncio.wait({asyncio.ensure_future(host.unload("stop", State.STOPPING))}, timeout=1)
            if not done:
                self._remove_socket()
                log.warning("stopped", forced=True)
                logging.shutdown()
                os._exit(0)
        else:
            await host.unload("stop", State.STOPPING)
        log.info("stopped", forced=self._hurry.is_set())

    # ---- SIGHUP ----
    async def reload(self) -> None:
        """Re-read the configuration and apply it (see ignisd.reload). A configuration that does not parse, or
        names a key file or group that cannot be used, is refused: nothing changes and the log says why."""
        async with self._reload_lock:
            if self._stop.is_set():
                return
            while self.host.state is State.LOADING and self.host.current is None and self.host.loads == 0:
                await asyncio.sleep(0.05)          # the first load finishes first
            if self.argv is None:
                log.warning("reload_refused", reason="no command line to re-read")
                return
            try:
                new = parse_serve_args(self.argv)
            except (ConfigError, SystemExit) as e:
                log.error("reload_refused", error=str(e))
                return
            plan = plan_reload(self.cfg, new)
            eff = effective_config(self.cfg, new)
            try:
                api_key = read_api_key(eff.server.api_key_file)
                gid = socket_gid(eff.server.socket_group)
                if plan.needs_reload:
                    preflight(eff)
            except StartupError as e:
                log.error("reload_refused", error=str(e))
                return
            log.info("reload", config=self.cfg.config_file, applied_now=",".join(plan.now) or None,
                     reloading=",".join(plan.reload) or None, restart_needed=",".join(plan.restart) or None)
            if plan.empty:
                return
            self.notifier.reloading("applying a re-read configuration")
            self._apply_now(eff, api_key, gid)
            ok = True
            if plan.needs_reload:
                ok = await self.host.reload(eff, self.cfg.server.shutdown_grace_s)
            self.cfg = eff if ok else effective_config(self.cfg, eff, plan.reload)
            self.host.cfg = self.cfg
            self.notifier.ready(self.host.status_line())
            log.info("reloaded", ok=ok, model=self.host.model_info.get("name"))

    def _apply_now(self, cfg: Config, api_key: str | None, gid: int | None) -> None:
        """Apply the keys that take effect at once (ignisd.reload: "now")."""
        s = cfg.server
        set_level(s.log_level)
        self.server.api_key = api_key
        self.server.max_inflight = s.max_inflight_per_connection
        self.server.max_line_bytes = s.max_line_bytes
        if not self.inherited:
            try:
                set_socket_access(self.socket_path, s.socket_mode, gid)
            except OSError as e:
                log.error("socket_access", socket=self.socket_path, error=e.strerror)
        self.socket_gid = gid
        stack = self.host.current
        if stack is not None:
            stack.edge.default_max_tokens = s.default_max_tokens
            stack.edge.prompts.developer_policy = s.developer_message_policy
            stack.edge.prompts.canonicalize_tools = s.canonicalize_tools
        self.server.front.strip_billing_header = s.strip_billing_header
        if self.http is not None:
            self.http.strip_billing_header = s.strip_billing_header
        if (s.request_log, s.request_log_bytes) != (self.cfg.server.request_log, self.cfg.server.request_log_bytes):
            old_log = self.request_log
            try:
                self.request_log = _open_request_log(cfg)
            except StartupError as e:
                log.error("request_log", error=str(e))
                self.request_log = None
            self.server.front.request_log = self.request_log
            if self.http is not None:
                self.http.request_log = self.request_log
            if old_log is not None:
                old_log.close()
            stack.scheduler.max_queue = s.max_queue
        self.host.cfg = effective_config(cfg, self.host.cfg, _now_keys(self.host.cfg, cfg))


def _open_request_log(cfg: Config):
    """The RequestLog of server.request_log (None when off). Raises StartupError (exit 2) naming the key when the
    file cannot be opened."""
    from ignisd.request_log import RequestLog
    s = cfg.server
    if not s.request_log:
        return None
    try:
        return RequestLog(s.request_log, s.request_log_bytes)
    except OSError as e:
        raise StartupError(f"server.request_log {s.request_log}: cannot open: {e.strerror or e}", exit_code=2) \
            from None


def _now_keys(old: Config, new: Config) -> list[str]:
    """The changed keys that apply at once (the host keeps its reload keys until it reloads)."""
    from ignisd.reload import changed_keys, key_kind
    return [k for k in changed_keys(old, new) if key_kind(k) == "now"]
