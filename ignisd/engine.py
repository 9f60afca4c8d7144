"""The round loop: the one coroutine that owns the scheduler and the cache (DESIGN §2).

Commands from the server (Submit, Cancel) are queued and applied only between rounds; each round's forward pass
runs in one worker thread so the event loop keeps serving sockets. Events go back to per-request asyncio queues.
When the daemon goes idle the pool's integrity check runs once (free + held = total, refcounts = holders).
"""
from __future__ import annotations

import asyncio
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from ignisd.disk_traffic import DiskTraffic
from ignisd.log import get_logger
from ignisd.request import Cancel, DoneEvent, ErrorEvent, FinishReason, Request, Submit, TokenEvent
from ignisd.plan import RoundPlan
from ignisd.scheduler import Scheduler
from ignisd.sequence import AdmissionError, QueueFull
from ignisd.vocab import DISK

log = get_logger("sched")


class Engine:
    """Runs rounds until stopped.

    scheduler: the Scheduler (its CacheManager is `scheduler.cache`). runner: executes RoundPlans (ignisd.runner),
    returning a RoundResult. metrics: ignisd.metrics.Metrics or None. disk: the KV-disk DiskStore (None: off); its
    reads and writes run as tasks on this loop (ignisd/disk_traffic.py).
    """

    def __init__(self, scheduler: Scheduler, runner, metrics=None, disk=None):
        self.scheduler = scheduler
        self.cache = scheduler.cache
        self.runner = runner
        self.metrics = metrics
        self._commands: list = []
        self._wake = asyncio.Event()
        arena = getattr(runner, "arena", None)     # KV-disk reads land in free arena extents (pre-touched memory)
        self.disk = DiskTraffic(self.cache, disk, self._wake.set, metrics,
                                arena=arena.memory() if arena is not None and arena.nbytes else None)
        self._counted: dict[str, int] = {}
        self._handles: dict[str, asyncio.Queue] = {}
        self._last_token_at: dict[str, float] = {}
        # torch's intra-op thread count is per OS thread under OpenMP: the worker sets its own (Runner.init_thread)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ignis-forward",
                                            initializer=getattr(runner, "init_thread", None))
        self._stopping = False
        self.rounds = 0
        self.integrity_checks = 0
        self.integrity_failures = 0
        self.bookkeeping_failures = 0
        # lifecycle hook (ignisd.health.Heartbeat): beat() after every round, on waking, and every idle_wait_s
        # seconds while idle, so the systemd watchdog and `health` see the loop itself make progress
        self.heartbeat = None

    # ---- server side ----
    def submit(self, req: Request) -> asyncio.Queue:
        """Queue `req`; returns the queue its events arrive on: one AdmittedEvent when it gets a lane, TokenEvents,
        then one DoneEvent or ErrorEvent (an ErrorEvent may also come before admission).

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
        self.update_gauges()

    def update_gauges(self) -> None:
        """Set the gauges (pool, lanes, queue, tiers) from the scheduler and the cache now."""
        m = self.metrics
        if m is None:
            return
        c = self.scheduler.counts()
        m.kv_pool_used_pages.set(self.cache.pool.used)
        m.lanes_busy.set(c["prefill"] + c["decode"])
        m.queue_depth.set(c["waiting"])
        for row in self.cache.tiers.rows(self.cache):
            m.tier_bytes_used.labels(tier=row["tier"]).set(row["bytes_used"])
            m.tier_bytes_total.labels(tier=row["tier"]).set(row["bytes_total"])
            m.tier_states.labels(tier=row["tier"]).set(row["states"])
        counts = self.cache.tiers.counts
        for tier in ("ram", "disk"):
            key = f"demotions_{tier}"
            new = counts[key] - self._counted.get(key, 0)
            if new:
                m.tier_demotions.labels(tier=tier).inc(new)
                self._counted[key] = counts[key]

    async def run(self) -> None:
        """The round loop; returns after stop(). Should it end by an exception (one it could not contain), every
        request in flight first gets an ``internal`` error, so no client waits on a loop that is gone."""
        try:
            await self._run()
        except Exception as e:
            for rid in list(self._handles):
                self._handles.pop(rid).put_nowait(ErrorEvent(rid, "internal", f"the engine stopped: {e!r}", None))
            raise

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        checked = True
        while not self._stopping:
            self._apply_commands()
            self.disk.poll()
            if self.scheduler.idle():
                self.update_gauges()
                if not checked:
                    try:
                        self.cache.check_integrity()
                    except AssertionError as e:   # a bookkeeping bug: say so loudly, keep serving
                        log.error("integrity_failed", error=str(e))
                        self.integrity_failures += 1
                    self.integrity_checks += 1
                    checked = True
                self._wake.clear()
                if not self._commands and not self._stopping:
                    await self._sleep()
                continue
            checked = False
            try:
                plan = self.scheduler.schedule()
            except Exception as e:          # a bookkeeping bug: fail what is queued and running, keep serving
                self._bookkeeping_failed("schedule", e, None)
                continue
            for ev in self.scheduler.take_admitted():   # before the round: its prefill may take seconds
                self._emit(ev)
            if plan.empty:
                self._wake.clear()
                self.disk.poll()          # reads this schedule() asked for (an evicted sequence's file): they wake it
                await self._sleep()
                continue
            prefill_tokens, decode_tokens = plan.prefill_tokens, plan.decode_tokens
            t0 = time.perf_counter()
            try:
                result = await loop.run_in_executor(self._executor, self.runner.execute, plan)
            except Exception as e:  # a failed forward fails only the requests in it
                log.error("round_failed", error=repr(e))
                self.scheduler.fail_round(plan)
                self._fail([it.seq_id for it in plan.items] + [mv.state_id for mv in plan.moves],
                           f"forward pass failed: {e!r}")
                continue
            self.rounds += 1
            log.debug("round", n=self.rounds, prefill_tokens=prefill_tokens, decode_tokens=decode_tokens,
                      sequences=len({it.seq_id for it in plan.items}), restores=len(plan.restores),
                      captures=sum(len(it.captures) for it in plan.items), moves=len(plan.moves),
                      ms=round((time.perf_counter() - t0) * 1000, 1))
            if self.heartbeat is not None:
                self.heartbeat.beat()
            try:
                events = self.scheduler.update(plan, result.items)
            except Exception as e:          # a bookkeeping bug: fail the round's requests, keep serving
                self._bookkeeping_failed("update", e, plan)
                continue
            self.disk.written_out(result.snapshots)
            if self.metrics is not None:
                for rs in plan.restores:
                    self.metrics.tier_restores.labels(tier=rs.tier).inc()
                for tier, (nbytes, seconds) in result.restored.items():
                    self.metrics.tier_restore_bytes.labels(tier=tier).inc(nbytes)
                    self.metrics.tier_restore_seconds.labels(tier=tier).inc(seconds)
            if self.metrics is not None:
                self.metrics.prefill_tokens_total.inc(prefill_tokens)
                self.metrics.decode_tokens_total.inc(decode_tokens)
            self._observe(events)
            for ev in events:
                self._emit(ev)
            await asyncio.sleep(0)  # let the server write what this round produced
        self._executor.shutdown(wait=True)

    def _fail(self, rids, message: str) -> None:
        """End each of `rids` (once each, in order) with an ``internal`` error naming `message`."""
        for rid in dict.fromkeys(rids):
            for ev in self.scheduler.cancel(rid, FinishReason.CANCELLED):
                self._emit(ErrorEvent(ev.rid, "internal", message, None))

    def _bookkeeping_failed(self, where: str, e: Exception, plan: RoundPlan | None) -> None:
        """scheduler.schedule() or .update() raised (a bug in the control plane, not a bad request): log it with its
        traceback, fail the round's requests (every queued and running one when no plan was made, since the one
        that trips it would trip it again), and let the loop go on; the idle integrity check then says whether the
        accounting survived. A failure while failing them propagates (the host restarts the engine)."""
        log.error("round_bookkeeping_failed", where=where, error=repr(e),
                  traceback="".join(traceback.format_exception(e)).replace("\n", " | "))
        self.bookkeeping_failures += 1
        if plan is not None:
            self.scheduler.fail_round(plan)
            rids = [it.seq_id for it in plan.items]
        else:
            rids = [s.rid for s in list(self.scheduler.running) + list(self.scheduler.waiting)]
        self._fail(rids, f"internal error in the scheduler ({where}): {e!r}")

    async def flush_to_disk(self, deadline: float) -> int:
        """Shutdown with KV-disk on: write the retained states not yet on disk, highest rank first, until `deadline`
        (loop time); call after the round loop stopped. Returns how many files were written."""
        if self.disk.disk is None:
            return 0
        await self.disk.drain(max(0.0, deadline - asyncio.get_running_loop().time()))
        pending = self.cache.plan_moves()       # moves decided but never run: their bytes must be in place first
        moves = self.cache.plan_flush()
        if not moves and not pending:
            return 0
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(max_workers=1, initializer=getattr(self.runner, "init_thread", None)) as ex:
            result = await loop.run_in_executor(ex, self.runner.execute, RoundPlan((), (), tuple(pending + moves)))
        n = await self.disk.flush(result.snapshots, deadline)
        log.info("kv_disk_flush", written=n, planned=len(moves))
        return n

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
        self.update_gauges()
        return n

    def status(self) -> dict:
        """The engine's part of the `status` op: lanes, queue, requests, and the cache's kv_pool, slots, tiers,
        retained and live_states; the disk tier's row gains ``in_flight`` (KV-disk file reads and writes running
        now)."""
        c = self.scheduler.counts()
        cache = self.cache.status()
        for row in cache.get("tiers", ()):
            if row["tier"] == DISK:          # files being read or written now (their bytes still in memory)
                row["in_flight"] = self.disk.in_flight
        return {
            "lanes": {k: c[k] for k in ("total", "prefill", "decode", "evicted")},
            "queue": {"waiting": c["waiting"]},
            "requests": self.scheduler.requests(),
            **cache,
        }
