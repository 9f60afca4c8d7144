"""Start-up checks made before the model's weights load (DESIGN §6: a wrong value stops the start naming the key).

†: imports no torch. What can be checked from the configuration and the model's metadata alone is checked here, so
a refused value ends the start at once with exit code 2 and the key named, not seconds later after the weights
loaded: the API key file, the model's architecture numbers (config.json or the GGUF header, no tensor read), the
KV format and weight format, the context cap, the KV pool's size (at least one page, at most the available
memory) and the KV-disk directory (a writable directory).
"""
from __future__ import annotations

import os
from pathlib import Path

from ignisd.config import Config
from ignisd.vocab import PAGE_TOKENS

AVAILABLE_KV_FORMATS = ("fp32", "bf16", "hq-e8-2b")
HQ_MIN_HEAD_DIM = 128
"""The default rule of DESIGN §4.6 / §6: hq-e8-2b for models whose attention head_dim is at least this."""
AVAILABLE_WEIGHT_FORMATS = ("native", "bf16", "fp32")


class StartupError(Exception):
    """The daemon cannot start; the message says why and what to change.

    exit_code: 2 when a configuration value is refused (as for ConfigError), 1 for anything else.
    """

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def read_api_key(path: str | None) -> str | None:
    """The key in server.api_key_file (stripped), or None when unset. Raises StartupError (exit 2) naming the key
    when the file cannot be read or holds nothing."""
    if not path:
        return None
    try:
        key = Path(path).read_text().strip()
    except OSError as e:
        raise StartupError(f"server.api_key_file {path!r}: {e.strerror}", exit_code=2) from None
    if not key:
        raise StartupError(f"server.api_key_file {path!r} is empty", exit_code=2)
    return key


def check_formats(cfg: Config) -> None:
    """Refuse (exit 2) a model.kv_format or model.weight_format this build cannot serve."""
    fmt = cfg.model.kv_format
    if fmt is not None and fmt not in AVAILABLE_KV_FORMATS:
        raise StartupError(f"model.kv_format = {fmt!r} is not available in this build; allowed: "
                           f"{', '.join(AVAILABLE_KV_FORMATS)}", exit_code=2)
    wf = cfg.model.weight_format
    if wf not in AVAILABLE_WEIGHT_FORMATS:
        raise StartupError(f"model.weight_format = {wf!r} is not available in this build; allowed: "
                           f"{', '.join(AVAILABLE_WEIGHT_FORMATS)}", exit_code=2)


def choose_kv_format(cfg: Config, head_dim: int, device: str = "cpu") -> tuple[str, str]:
    """The KV format and why (DESIGN §4.6, §6): model.kv_format when set, else hq-e8-2b when the model's attention
    head_dim >= HQ_MIN_HEAD_DIM (the hybrids it was designed for), else fp32 on the CPU (bf16 on CUDA).
    Returns (name, reason), the reason a short phrase for the vram_plan line. Raises StartupError (exit 2) for a
    format this build cannot serve, or hq-e8-2b on a head_dim that is not a power of two >= 8."""
    check_formats(cfg)
    fmt = cfg.model.kv_format
    if fmt is not None:
        why = "model.kv_format"
    elif head_dim >= HQ_MIN_HEAD_DIM:
        fmt, why = "hq-e8-2b", f"default: head_dim {head_dim} >= {HQ_MIN_HEAD_DIM}"
    else:
        fmt = "bf16" if device == "cuda" else "fp32"
        why = f"default: head_dim {head_dim} < {HQ_MIN_HEAD_DIM}, {fmt} on {device}"
    if fmt == "hq-e8-2b" and (head_dim < 8 or head_dim & (head_dim - 1)):
        raise StartupError(f"model.kv_format = 'hq-e8-2b' needs a power-of-two attention head_dim >= 8; this model's "
                           f"is {head_dim}", exit_code=2)
    return fmt, why


def context_tokens(cfg: Config, model_context: int) -> int:
    """model.context_tokens, or the model's. Raises StartupError (exit 2) when it exceeds the model's."""
    want = cfg.model.context_tokens
    if want is None:
        return model_context
    if want > model_context:
        raise StartupError(f"model.context_tokens = {want} exceeds the model's context of {model_context} tokens",
                           exit_code=2)
    return want


def check_exact_window(cfg: Config, kv_format: str, context: int) -> None:
    """Refuse (exit 2) an hq-e8-2b kv.exact_window or kv.exact_sinks of more tokens than the context (`context`,
    tokens): the window and sinks are kept exact in every state slot (HQ_E8_2B.md §4.3), so a window past the
    context only costs memory, and a large one would ask for more than the machine has. Other formats keep no
    window and ignore both keys."""
    if kv_format != "hq-e8-2b":
        return
    for key, n in (("kv.exact_window", cfg.kv.exact_window), ("kv.exact_sinks", cfg.kv.exact_sinks)):
        if n is not None and n > context:
            raise StartupError(f"{key} = {n} tokens is more than the context of {context} tokens; at most {context}",
                               exit_code=2)


def state_slot_counts(cfg: Config) -> tuple[int, int, int]:
    """Per-sequence state slots a model with state reserves at load (DESIGN §4.4): (live slots, one a lane;
    retained device slots, reuse.device_slots; retained host slots, reuse.host_slots_per_lane × lanes), the
    retained ones 0 with reuse.prompt off."""
    lanes, rc = cfg.server.lanes, cfg.reuse
    if not rc.prompt:
        return lanes, 0, 0
    return lanes, rc.device_slots, rc.host_slots_per_lane * lanes


