"""ignisd configuration (DESIGN §6): a frozen dataclass tree from a TOML file (``--config``) overridden by flags.

Every key ``section.key_name`` has exactly one flag ``--section-key-name``; the only aliases are ``--config``,
``--model``, ``--socket``, ``--lanes`` and ``--log-level``. Units: sizes are bytes or take K/M/G/T (powers of 2^10),
and keys that accept tokens take a trailing ``tok`` (``900Ktok``); durations are seconds or take s/m/h; booleans are
on/off/true/false and a bare boolean flag means on. Every problem raises ``ConfigError`` naming the key, the value
and what is allowed. †: imports no torch.
"""
from __future__ import annotations

import difflib
import os
import re
import sys
import tomllib
from dataclasses import dataclass, field, fields, replace
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Mapping

from ignis_client.protocol import resolve_socket_path

SECTIONS = ("model", "vram", "kv", "reuse", "server")
ALIASES = {"--config": None, "--model": "model.path", "--socket": "server.socket", "--lanes": "server.lanes",
           "--log-level": "server.log_level"}
KV_FORMAT_CHOICES = ("fp32", "bf16", "hq-e8-2b")
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
        shown = "" if value is _NO_VALUE else f" {value!r}"
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


def _default_disk_dir(env: Mapping[str, str]) -> str:
    if env.get("STATE_DIRECTORY"):
        return env["STATE_DIRECTORY"].split(":")[0]
    return os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache", "ignis", "kv")


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = None               # None: the built-in SmolLM2-135M-Instruct
    kv_format: str | None = None          # None: auto (hq-e8-2b if head_dim >= 128, else fp32 on CPU / bf16 on CUDA)
    context_tokens: int | None = None     # None: the model's


@dataclass(frozen=True)
class VramConfig:
    kv_pool_bytes: Size | None = None     # None: lanes x context x bytes/token, capped by memory


@dataclass(frozen=True)
class KvConfig:
    exact_window: int | None = None       # tokens; None: per HQ_E8_2B.md
    exact_sinks: int = 1
    disk_bytes: int = 0                   # 0: KV-disk off
    disk_dir: str = field(default_factory=lambda: _default_disk_dir(os.environ))


@dataclass(frozen=True)
class ReuseConfig:
    prompt: bool = True
    device_slots: int = 0
    host_slots_per_lane: int = 2
    kv_host_pool_bytes: int = 2 * 2**30
    retained_interactive_ttl: float = 300.0      # seconds
    restore_floor_ram: int | None = None         # tokens; None: from the cost model
    restore_floor_disk: int | None = None
    evict_window_pages: int = 16


@dataclass(frozen=True)
class ServerConfig:
    socket: str = field(default_factory=lambda: resolve_socket_path(os.environ))
    lanes: int = 8
    threads: int | None = None            # None: number of cores
    prefill_chunk: int = 256
    round_prefill_tokens: int = 512
    default_max_tokens: int = 4096
    developer_message_policy: str = "into-system"
    max_queue: int = 256
    max_inflight_per_connection: int = 64
    max_line_bytes: int = 16 * 2**20
    log_level: str = "info"
    api_key_file: str | None = None
    socket_mode: int = 0o600
    socket_group: str | None = None
    shutdown_grace_s: float = 30.0
    idle_unload_s: float = 0.0            # 0: off
    http_listen: str | None = None        # "HOST:PORT" | "unix:PATH"; None: off
    metrics_listen: str | None = None     # "HOST:PORT"; None: off
    request_log: str | None = None        # path; None: off
    request_log_bytes: int = 64 * 2**20
    canonicalize_tools: bool = False


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    vram: VramConfig = field(default_factory=VramConfig)
    kv: KvConfig = field(default_factory=KvConfig)
    reuse: ReuseConfig = field(default_factory=ReuseConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    config_file: str | None = None        # the --config file read, if any

    def to_dict(self) -> dict:
        """Nested plain dict {section: {key: value}} (Size as {"bytes", "tokens"}), e.g. for a startup log."""
        out = {}
        for s in SECTIONS:
            sec = getattr(self, s)
            out[s] = {f.name: (vars(v) if isinstance(v := getattr(sec, f.name), Size) else v) for f in fields(sec)}
        return out

    def effective_threads(self) -> int:
        """server.threads, or the number of usable cores when unset."""
        if self.server.threads is not None:
            return self.server.threads
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


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
               if tokens else "") + f", at least {lo}" + (", or \"auto\"" if auto else "") + (", or off" if off else ""))

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
)
KEY_BY_NAME: dict[str, KeySpec] = {k.key: k for k in KEYS}
FLAGS: dict[str, str | None] = {**{k.flag: k.key for k in KEYS}, **ALIASES}


def _apply(key: str, raw: Any, from_flag: bool, source: str) -> Any:
    spec = KEY_BY_NAME[key]
    try:
        return spec.parse(raw, from_flag)
    except _Bad as e:
        raise ConfigError(key, raw, str(e), source) from None


