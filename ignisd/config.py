"""ignisd configuration (DESIGN §6): a frozen dataclass tree from a TOML file (``--config``) overridden by flags.

Every key ``section.key_name`` has exactly one flag ``--section-key-name``; the only aliases are ``--config``,
``--model``, ``--socket``, ``--lanes`` and ``--log-level``. Units: sizes are bytes or take K/M/G/T (powers of 2^10),
and keys that accept tokens take a trailing ``tok`` (``900Ktok``); durations are seconds or take s/m/h; booleans are
on/off/true/false and a bare boolean flag means on. Every problem raises ``ConfigError`` naming the key, the value
and what is allowed. †: imports no torch.

The key table, its value parsers and ``ConfigError`` live in ``ignisd.config_keys`` and are re-exported here.
"""
from __future__ import annotations

import difflib
import os
import sys
import tomllib
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from ignis_client.protocol import resolve_socket_path
from ignisd.config_keys import (ALIASES, DEVELOPER_POLICIES, FLAGS, KEY_BY_NAME, KEYS, KV_FORMAT_CHOICES, LOG_LEVELS,
                                MAX_SOCKET_PATH_BYTES, SECTIONS, ConfigError, KeySpec, Size, _NO_VALUE, _apply)

__all__ = ["SECTIONS", "ALIASES", "KV_FORMAT_CHOICES", "DEVELOPER_POLICIES", "LOG_LEVELS", "MAX_SOCKET_PATH_BYTES",
           "ConfigError", "Size", "KeySpec", "KEYS", "KEY_BY_NAME", "FLAGS",
           "ModelConfig", "VramConfig", "KvConfig", "ReuseConfig", "ServerConfig", "Config",
           "help_text", "parse_serve_args", "config_from_values", "config_from_toml", "with_overrides"]


def _default_disk_dir(env: Mapping[str, str]) -> str:
    if env.get("STATE_DIRECTORY"):
        return env["STATE_DIRECTORY"].split(":")[0]
    return os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache", "ignis", "kv")


@dataclass(frozen=True)
class ModelConfig:
    path: str | None = None               # None: the built-in SmolLM2-135M-Instruct
    kv_format: str | None = None          # None: auto (hq-e8-2b if head_dim >= 128, else fp32 on CPU / bf16 on CUDA)
    context_tokens: int | None = None     # None: the model's
    weight_format: str = "native"         # native (the file's quantization where a kernel exists) | bf16 | fp32


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
    strip_billing_header: bool = True     # drop a system block starting x-anthropic-billing-header: (HTTP fronts)


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
        if sec not in SECTIONS and not isinstance(body, dict):      # `lanes = 4` above every [section]
            homes = [k.key for k in KEYS if k.name == sec]
            raise ConfigError(sec, body, "keys inside the sections " + ", ".join(SECTIONS)
                              + (f" (did you mean {homes[0]}, under [{homes[0].split('.')[0]}]?)" if homes else ""),
                              source, problem="a key outside any section, given")
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
                                  + (f" (did you mean {hint[0]}?)" if hint else ""), source,
                                  problem="unknown key, given")
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


def config_from_toml(doc: Mapping[str, Any], env: Mapping[str, str] | None = None, source: str = "dict") -> Config:
    """Config from a TOML-shaped dict ({"server": {"lanes": 2}}), validated exactly like a --config file; source
    names where the dict came from in a ConfigError (a file's path)."""
    return config_from_values(_toml_values(doc, source), env)


def with_overrides(cfg: Config, **keys: Any) -> Config:
    """A copy of cfg with keys changed, given as section__name=value (``server__lanes=2``) in parsed form."""
    out = cfg
    for k, v in keys.items():
        sec, name = k.split("__")
        if f"{sec}.{name}" not in KEY_BY_NAME:
            raise ConfigError(f"{sec}.{name}", v, "the keys of DESIGN §6", problem="unknown key, given")
        out = replace(out, **{sec: replace(getattr(out, sec), **{name: v})})
    return out
