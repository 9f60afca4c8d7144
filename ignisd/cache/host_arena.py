"""HostArena: the KV-RAM tier's storage, one block of host memory allocated whole at load (DESIGN §4.5).

On CUDA the block is page-locked so that copies to and from the device are DMA; on the CPU it is plain memory that
`mlock(2)` is asked to keep resident (whether it held is reported in the `vram_plan` line: it needs
RLIMIT_MEMLOCK or CAP_IPC_LOCK). Byte ranges of it are handed out by cache/extents.py; this class only stores bytes.
"""
from __future__ import annotations

import ctypes
import ctypes.util

import torch


def _mlock(ptr: int, nbytes: int) -> bool:
    """Ask the kernel to keep [ptr, ptr + nbytes) resident; whether it agreed."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.mlock(ctypes.c_void_p(ptr), ctypes.c_size_t(nbytes)) == 0
    except (OSError, AttributeError):
        return False


class HostArena:
    """`nbytes` of host memory as one uint8 tensor.

    nbytes: size in bytes (>= 0). lock: pin it (CUDA: pinned memory; CPU: mlock). Attributes: buf (uint8 [nbytes]),
    locked (whether the memory is page-locked). Raises RuntimeError when the memory cannot be allocated.
    """

    def __init__(self, nbytes: int, lock: bool = True, pin_memory: bool = False):
        self.nbytes = nbytes
        self.buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin_memory)
        self.locked = pin_memory
        if lock and not pin_memory and nbytes:
            self.locked = _mlock(self.buf.data_ptr(), nbytes)

    def view(self, offset: int, nbytes: int) -> torch.Tensor:
        """The bytes [offset, offset + nbytes) as a uint8 tensor view (writes go to the arena). Raises IndexError
        outside the arena."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise IndexError(f"arena range [{offset}, {offset + nbytes}) outside [0, {self.nbytes})")
        return self.buf[offset:offset + nbytes]

    def memory(self) -> memoryview:
        """The whole arena as one writable byte memoryview (format "B", nbytes long; it keeps the memory alive), for
        code that fills arena bytes without torch (ignisd/disk_traffic.py reads KV-disk files into free extents)."""
        return memoryview(self.buf.numpy())