def _read_toml(path: str) -> dict:
    try:
        with open(os.path.expanduser(path), "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError("--config", path, "a readable TOML file", problem=f"cannot read ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", path, "valid TOML", problem=f"invalid TOML ({e}) in") from None


def _toml_values(doc: Mapping[str, Any], source: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for sec, body in doc.items():
        if sec not in SECTIONS:
            raise ConfigError(f"[{sec}]", _NO_VALUE, "sections " + ", ".join(SECTIONS), source,
                              problem="unknown section")
        if not isinstance(body, dict):
            raise ConfigError(f"[{sec}]", body, f"a [{sec}] table of keys", source, problem="not a table but")
        for name, raw in body.items():
            key = f"{sec}.{name}"
            if key not in KEY_BY_NAME:
                names = [k.name for k in KEYS if k.section == sec]
                hint = difflib.get_close_matches(name, names, 1)
                raise ConfigError(key, raw, f"keys of [{sec}]: {', '.join(names)}"
                                  + (f" (did you mean {hint[0]}?)" if hint else ""), source, problem="unknown key, given")
            values[key] = _apply(key, raw, False, source)
    return values


def _split_argv(argv: list[str]) -> tuple[str | None, list[tuple[str, str, Any]]]:
    """argv → (config path, [(key, flag, raw value)]) in order; bare boolean flags get True."""
    config_path, items, i = None, [], 0
    argv = list(argv)
    if argv[:1] == ["serve"]:
        argv = argv[1:]
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not arg.startswith("--") or arg == "--":
            raise ConfigError(arg, _NO_VALUE, "options of the form --section-key-name VALUE (see --help)",
                              problem="unexpected argument")
        flag, eq, val = arg.partition("=")
        if flag not in FLAGS:
            hint = difflib.get_close_matches(flag, list(FLAGS), 1)
            raise ConfigError(flag, _NO_VALUE, "the flags listed by ignisd serve --help"
                              + (f" (did you mean {hint[0]}?)" if hint else ""), problem="unknown option")
        key = FLAGS[flag]
        is_bool = key is not None and KEY_BY_NAME[key].is_bool
        if not eq:
            if is_bool and (i >= len(argv) or argv[i].startswith("--")):
                val = True
            elif i < len(argv) and argv[i].partition("=")[0] not in FLAGS:
                val = argv[i]
                i += 1
            else:
                raise ConfigError(key or flag, _NO_VALUE, KEY_BY_NAME[key].allowed if key else "a path to a TOML file",
                                  f"flag {flag}", problem="missing value")
        if key is None:
            config_path = val
        else:
            items.append((key, flag, val))
    return config_path, items


def help_text() -> str:
    """Usage text listing every flag and what it accepts."""
    lines = ["usage: ignisd serve [--config FILE] [--section-key-name VALUE ...]", "",
             "aliases: --config FILE, --model (model.path), --socket (server.socket), --lanes (server.lanes),",
             "         --log-level (server.log_level)", ""]
    lines += [f"  {k.flag:<40} {k.allowed}" for k in KEYS]
    return "\n".join(lines) + "\n"


def parse_serve_args(argv: list[str], env: Mapping[str, str] | None = None) -> Config:
    """``ignisd serve`` arguments (a leading "serve" is skipped) → Config. The TOML file named by --config is read
    first, then every flag overrides it (the last occurrence of a key wins). ``--help`` prints help_text() and
    raises SystemExit(0). Defaults that depend on the environment (server.socket, kv.disk_dir) use ``env``.
    Raises ConfigError naming the key, the value and what is allowed."""
    env = os.environ if env is None else env
    if "--help" in argv or "-h" in argv:
        sys.stdout.write(help_text())
        raise SystemExit(0)
    config_path, items = _split_argv(argv)
    values = _toml_values(_read_toml(config_path), config_path) if config_path else {}
    for key, flag, raw in items:
        values[key] = _apply(key, raw, True, f"flag {flag}")
    return config_from_values(values, env, config_file=config_path)


def config_from_values(values: Mapping[str, Any], env: Mapping[str, str] | None = None,
                       config_file: str | None = None) -> Config:
    """Config from already-parsed {"section.key": value}; unset keys take their defaults (env-resolved)."""
    env = os.environ if env is None else env
    unknown = set(values) - set(KEY_BY_NAME)
    if unknown:
        k = sorted(unknown)[0]
        raise ConfigError(k, values[k], "the keys of DESIGN §6", problem="unknown key, given")
    kw: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for key, v in values.items():
        sec, name = key.split(".")
        kw[sec][name] = v
    if "socket" not in kw["server"]:
        kw["server"]["socket"] = _apply("server.socket", resolve_socket_path(env), False, "the default of DESIGN §6")
    kw["kv"].setdefault("disk_dir", _default_disk_dir(env))
    return Config(model=ModelConfig(**kw["model"]), vram=VramConfig(**kw["vram"]), kv=KvConfig(**kw["kv"]),
                  reuse=ReuseConfig(**kw["reuse"]), server=ServerConfig(**kw["server"]), config_file=config_file)


def config_from_toml(doc: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
    """Config from a TOML-shaped dict ({"server": {"lanes": 2}}), validated exactly like a --config file."""
    return config_from_values(_toml_values(doc, "dict"), env)


def with_overrides(cfg: Config, **keys: Any) -> Config:
    """A copy of cfg with keys changed, given as section__name=value (``server__lanes=2``) in parsed form."""
    out = cfg
    for k, v in keys.items():
        sec, name = k.split("__")
        if f"{sec}.{name}" not in KEY_BY_NAME:
            raise ConfigError(f"{sec}.{name}", v, "the keys of DESIGN §6", problem="unknown key, given")
        out = replace(out, **{sec: replace(getattr(out, sec), **{name: v})})
    return out
