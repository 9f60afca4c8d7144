"""The model host in-process (ignisd/lifecycle.py): honest health while loading and when the round loop stalls (the
watchdog pings stop, on a real datagram socket standing in for NOTIFY_SOCKET), idle unload and the load on the next
request (its wait is timings.load_ms), reload with a drain, and stopping. The engine, scheduler and cache are the
real ones; the forward pass is a fake runner that can be made to hang."""
from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from ignis_client import protocol as P

from ignisd.cache.manager import CacheManager
from ignisd.cache.page_pool import PagePool
from ignisd.config import Config, with_overrides
from ignisd.edge_events import EdgeDone, EdgeError, Timings, Usage
from ignisd.engine import Engine
from ignisd.health import Heartbeat
from ignisd.lifecycle import ModelHost, State
from ignisd.metrics import Metrics
from ignisd.plan import ItemResult, RoundResult
from ignisd.prompt import Reuse
from ignisd.request import DoneEvent, ErrorEvent, FinishReason, Request, SamplingParams
from ignisd.scheduler import Scheduler
from ignisd.systemd import Notifier


class Runner:
    """Answers every sampled item with token 7; `gate` (a threading.Event), when set up, makes a round wait for it;
    `entered` is set when a round starts; `delay` seconds per round."""

    def __init__(self):
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.delay = 0.0

    def execute(self, plan):
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(30)
        if self.delay:
            time.sleep(self.delay)
        return RoundResult([ItemResult(token_id=7 if it.sample else None) for it in plan.items])

    def forget(self, rid):
        pass


class FakeEdge:
    def __init__(self, engine):
        self.engine = engine

    async def stream(self, req: Request):
        q = self.engine.submit(req)
        while not isinstance(ev := await q.get(), (DoneEvent, ErrorEvent)):
            pass
        if isinstance(ev, ErrorEvent):              # as the real Edge does
            yield EdgeError(ev.code, ev.message, ev.field)
            return
        yield EdgeDone("", ev.finish_reason, Usage(ev.prompt_tokens, ev.generated_tokens, 0),
                       Timings(ev.queue_ms, 0.0, ev.ttft_ms, 0.0, 0.0), Reuse(None, None, 0, "miss", None, None))

    def status(self):
        return {"model": {"name": "fake"}, "lanes": {}}

    def cancel(self, rid, reason=FinishReason.CANCELLED):
        return self.engine.cancel(rid, reason)


class Stack:
    """A Loaded for the host: real scheduler + engine over a fake runner."""

    def __init__(self, cfg: Config, runner: Runner):
        cache = CacheManager(PagePool(64, 64), 1)
        self.scheduler = Scheduler(cache, lanes=cfg.server.lanes, context_tokens=4096, prefill_chunk=64,
                                   round_prefill_tokens=256, max_queue=16)
        self.engine = Engine(self.scheduler, runner)
        self.edge = FakeEdge(self.engine)
        self.model_info = {"name": "fake", "lanes": cfg.server.lanes}
        self.closed = False

    async def warmup(self):
        pass

    def close(self):
        self.closed = True


def req(rid, max_tokens=3):
    return Request(rid, [1, 2, 3], SamplingParams(max_tokens=max_tokens, temperature=0.0))


def make_host(cfg=None, notifier=None, load_delay=0.0, fail=None):
    runner = Runner()
    stacks: list[Stack] = []

    async def load(c):
        await asyncio.sleep(load_delay)
        if fail is not None and fail(c):
            raise RuntimeError("cannot load")
        stacks.append(Stack(c, runner))
        return stacks[-1]

    notifier = notifier or Notifier({})
    host = ModelHost(cfg or Config(), load, heartbeat=Heartbeat(notifier), notifier=notifier, metrics=Metrics(),
                     model_info={"name": "fake"})
    return host, runner, stacks


async def stop(host):
    await host.unload("test", State.STOPPING)


def drain_datagrams(s: socket.socket) -> list[str]:
    out = []
    while True:
        try:
            out.append(s.recv(4096).decode())
        except BlockingIOError:
            return out


