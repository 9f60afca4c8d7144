"""One OS thread runs torch's parallel work, the forward worker (engine.py); every other thread runs it on one.

Why: torch's CPU wheels parallelise with GNU OpenMP (libgomp), which keeps a thread team per OS thread that starts a
parallel region. Once the threads libgomp manages outnumber the CPUs, it cuts the spin-wait of idle team threads
from 300,000 spins to 1,000 (libgomp manual, GOMP_SPINCOUNT), so every parallel region of the decode step pays a futex
wake-up. Measured on this project's 2-core machine (SmolLM2 native, one decode step at 128 tokens of context): 7.5 ms
when only the forward thread has a team, 15-16 ms as soon as a second thread (the main thread, or the thread that
loaded the weights) had run one parallel region with 2 threads; the daemon's single-lane decode ran at 61 tok/s for
that reason instead of ~120.

So the daemon (cli.main, before torch is imported) sets OMP_NUM_THREADS=1 for every thread, the forward worker raises
its own count to server.threads (Runner.init_thread), and the weights load in a thread of their own that exits when
the load ends (`run_in_fresh_thread`): a team is released with the OS thread that owned it.
"""
from __future__ import annotations

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor

THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def one_thread_by_default() -> bool:
    """Set OMP_NUM_THREADS and MKL_NUM_THREADS to 1 for this process, so a thread that never calls
    torch.set_num_threads runs torch on one thread. Only effective before torch is imported (libgomp reads the
    environment when it loads); returns whether it was in time (False: torch was already imported, nothing changed).
    The forward worker's count (server.threads) does not depend on these variables."""
    if "torch" in sys.modules:
        return False
    for name in THREAD_ENV:
        os.environ[name] = "1"
    return True


async def run_in_fresh_thread(fn, *args):
    """``fn(*args)`` in a new OS thread that exits when it returns (its OpenMP team goes with it), awaited from the
    event loop. Returns fn's result; raises what fn raises."""
    ex = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ignis-load")
    try:
        return await asyncio.get_running_loop().run_in_executor(ex, fn, *args)
    finally:
        ex.shutdown(wait=False)
