"""ignisd.torch_threads: the daemon's thread discipline for torch's OpenMP teams."""
import subprocess
import sys

CHILD = r"""
import asyncio, os, sys, threading
from ignisd.torch_threads import one_thread_by_default, run_in_fresh_thread
print(one_thread_by_default(), os.environ["OMP_NUM_THREADS"], os.environ["MKL_NUM_THREADS"])
import torch
print(torch.get_num_threads(), one_thread_by_default())
def load():
    torch.set_num_threads(2)
    return threading.current_thread().name, torch.get_num_threads()
async def main():
    name, n = await run_in_fresh_thread(load)
    await asyncio.sleep(0.2)
    return name, n, [t.name for t in threading.enumerate()]
name, n, alive = asyncio.run(main())
print(name.startswith("ignis-load"), n, name in alive)
"""


def test_one_thread_by_default_and_fresh_thread_exits():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "4"}).stdout.split("\n")
    assert out[0] == "True 1 1"          # set before torch was imported, overriding the inherited 4
    assert out[1] == "1 False"           # torch runs the main thread on one; too late to change once imported
    assert out[2] == "True 2 False"      # the load thread ran at its own count and is gone afterwards