def test_a_stalled_round_stops_the_watchdog_and_health_turns_false(tmp_path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify"))
    sock.setblocking(False)
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "200000"})

    async def main():
        host, runner, _ = make_host(notifier=notifier)
        await host.load("start")
        monitor = asyncio.create_task(host.monitor())
        await asyncio.sleep(0.5)                      # idle: the loop beats, the watchdog gets pings
        idle = [d for d in drain_datagrams(sock) if d == "WATCHDOG=1"]
        assert len(idle) >= 3 and host.health()["ok"]
        runner.gate = threading.Event()
        task = asyncio.create_task(anext(host.stream(req("r1"))))
        while not runner.entered.is_set():
            await asyncio.sleep(0.01)
        drain_datagrams(sock)
        await asyncio.sleep(0.6)                      # the round hangs: no ping, health false with a reason
        assert [d for d in drain_datagrams(sock) if d == "WATCHDOG=1"] == []
        h = host.health()
        assert h["ok"] is False and h["state"] == "ready" and h["inflight"] == 1
        assert h["reason"].startswith("engine_stalled: no round finished for") and h["heartbeat_age_s"] > 0.5
        runner.gate.set()                             # it ends: pings again, healthy again
        done = await asyncio.wait_for(task, 10)
        assert done.finish_reason is FinishReason.LENGTH
        runner.gate = None
        await asyncio.sleep(0.3)
        assert "WATCHDOG=1" in drain_datagrams(sock) and host.health()["ok"]
        monitor.cancel()
        await stop(host)

    try:
        asyncio.run(main())
    finally:
        sock.close()


def test_health_is_false_while_loading_and_ready_waits_for_the_load():
    async def main():
        host, _, _ = make_host(load_delay=0.3)
        loading = asyncio.create_task(host.load("start"))
        await asyncio.sleep(0.05)
        h = host.health()
        assert (h["ok"], h["state"], h["reason"]) == (False, "loading", "loading: the model is not loaded yet")
        assert host.status()["daemon"]["state"] == "loading" and host.status()["kv_pool"]["pages_total"] == 0
        waited = await host.ready()
        assert waited >= 200 and host.health()["ok"] and host.state is State.READY
        await loading
        assert await host.ready() == 0.0              # loaded: no wait
        await stop(host)
        with pytest.raises(P.ProtocolError) as e:
            await host.ready()
        assert e.value.code == "busy" and host.health()["reason"] == "stopping"

    asyncio.run(main())


def test_idle_unload_frees_the_model_and_the_next_request_loads_it_and_says_so():
    async def main():
        host, _, stacks = make_host(with_overrides(Config(), server__idle_unload_s=0.3), load_delay=0.15)
        await host.load("start")
        monitor = asyncio.create_task(host.monitor())
        await host.ready()
        first = await anext(host.stream(req("r1")))
        assert first.timings.load_ms == 0.0
        await asyncio.sleep(0.8)
        assert host.state is State.UNLOADED and host.current is None and stacks[0].closed
        h = host.health()
        assert h["ok"] and h["state"] == "unloaded" and h["reason"] is None   # nothing wrong: it loads on demand
        assert host.metrics.render().count("ignis_model_loaded 0.0") == 1
        assert host.status_line() == "idle: fake unloaded; it loads on the next request"

        async def request():
            waited = await host.ready()
            events = [ev async for ev in host.stream(req("r2"))]
            return waited, events[-1]

        waited, done = await asyncio.create_task(request())
        assert host.loads == 2 and len(stacks) == 2 and not stacks[1].closed
        assert waited >= 100 and done.timings.load_ms == pytest.approx(waited, abs=0.01)
        monitor.cancel()
        await stop(host)

    asyncio.run(main())


def test_a_failed_load_is_an_internal_error_and_unhealthy():
    async def main():
        host, _, _ = make_host(fail=lambda c: True)
        with pytest.raises(RuntimeError):
            await host.load("start")
        h = host.health()
        assert not h["ok"] and h["reason"] == "load_failed: cannot load"
        with pytest.raises(P.ProtocolError) as e:
            await host.ready()
        assert e.value.code == "internal" and "cannot load" in e.value.message

    asyncio.run(main())


