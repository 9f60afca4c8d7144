"""The fused CPU decode kernel over hq-e8-2b pages (hq_cpu.c), built on first use and called through ctypes.

hq_cpu.c computes what hq_decode.hq_decode_attention computes (HQ_E8_2B.md §4.1-§4.3: the query rotated once, the
compressed keys scored in the rotated domain with the variance correction, the exact ring and sinks, one softmax,
the values un-rotated once) in one call per layer instead of about 45 torch operators: on the CPU a decode step's
attention costs its operator count more than its bytes. Each row is computed alone, so a row's output does not
depend on the batch it is in, nor on the thread count (split-K partials merged in a fixed order).

Build: the C file is compiled with the system C compiler (`$CC`, else `cc`; -O3 -march=native -fopenmp, about a
second) into the kernel cache ($IGNIS_KERNEL_CACHE, else $XDG_CACHE_HOME/ignis/kernels, else
~/.cache/ignis/kernels; a temporary directory when none is writable), named by a hash of the source, the compiler
and the CPU's flags, and written under a temporary name then renamed, so concurrent daemons share one build. The
library links libgomp by its soname, so it binds to the libgomp torch has already loaded (one OpenMP runtime: a
second one would double every parallel region's wake-up cost). Where no compiler works, `available()` is False and
the dispatcher keeps the torch path (hq_decode.py), logging why once.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from ignis_kernels.attention.hq_decode import word_table

log = logging.getLogger("ignis.kernels")

SOURCE = Path(__file__).with_name("hq_cpu.c")
FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno")
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_error: str | None = None

_P = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_int64
_ARGTYPES = [_P, _P, ctypes.c_float, _I, _I, _I, _I, _I, _I, _I, _I, _P, _P, _L, _P, _P, _P, _P,
             _P, _P, _L, _L, _L, _P, _P, _L, _L, _L, _P]


def cache_dir() -> Path:
    """Where built kernels go: $IGNIS_KERNEL_CACHE, else $XDG_CACHE_HOME/ignis/kernels, else ~/.cache/ignis/kernels."""
    if os.environ.get("IGNIS_KERNEL_CACHE"):
        return Path(os.environ["IGNIS_KERNEL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ignis" / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return os.uname().machine


def _build() -> ctypes.CDLL:
    """Compile (or find) the library and load it. Raises OSError / subprocess.CalledProcessError."""
    cc = os.environ.get("CC", "cc")
    src = SOURCE.read_bytes()
    ver = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(src + ver.encode() + " ".join(FLAGS).encode() + _cpu_flags().encode()).hexdigest()[:16]
    for d in (cache_dir(), Path(tempfile.gettempdir()) / f"ignis-kernels-{os.getuid()}"):
        lib = d / f"hq_cpu-{key}.so"
        if lib.exists():
            return ctypes.CDLL(str(lib))
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".hq_cpu-", suffix=".so", dir=d)
            os.close(fd)
        except OSError:
            continue
        try:
            subprocess.run([cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True, check=True)
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return ctypes.CDLL(str(lib))
    raise OSError(f"no writable kernel cache directory ({cache_dir()} or the temporary directory)")


def library() -> ctypes.CDLL | None:
    """The loaded kernel library, built on the first call; None when it cannot be built (the reason is logged once
    and kept in `error()`). IGNIS_HQ_CPU_KERNEL=0 disables it."""
    global _lib, _error
    if _lib is not None or _error is not None:
        return _lib
    with _lock:
        if _lib is None and _error is None:
            if os.environ.get("IGNIS_HQ_CPU_KERNEL", "1") == "0":
                _error = "disabled by IGNIS_HQ_CPU_KERNEL=0"
                return None
            try:
                lib = _build()
                lib.hq_decode.argtypes = _ARGTYPES
                lib.hq_decode.restype = ctypes.c_int
                _lib = lib
            except (OSError, subprocess.CalledProcessError) as e:
                detail = getattr(e, "stderr", "") or str(e)
                _error = f"the fused hq-e8-2b CPU decode kernel could not be built: {detail.strip()[:400]}"
                log.warning("%s; decode attention uses the torch path", _error)
    return _lib


def available() -> bool:
    """Whether the fused kernel can run here (builds it on the first call)."""
    return library() is not None


def error() -> str | None:
    """Why the kernel is unavailable, or None."""
    return _error


def _f32(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.stride(-1) == 1


def supports(q: torch.Tensor, view, exact) -> bool:
    """Whether hq_decode_attention can take these arguments as they are (CPU tensors, contiguous pool buffers of the
    expected dtypes, float32 exact parts with unit stride in d, a geometry within the C limits)."""
    b = view.buffers
    codes, scale, resid = b["codes"], b["scale"], b["resid"]
    d = q.shape[-1]
    return (q.device.type == "cpu" and codes.dtype == torch.int16 and scale.dtype == torch.float32
            and resid.dtype == torch.float16 and codes.is_contiguous() and scale.is_contiguous()
            and resid.is_contiguous() and _f32(exact.k) and _f32(exact.v) and exact.k.stride() == exact.v.stride()
            and _f32(exact.sink_k) and _f32(exact.sink_v) and exact.sink_k.stride() == exact.sink_v.stride()
            and 8 <= d <= 256 and d & (d - 1) == 0 and q.shape[1] // view.params["signs"].shape[1] <= 16)


def hq_decode_attention(q: torch.Tensor, view, page_table: torch.Tensor, context_lens: torch.Tensor, exact,
                        scale: float | None = None) -> torch.Tensor:
    """hq_decode.hq_decode_attention's result through the fused kernel (the same arguments: q [B, Hq, d] at
    positions context_lens − 1, page_table LongTensor [B, W], exact the batch's ExactRing) -> float32 [B, Hq, d].
    The caller checks `supports` first. Raises RuntimeError when the kernel is unavailable or refuses the
    geometry."""
    lib = library()
    if lib is None:
        raise RuntimeError(_error or "hq_cpu: kernel unavailable")
    bsz, hq, d = q.shape
    signs = view.params["signs"].float().contiguous()
    hkv = signs.shape[1]
    b = view.buffers
    pt = view.page_tokens
    qc = q.float().contiguous()
    pages = page_table.to(torch.int64).contiguous()
    ctx = context_lens.to(torch.int64).contiguous()
    out = torch.empty(bsz, hq, d, dtype=torch.float32)
    tau = 1.0 / d ** 0.5 if scale is None else float(scale)
    rk, sk = exact.k, exact.sink_k
    n_s = sk.shape[1]
    sink_k = sk if n_s else rk                               # any valid pointer when there are no sinks
    sink_v = exact.sink_v if n_s else exact.v
    words = word_table("cpu")
    rc = lib.hq_decode(
        qc.data_ptr(), signs.data_ptr(), tau, bsz, hq, hkv, d, pt, exact.window_pages, rk.shape[1], n_s,
        ctx.data_ptr(), pages.data_ptr(), pages.shape[1], b["codes"].data_ptr(), b["scale"].data_ptr(),
        b["resid"].data_ptr(), words.data_ptr(), rk.data_ptr(), exact.v.data_ptr(), rk.stride(0), rk.stride(1),
        rk.stride(2), sink_k.data_ptr(), sink_v.data_ptr(), sink_k.stride(0), sink_k.stride(1) if n_s else 0,
        sink_k.stride(2), out.data_ptr())
    if rc != 0:
        raise RuntimeError(f"hq_cpu: geometry outside the kernel's limits (Hq {hq}, Hkv {hkv}, d {d})")
    return out
