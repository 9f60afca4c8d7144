"""The ignisd configuration keys (DESIGN §6): the key table, its value parsers and units, and ``ConfigError``.

Each key ``section.key_name`` is a ``KeySpec`` with exactly one flag ``--section-key-name``. Units: sizes are bytes
or take K/M/G/T (powers of 2^10), and keys that accept tokens take a trailing ``tok`` (``900Ktok``); durations are
seconds or take s/m/h; booleans are on/off/true/false. Re-exported by ``ignisd.config`` (the dataclass tree, the
TOML file and the flags), which imports this module and never the reverse. †: imports no torch.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Callable

from ignis_client.wire import _shown

SECTIONS = ("model", "vram", "kv", "reuse", "server")
ALIASES = {"--config": None, "--model": "model.path", "--socket": "server.socket", "--lanes": "server.lanes",
           "--log-level": "server.log_level"}
KV_FORMAT_CHOICES = ("fp32", "bf16", "hq-e8-2b")
WEIGHT_FORMAT_CHOICES = ("native", "bf16", "fp32")
DEVELOPER_POLICIES = ("keep", "into-system", "after-system")
LOG_LEVELS = ("debug", "info", "warning", "error")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_DUR = {"": 1, "s": 1, "m": 60, "h": 3600}
MAX_SOCKET_PATH_BYTES = 107  # sun_path is 108 bytes including the NUL


class ConfigError(ValueError):
    """A configuration problem. key: ``section.key`` (or the flag / section that was wrong); value: what was given;
    allowed: what would have been accepted. str() is the whole message."""

    def __init__(self, key: str, value: Any, allowed: str, source: str | None = None, problem: str = "invalid value"):
        self.key, self.value, self.allowed, self.source = key, value, allowed, source
        where = f" (from {source})" if source else ""
        shown = "" if value is _NO_VALUE else f" {_shown(value, 200)}"     # as TOML / JSON spell it
        super().__init__(f"{key}: {problem}{shown}{where}; allowed: {allowed}")


_NO_VALUE = object()


@dataclass(frozen=True)
class Size:
    """A capacity given either in bytes or in tokens (exactly one is set); tokens are converted once the model's
    bytes per token are known."""
    bytes: int | None = None
    tokens: int | None = None

    def to_bytes(self, bytes_per_token: int) -> int:
        """Bytes for this size given the KV bytes per token of the model and format."""
        return self.bytes if self.bytes is not None else self.tokens * bytes_per_token


# ---------------------------------------------------------------- value parsers
# Each parser takes (raw value, from_flag) and returns the parsed value or raises _Bad(allowed).

class _Bad(Exception):
    pass


def _p_int(lo: int, hi: int | None = None, auto: bool = False) -> tuple[Callable, str]:
    allowed = f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else "") + (" or \"auto\"" if auto else "")

    def parse(v, from_flag):
        if auto and v == "auto":
            return None
        if from_flag and isinstance(v, str) and re.fullmatch(r"[+-]?\d+", v.strip()):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            raise _Bad(allowed)
        return v
    return parse, allowed


def _size_value(v, tokens_ok: bool, allowed: str) -> Size:
    if isinstance(v, int) and not isinstance(v, bool):
        return Size(bytes=v)
    if not isinstance(v, str):
        raise _Bad(allowed)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KkMmGgTt]?)\s*(tok)?\s*", v)
    if not m or (m.group(3) and not tokens_ok):
        raise _Bad(allowed)
    try:
        n = Decimal(m.group(1)) * _UNITS[m.group(2).upper()]
    except InvalidOperation:
        raise _Bad(allowed) from None
    if n != n.to_integral_value():
        raise _Bad(allowed + " (a whole number of bytes or tokens)")
    return Size(tokens=int(n)) if m.group(3) else Size(bytes=int(n))


def _p_size(lo: int = 0, tokens: bool = False, auto: bool = False, off: bool = False) -> tuple[Callable, str]:
    allowed = ("bytes or a size with K/M/G/T (powers of 1024)" + (", or tokens with a trailing tok (900Ktok)"
               if tokens else "") + f", at least {lo}" + (", or \"auto\"" if auto else "")
              + (", or off" if off else ""))

    def parse(v, from_flag):
        if auto and v == "auto":
            return None
        if off and v in ("off", False):
            return 0
        s = _size_value(v, tokens, allowed)
        if (s.bytes if s.bytes is not None else s.tokens) < lo:
            raise _Bad(allowed)
        return s if tokens else s.bytes
    return parse, allowed


def _p_duration(off: bool = False) -> tuple[Callable, str]:
    allowed = "seconds, or a number with s/m/h (30s, 5m, 1h), >= 0" + (", or off" if off else "")

    def parse(v, from_flag):
        if off and v in ("off", False):
            return 0.0
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            x = float(v)
        elif isinstance(v, str) and (m := re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", v)):
            x = float(m.group(1)) * _DUR[m.group(2)]
        else:
            raise _Bad(allowed)
        if not x >= 0 or x == float("inf"):
            raise _Bad(allowed)
        return x
    return parse, allowed


def _p_bool() -> tuple[Callable, str]:
    allowed = "on, off, true or false"

    def parse(v, from_flag):
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.lower() in ("on", "true"):
            return True
        if isinstance(v, str) and v.lower() in ("off", "false"):
            return False
        raise _Bad(allowed)
    return parse, allowed


def _p_choice(options: tuple[str, ...], auto: bool = False) -> tuple[Callable, str]:
    allowed = " | ".join(options + (("auto",) if auto else ()))

    def parse(v, from_flag):
        if auto and v == "auto":
            return None
        if not isinstance(v, str) or v not in options:
            raise _Bad(allowed)
        return v
    return parse, allowed


def _p_path(none_word: str | None = None, max_bytes: int | None = None) -> tuple[Callable, str]:
    allowed = "a path" + (f" of at most {max_bytes} bytes" if max_bytes else "") + (
        f", or \"{none_word}\"" if none_word else "")

    def parse(v, from_flag):
        if none_word is not None and v in (none_word, "", False):
            return None
        if not isinstance(v, str) or not v or "\0" in v:
            raise _Bad(allowed)
        p = os.path.expanduser(v)
        if max_bytes and len(os.fsencode(p)) > max_bytes:
            raise _Bad(allowed)
        return p
    return parse, allowed


def _p_str_or_off() -> tuple[Callable, str]:
    allowed = "a name, or off"

    def parse(v, from_flag):
        if v in ("off", "", False):
            return None
        if not isinstance(v, str):
            raise _Bad(allowed)
        return v
    return parse, allowed


def _p_mode() -> tuple[Callable, str]:
    allowed = "an octal file mode between 0000 and 0777 (\"0600\", or 0o600 in TOML)"

    def parse(v, from_flag):
        if isinstance(v, str) and re.fullmatch(r"(0o)?[0-7]{1,4}", v.strip()):
            v = int(v.strip().removeprefix("0o"), 8)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 0o777:
            raise _Bad(allowed)
        return v
    return parse, allowed


def _p_listen(unix_ok: bool) -> tuple[Callable, str]:
    allowed = "HOST:PORT (port 0-65535)" + (" or unix:PATH" if unix_ok else "") + ", or off"

    def parse(v, from_flag):
        if v in ("off", "", False):
            return None
        if not isinstance(v, str):
            raise _Bad(allowed)
        if v.startswith("unix:"):
            if not unix_ok or len(v) == 5:
                raise _Bad(allowed)
            return v
        m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})", v)
        if not m or int(m.group(2)) > 65535:
            raise _Bad(allowed)
        return v
    return parse, allowed


# ---------------------------------------------------------------- the key table

@dataclass(frozen=True)
class KeySpec:
    """One configuration key: ``key`` (section.name), its flag, the parser and a description of allowed values."""
    key: str
    parse: Callable[[Any, bool], Any]
    allowed: str
    is_bool: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.key.replace(".", "-").replace("_", "-")

    @property
    def section(self) -> str:
        return self.key.split(".")[0]

    @property
    def name(self) -> str:
        return self.key.split(".")[1]


def _k(key: str, parser: tuple[Callable, str]) -> KeySpec:
    return KeySpec(key, parser[0], parser[1], is_bool=parser[0].__qualname__.startswith("_p_bool."))


_I32 = 2**31 - 1
KEYS: tuple[KeySpec, ...] = (
    _k("model.path", _p_path(none_word="builtin")),
    _k("model.kv_format", _p_choice(KV_FORMAT_CHOICES, auto=True)),
    _k("model.context_tokens", _p_int(1, _I32, auto=True)),
    _k("model.weight_format", _p_choice(WEIGHT_FORMAT_CHOICES)),
    _k("vram.kv_pool_bytes", _p_size(lo=1, tokens=True, auto=True)),
    _k("kv.exact_window", _p_int(0, _I32, auto=True)),
    _k("kv.exact_sinks", _p_int(0, _I32)),
    _k("kv.disk_bytes", _p_size(lo=0, off=True)),
    _k("kv.disk_dir", _p_path()),
    _k("reuse.prompt", _p_bool()),
    _k("reuse.device_slots", _p_int(0)),
    _k("reuse.host_slots_per_lane", _p_int(0)),
    _k("reuse.kv_host_pool_bytes", _p_size(lo=0)),
    _k("reuse.retained_interactive_ttl", _p_duration()),
    _k("reuse.restore_floor_ram", _p_int(0, _I32, auto=True)),
    _k("reuse.restore_floor_disk", _p_int(0, _I32, auto=True)),
    _k("reuse.evict_window_pages", _p_int(1)),
    _k("server.socket", _p_path(max_bytes=MAX_SOCKET_PATH_BYTES)),
    _k("server.lanes", _p_int(1, 4096)),
    _k("server.threads", _p_int(1, 4096, auto=True)),
    _k("server.prefill_chunk", _p_int(1, _I32)),
    _k("server.round_prefill_tokens", _p_int(1, _I32)),
    _k("server.default_max_tokens", _p_int(1, _I32)),
    _k("server.developer_message_policy", _p_choice(DEVELOPER_POLICIES)),
    _k("server.max_queue", _p_int(0)),
    _k("server.max_inflight_per_connection", _p_int(1)),
    _k("server.max_line_bytes", _p_size(lo=1024)),
    _k("server.log_level", _p_choice(LOG_LEVELS)),
    _k("server.api_key_file", _p_path(none_word="off")),
    _k("server.socket_mode", _p_mode()),
    _k("server.socket_group", _p_str_or_off()),
    _k("server.shutdown_grace_s", _p_duration()),
    _k("server.idle_unload_s", _p_duration(off=True)),
    _k("server.http_listen", _p_listen(unix_ok=True)),
    _k("server.metrics_listen", _p_listen(unix_ok=False)),
    _k("server.request_log", _p_path(none_word="off")),
    _k("server.request_log_bytes", _p_size(lo=1024)),
    _k("server.canonicalize_tools", _p_bool()),
    _k("server.strip_billing_header", _p_bool()),
)
KEY_BY_NAME: dict[str, KeySpec] = {k.key: k for k in KEYS}
FLAGS: dict[str, str | None] = {**{k.flag: k.key for k in KEYS}, **ALIASES}


def _apply(key: str, raw: Any, from_flag: bool, source: str) -> Any:
    spec = KEY_BY_NAME[key]
    try:
        return spec.parse(raw, from_flag)
    except _Bad as e:
        raise ConfigError(key, raw, str(e), source) from None
