"""Build-on-first-use for the small C kernels of the CPU path (attention/hq_cpu.c, attention/dense_cpu.c, kvq/e8p_cpu.c,
kvq/window_cpu.c, linear/int4_cpu.c, linear/q8_cpu.c, norm/rms_cpu.c, decode/llama_cpu.c), loaded through ctypes.

A kernel's C file is compiled with the system C compiler (`$CC`, else `cc`; -O3 -march=native -fopenmp, about a
second) into the kernel cache ($IGNIS_KERNEL_CACHE, else $XDG_CACHE_HOME/ignis/kernels, else ~/.cache/ignis/kernels;
a temporary directory when none is writable), named by a hash of the source and of the local headers it includes
(`#include "..."`, followed from header to header: kernels/fwht_cpu.h), the compiler's version, the flags and the
CPU's flags, and written under a temporary name then renamed, so concurrent daemons share one build. The library
links libgomp by its soname, so it binds to the libgomp torch has already loaded (one OpenMP runtime: a second one
would double every parallel region's wake-up cost). Where no compiler works, `Kernel.library()` is None, the
reason is logged once, and the caller keeps its torch path. IGNIS_CPU_KERNELS=0 disables every kernel.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import re
import subprocess
import tempfile
import threading
from pathlib import Path

log = logging.getLogger("ignis.kernels")

FLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fopenmp", "-fno-math-errno")


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


_LOCAL_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.M)


def sources(source: Path) -> list[Path]:
    """`source` and every local header it includes (`#include "name"`, resolved from the including file's folder, as
    the compiler resolves it; followed recursively, each once), in the order met. A kernel's build is keyed on all
    of their bytes, so an edited header rebuilds every kernel that includes it. Raises OSError for a missing file."""
    seen: list[Path] = []
    todo = [source.resolve()]
    while todo:
        p = todo.pop(0)
        if p in seen:
            continue
        seen.append(p)
        todo += [(p.parent / m.decode()).resolve() for m in _LOCAL_INCLUDE.findall(p.read_bytes())]
    return seen


def build(source: Path) -> ctypes.CDLL:
    """Compile `source` (or find its build in the cache) and load it. Raises OSError (no working compiler: `$CC
    --version` fails or is missing; no writable cache directory; the library does not load) or
    subprocess.CalledProcessError (the compile fails)."""
    cc = os.environ.get("CC", "cc")
    src = b"".join(p.read_bytes() for p in sources(source))
    try:
        ver = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    except subprocess.CalledProcessError as e:
        raise OSError(f"no working C compiler: `{cc} --version` exited with status {e.returncode}") from e
    except OSError as e:
        raise OSError(f"no working C compiler: `{cc}`: {e.strerror or e}") from e
    key = hashlib.sha256(src + ver.encode() + " ".join(FLAGS).encode() + _cpu_flags().encode()).hexdigest()[:16]
    for d in (cache_dir(), Path(tempfile.gettempdir()) / f"ignis-kernels-{os.getuid()}"):
        lib = d / f"{source.stem}-{key}.so"
        if lib.exists():
            return ctypes.CDLL(str(lib))
        try:
            d.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=d)
            os.close(fd)
        except OSError:
            continue
        try:
            subprocess.run([cc, *FLAGS, "-o", tmp, str(source), "-lm"], capture_output=True, text=True, check=True)
            os.replace(tmp, lib)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return ctypes.CDLL(str(lib))
    raise OSError(f"no writable kernel cache directory ({cache_dir()} or the temporary directory)")


class Kernel:
    """One C kernel library, built on the first `library()` call. source: its C file; what: a phrase for the log
    ("the fused hq-e8-2b CPU decode kernel"); signatures: {function name: (argtypes, restype)}; disable_env: an
    environment variable that turns this one kernel off when "0"; check: optional, called once with the loaded
    library, returns "" when the kernel may serve here or why not (a probe of a layout it reads, a CPU without the
    instructions it was written for): then the library counts as unavailable, the reason logged like a failed
    build."""

    def __init__(self, source: Path, what: str, signatures: dict, disable_env: str, check=None) -> None:
        self.source, self.what, self.signatures, self.disable_env = source, what, signatures, disable_env
        self.check = check
        self._lib: ctypes.CDLL | None = None
        self._error: str | None = None
        self._lock = threading.Lock()

    def library(self) -> ctypes.CDLL | None:
        """The loaded library, or None when it cannot be built here (why: `error()`, logged once)."""
        if self._lib is not None or self._error is not None:
            return self._lib
        with self._lock:
            if self._lib is None and self._error is None:
                for env in (self.disable_env, "IGNIS_CPU_KERNELS"):
                    if os.environ.get(env, "1") == "0":
                        self._error = f"disabled by {env}=0"
                        return None
                try:
                    lib = build(self.source)
                    for name, (argtypes, restype) in self.signatures.items():
                        fn = getattr(lib, name)
                        fn.argtypes, fn.restype = argtypes, restype
                except (OSError, AttributeError, subprocess.CalledProcessError) as e:
                    detail = getattr(e, "stderr", "") or str(e)
                    self._error = f"{self.what} could not be built: {detail.strip()[:400].rstrip('.')}"
                    log.warning("%s; the torch path serves instead", self._error)
                    return None
                why = self.check(lib) if self.check is not None else ""
                if why:
                    self._error = f"{self.what} is off: {why}"
                    log.warning("%s; the torch path serves instead", self._error)
                else:
                    self._lib = lib
        return self._lib

    def available(self) -> bool:
        """Whether the kernel can run here (builds it on the first call)."""
        return self.library() is not None

    def error(self) -> str | None:
        """Why the kernel is unavailable, or None."""
        return self._error