def check_state_memory(cfg: Config, slot_bytes: int, pool_bytes: int, mem_available: int) -> None:
    """Refuse (exit 2) state slots (`slot_bytes` bytes each: recurrent and conv state, the hq-e8-2b exact window and
    sinks) that, with the KV pool's `pool_bytes`, do not fit in `mem_available` bytes, naming the keys that size
    them. No-op for a model and format with no per-sequence state (slot_bytes 0)."""
    live, dev, host = state_slot_counts(cfg)
    want = slot_bytes * (live + dev + host)
    if slot_bytes and want + pool_bytes > mem_available:
        raise StartupError(f"the per-sequence state of {live + dev + host} slots ({live} server.lanes, {dev} "
                           f"reuse.device_slots, {host} from reuse.host_slots_per_lane) of {slot_bytes} bytes each is "
                           f"{want} bytes; with the KV pool's {pool_bytes} bytes that is more than the available "
                           f"memory ({mem_available} bytes, MemAvailable); lower kv.exact_window (hq-e8-2b), "
                           f"server.lanes or the retained slots", exit_code=2)


def plan_pool_pages(cfg: Config, bytes_per_token: int, context: int, mem_available: int) -> int:
    """KV pool pages (DESIGN §4.1): vram.kv_pool_bytes in bytes (whole pages, rounded down) or in tokens (whole
    pages, rounded down), else lanes × context tokens capped at half of `mem_available` bytes.
    bytes_per_token: KV bytes of one token in the pool's format. Raises StartupError (exit 2) naming
    vram.kv_pool_bytes when the size holds less than one page (64 tokens), or when the pool it asks for is larger
    than `mem_available` bytes (the pool is host memory on the CPU: allocating it would fail or swap the machine)."""
    page_bytes = bytes_per_token * PAGE_TOKENS
    size = cfg.vram.kv_pool_bytes
    if size is None:
        want = cfg.server.lanes * context * bytes_per_token
        pages = min(want, mem_available // 2) // page_bytes
        what = f"half of the available memory ({mem_available} bytes)"
    elif size.tokens is not None:
        pages = size.tokens // PAGE_TOKENS
        what = f"vram.kv_pool_bytes = {size.tokens} tokens"
    else:
        pages = size.bytes // page_bytes
        what = f"vram.kv_pool_bytes = {size.bytes} bytes"
    if pages < 1:
        raise StartupError(f"{what} holds no whole KV page (a page is {PAGE_TOKENS} tokens = {page_bytes} bytes "
                           f"in this model's KV format); raise vram.kv_pool_bytes", exit_code=2)
    if pages * page_bytes > mem_available:
        fit = mem_available // page_bytes * PAGE_TOKENS
        raise StartupError(f"{what} asks for a KV pool of {pages * page_bytes} bytes ({pages} pages of "
                           f"{page_bytes} bytes), more than the available memory ({mem_available} bytes, "
                           f"MemAvailable); lower vram.kv_pool_bytes (at most {fit} tokens fit)", exit_code=2)
    return int(pages)


def check_arena(cfg: Config, mem_available: int) -> None:
    """Refuse (exit 2) a KV-RAM arena (reuse.kv_host_pool_bytes) larger than the available memory, naming both
    numbers: a host cache sized near the RAM limit hangs the machine instead of failing."""
    want = cfg.reuse.kv_host_pool_bytes
    if want > mem_available:
        raise StartupError(f"reuse.kv_host_pool_bytes = {want} bytes does not fit in the available memory "
                           f"({mem_available} bytes, MemAvailable); lower it (0 turns KV-RAM off)", exit_code=2)


def check_disk_dir(cfg: Config) -> None:
    """Refuse (exit 2) a KV-disk directory the daemon could not use, before the weights load: with kv.disk_bytes > 0,
    kv.disk_dir must be a directory (created here, mode 0700 with its parents, when missing, as the KV-disk store
    would) that this user can write to and search. The message names the key, the path and what is wrong in words
    (not a directory; cannot be created, and why; read-only file system; not writable by uid N). Raises StartupError."""
    if not cfg.kv.disk_bytes:
        return
    path = Path(cfg.kv.disk_dir)
    key = f"kv.disk_dir {str(path)!r}"
    if path.exists() and not path.is_dir():
        raise StartupError(f"{key}: not a directory; name a directory for the KV-disk files (or kv.disk_bytes = 0 "
                           "turns KV-disk off)", exit_code=2)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise StartupError(f"{key}: cannot be created: {e.strerror or e}", exit_code=2) from None
    if not os.access(path, os.W_OK | os.X_OK):
        try:
            read_only = bool(os.statvfs(path).f_flag & os.ST_RDONLY)
        except OSError:
            read_only = False
        why = "on a read-only file system" if read_only else f"not writable by this user (uid {os.getuid()})"
        raise StartupError(f"{key}: {why}; name a writable directory (or kv.disk_bytes = 0 turns KV-disk off)",
                           exit_code=2)


def mem_available_bytes() -> int:
    """MemAvailable of /proc/meminfo in bytes (8 GiB when it cannot be read)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 8 << 30
