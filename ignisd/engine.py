"""The round loop: the one coroutine that owns the scheduler and the cache (DESIGN §2).

Commands from the server (Submit, Cancel) are queued and applied only between rounds; each round's forward pass
runs in one worker thread so the event loop keeps serving sockets. Events go back to per-request asyncio queues.
When the daemon goes idle the pool's integrity check runs once (free + held = total, refcounts = holders).
"""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from ignisd.log import get_logger
from ignisd.request import Cancel, DoneEvent, ErrorEvent, FinishReason, Request, Submit, TokenEvent
from ignisd.scheduler import Scheduler
from ignisd.sequence import AdmissionError, QueueFull

log = get_logger("sched")


class Engine:
    """Runs rounds until stopped.

    scheduler: the Scheduler (its CacheManager is `scheduler.cache`). runner: executes RoundPlans (ignisd.runner).
    metrics: ignisd.metrics.Metrics or None.
    """

    def __init__(self, scheduler: Scheduler, runner, metrics=None):
        self.scheduler = scheduler
        self.cache = scheduler.cache
        self.runner = runner
        self.metrics = metrics
        self._commands: list = []
        self._wake = asyncio.Event()
        self._handles: dict[str, asyncio.Queue] = {}
        self._last_token_at: dict[str, float] = {}
        # torch's intra-op thread count is per OS thread under OpenMP: the worker sets its own (Runner.init_thread)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ignis-forward",
                                            initializer=getattr(runner, "init_thread", None))
        self._stopping = False
        self.rounds = 0
        self.integrity_checks = 0
        # lifecycle hook (ignisd.health.Heartbeat): beat() after every round, on waking, and every idle_wait_s
        # seconds while idle, so the systemd watchdog and `health` see the loop itself make progress
        self.heartbeat = None

    # ---- server side ----
    def submit(self, req: Request) -> asyncio.Queue:
        """Queue `req`; returns the queue its TokenEvent / DoneEvent / ErrorEvent objects arrive on.

        Raises ValueError if a request with the same rid is in flight.
        """
        if req.rid in self._handles:
            raise ValueError(f"request {req.rid} already in flight")
        q: asyncio.Queue = asyncio.Queue()
        self._handles[req.rid] = q
        self._commands.append(Submit(req))
        self._wake.set()
        return q

    def cancel(self, rid: str, reason: FinishReason = FinishReason.CANCELLED) -> bool:
        """Ask the engine to end `rid` at the next round boundary. Returns whether it was in flight."""
        if rid not in self._handles:
            return False
        self._commands.append(Cancel(rid, reason))
        self._wake.set()
        return True

    def cancel_all(self) -> int:
        """Cancel every request in flight (shutdown); returns how many were asked to end."""
        rids = list(self._handles)
        for rid in rids:
            self.cancel(rid)
        return len(rids)

    def stop(self) -> None:
        """Make `run()` return after the round in flight."""
        self._stopping = True
        self._wake.set()

    # ---- the loop ----
    def _emit(self, ev) -> None:
        q = self._handles.get(ev.rid)
        if q is None:
            return
        q.put_nowait(ev)
        if isinstance(ev, (DoneEvent, ErrorEvent)):
            del self._handles[ev.rid]
            self.runner.forget(ev.rid)
            self._last_token_at.pop(ev.rid, None)

    def _apply_commands(self) -> None:
        cmds, self._commands = self._commands, []
        for cmd in cmds:
            if isinstance(cmd, Submit):
                try:
                    self.scheduler.submit(cmd.request)
                except AdmissionError as e:
                    self._emit(ErrorEvent(cmd.request.rid, e.code, e.message, e.field))
                except QueueFull as e:
                    self._emit(ErrorEvent(cmd.request.rid, "busy", str(e), None))
            elif isinstance(cmd, Cancel):
                for ev in self.scheduler.cancel(cmd.rid, cmd.reason):
                    self._emit(ev)

    def _observe(self, events) -> None:
        m = self.metrics
        now = time.monotonic()
        for ev in events:
            if isinstance(ev, TokenEvent):
                last = self._last_token_at.get(ev.rid)
                if last is not None and m is not None:
                    m.inter_token_seconds.observe(now - last)
                self._last_token_at[ev.rid] = now
            elif isinstance(ev, DoneEvent) and m is not None:
                m.request_done(ev)     # TTFT, prompt / generation tokens, prefix-cache queries and hits
        self._update_gauges()

    def _update_gauges(self) -> None:
        m = self.metrics
        if m is None:
            return
        c = self.scheduler.counts()
        m.kv_pool_used_pages.set(self.cache.pool.used)
        m.lanes_busy.set(c["prefill"] + c["decode"])
        m.queue_depth.set(c["waiting"])

    async def run(self) -> None:
        """The round loop; returns after stop()."""
        loop = asyncio.get_running_loop()
        checked = True
        while not self._stopping:
            self._apply_commands()
            if self.scheduler.idle():
                self._update_gauges()
                if not checked:
                    self.cache.check_integrity()
                    self.integrity_checks += 1
                    checked = True
                self._wake.clear()
                if not self._commands and not self._stopping:
                    await self._sleep()
                continue
            checked = False
            plan = self.scheduler.schedule()
            if plan.empty:
                self._wake.clear()
                await self._sleep()
                continue
            prefill_tokens, decode_tokens = plan.prefill_tokens, plan.decode_tokens
            try:
                results = await loop.run_in_executor(self._executor, self.runner.execute, plan)
            except Exception as e:  # a failed forward fails only the requests in it
                log.error("round_failed", error=repr(e))
                self.scheduler.fail_round(plan)
                for rid in dict.fromkeys(it.seq_id for it in plan.items):
                    for ev in self.scheduler.cancel(rid, FinishReason.CANCELLED):
                        self._emit(ErrorEvent(ev.rid, "internal", f"forward pass failed: {e!r}", None))
                continue
            self.rounds += 1
            if self.heartbeat is not None:
                self.heartbeat.beat()
            events = self.scheduler.update(plan, results)
            if self.metrics is not None:
                self.metrics.prefill_tokens_total.inc(prefill_tokens)
                self.metrics.decode_tokens_total.inc(decode_tokens)
            self._observe(events)
            for ev in events:
                self._emit(ev)
            await asyncio.sleep(0)  # let the server write what this round produced
        self._executor.shutdown(wait=True)

    async def _sleep(self) -> None:
        """Wait for a command; with a heartbeat, beat every heartbeat.idle_wait_s meanwhile and once on waking."""
        hb = self.heartbeat
        while hb is not None and not self._wake.is_set():
            hb.beat()
            try:
                await asyncio.wait_for(self._wake.wait(), hb.idle_wait_s)
            except TimeoutError:
                pass
        await self._wake.wait()
        if hb is not None:
            hb.beat()

    def reset(self) -> int:
        """The `reset` op: drop every retained state (pinned ones when their restore lets go). Returns how many were
        freed now (0 with reuse off). Runs on the event loop, like schedule() and update()."""
        n = self.cache.reset()
        self._update_gauges()
        return n

    def status(self) -> dict:
        """The engine's part of the `status` op: lanes, queue, requests, and the cache's kv_pool, slots, tiers,
        retained and live_states."""
        c = self.scheduler.counts()
        return {
            "lanes": {k: c[k] for k in ("total", "prefill", "decode", "evicted")},
            "queue": {"waiting": c["waiting"]},
            "requests": self.scheduler.requests(),
            **self.cache.status(),
        }
