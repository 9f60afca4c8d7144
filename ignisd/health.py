"""The engine loop's heartbeat: systemd watchdog pings and the stall test behind an honest ``health`` (issue 13).

†: imports no torch. The engine calls ``Heartbeat.beat()`` after every round, when it wakes, and every
``idle_wait_s`` (at most a second) while it waits for work (ignisd.engine.Engine.heartbeat), so a beat proves the
round loop itself makes progress — not merely that the process is alive. Each beat sends ``WATCHDOG=1`` when
systemd's watchdog is on, at most every ``interval_s`` (half the watchdog timeout, as sd_watchdog_enabled(3)
advises). A round that hangs stops the beats:
systemd restarts the service after WatchdogSec=, and ``stalled()`` reports the loop stuck once ``stall_after_s``
passed without a beat while work is waiting.

While no engine runs (the model is loading, unloaded when idle, or being reloaded) the daemon's lifecycle task
keeps the watchdog fed with ``keepalive()``: that time is not a stall.
"""
from __future__ import annotations

import time
from typing import Callable

from ignisd.systemd import Notifier

DEFAULT_STALL_S = 60.0      # without a watchdog: a round longer than this while work waits is a stall
IDLE_BEAT_S = 1.0           # without a watchdog: how often an idle engine beats (seconds)


class Heartbeat:
    """Progress beats of the round loop.

    notifier: sends WATCHDOG=1 (ignisd.systemd.Notifier; None: no pings). stall_after_s: seconds without a beat,
    while work waits, after which the loop counts as stalled (default: half the watchdog timeout, else
    DEFAULT_STALL_S). clock: a monotonic clock in seconds (tests pass their own).
    """

    def __init__(self, notifier: Notifier | None = None, stall_after_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.notifier = notifier
        timeout = notifier.watchdog_timeout_s if notifier is not None else None
        self.interval_s = timeout / 2 if timeout else IDLE_BEAT_S
        self.idle_wait_s = min(self.interval_s, IDLE_BEAT_S)   # how long the idle engine waits between beats
        if stall_after_s is None:
            stall_after_s = timeout / 2 if timeout else DEFAULT_STALL_S
        self.stall_after_s = stall_after_s
        self.clock = clock
        self.last_beat = clock()
        self._last_ping = float("-inf")
        self.beats = 0
        self.pings = 0

    def beat(self) -> None:
        """The loop made progress (a round finished, or it is idle and waiting): record it, ping the watchdog."""
        self.last_beat = self.clock()
        self.beats += 1
        self._ping()

    def keepalive(self) -> None:
        """No engine runs now (loading, unloaded, reloading): feed the watchdog and restart the stall clock."""
        self.last_beat = self.clock()
        self._ping()

    def _ping(self) -> None:
        n = self.notifier
        if n is None or n.watchdog_usec is None:
            return
        now = self.clock()
        if now - self._last_ping >= self.interval_s * 0.9 and n.watchdog():
            self._last_ping = now
            self.pings += 1

    def age_s(self) -> float:
        """Seconds since the last beat."""
        return self.clock() - self.last_beat

    def stalled(self, busy: bool) -> str | None:
        """Why the loop counts as stalled (None when it does not): no beat for longer than stall_after_s while
        `busy` (requests are running or waiting)."""
        age = self.age_s()
        if busy and age > self.stall_after_s:
            return (f"engine_stalled: no round finished for {age:.1f} s while requests wait "
                    f"(threshold {self.stall_after_s:g} s)")
        return None