def test_reload_drains_running_requests_holds_new_ones_and_loads_the_new_config():
    async def main():
        host, runner, stacks = make_host()
        await host.load("start")
        runner.delay = 0.02
        running = asyncio.create_task(anext(host.stream(req("long", max_tokens=20))))
        await asyncio.sleep(0.05)
        new = with_overrides(Config(), server__lanes=3)
        reload = asyncio.create_task(host.reload(new, grace_s=10))
        await asyncio.sleep(0.01)
        assert host.state is State.DRAINING and not host.health()["ok"]
        waiter = asyncio.create_task(host.ready())    # arrives during the drain: waits, then is served
        done = await asyncio.wait_for(running, 10)
        assert done.finish_reason is FinishReason.LENGTH and done.usage.completion_tokens == 20  # not cancelled
        assert await asyncio.wait_for(reload, 10) is True
        await asyncio.wait_for(waiter, 10)
        assert host.state is State.READY and host.cfg is new and host.model_info["lanes"] == 3
        assert stacks[0].closed and len(stacks) == 2
        await stop(host)

    asyncio.run(main())


def test_a_reload_that_fails_loads_the_previous_config_back():
    async def main():
        host, _, stacks = make_host(fail=lambda c: c.server.lanes == 5)
        await host.load("start")
        old = host.cfg
        assert await host.reload(with_overrides(Config(), server__lanes=5), grace_s=1) is False
        assert host.state is State.READY and host.cfg is old and len(stacks) == 2 and host.health()["ok"]
        await stop(host)

    asyncio.run(main())


def test_drain_past_the_grace_cancels_what_is_left():
    async def main():
        host, runner, _ = make_host()
        await host.load("start")
        runner.delay = 0.02
        running = asyncio.create_task(anext(host.stream(req("long", max_tokens=10_000 // 10))))
        await asyncio.sleep(0.05)
        assert await host.drain(0.1) == 1
        done = await asyncio.wait_for(running, 10)
        assert done.finish_reason is FinishReason.CANCELLED
        await stop(host)

    asyncio.run(main())


def test_a_request_during_the_unload_waits_for_it_then_loads_a_fresh_model():
    async def main():
        host, _, stacks = make_host()
        await host.load("start")
        unloading = asyncio.create_task(host.unload("idle for 1 s"))
        await asyncio.sleep(0)
        assert host.state is State.UNLOADING and host.health()["ok"]
        waiter = asyncio.create_task(host.ready())
        await asyncio.wait_for(unloading, 10)
        await asyncio.wait_for(waiter, 10)
        assert host.state is State.READY and host.loads == 2 and stacks[0].closed and not stacks[1].closed
        assert host._engine_task is not None and not host._engine_task.done()    # the new engine's, not lost
        done = [ev async for ev in host.stream(req("after"))][-1]
        assert done.finish_reason is FinishReason.LENGTH
        await stop(host)
        assert host._engine_task is None

    asyncio.run(main())


def test_an_engine_that_dies_is_unloaded_its_requests_fail_and_the_next_request_loads_a_fresh_one():
    async def main():
        host, runner, stacks = make_host()
        await host.load("start")
        monitor = asyncio.create_task(host.monitor())
        runner.gate = threading.Event()
        pending = asyncio.create_task(anext(host.stream(req("r1"))))
        while not runner.entered.is_set():
            await asyncio.sleep(0.01)

        def boom():
            raise RuntimeError("injected: the loop cannot go on")
        stacks[0].engine.disk.poll = boom             # raised by the loop itself, outside any round
        runner.gate.set()
        err = await asyncio.wait_for(pending, 10)    # the in-flight request ends with an error, not a hang
        assert isinstance(err, EdgeError) and err.code == "internal" and "the engine stopped" in err.message
        for _ in range(200):
            if host.state is State.UNLOADED:
                break
            await asyncio.sleep(0.02)
        assert host.state is State.UNLOADED and stacks[0].closed
        runner.gate = None
        await asyncio.wait_for(host.ready(), 10)       # as a front does: the unloaded model loads again
        done = await asyncio.wait_for(anext(host.stream(req("r2"))), 10)
        assert done.finish_reason is FinishReason.LENGTH and len(stacks) == 2
        monitor.cancel()
        await stop(host)
    asyncio.run(main())
