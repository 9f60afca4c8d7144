"""What a SIGHUP re-read of the configuration changes, and how each change takes effect (issue 13). †: no torch.

``plan_reload(old, new)`` compares two Configs key by key and sorts every changed key into one of three kinds:

* **reload** — the model, the pools or what sizes them: every ``model.*``, ``vram.*``, ``kv.*`` and ``reuse.*``
  key and ``server.lanes``, ``server.threads``, ``server.prefill_chunk``, ``server.round_prefill_tokens``. The
  daemon drains (new requests wait, running ones finish within server.shutdown_grace_s, then the rest are
  cancelled), frees the model and loads it again with the new values.
* **now** — applied at once, without a drain: log level, API key file, socket mode and group, queue and connection
  limits, line limit, default max_tokens, developer message policy, shutdown grace, idle unload, and the keys that
  only later features read (request log, tool canonicalisation, billing header).
* **restart** — the listeners (``server.socket``, ``server.http_listen``, ``server.metrics_listen``): kept as they
  are until the daemon restarts (systemctl restart); the log says so.

The daemon logs one ``reload`` line naming the keys of each kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from ignisd.config import SECTIONS, Config

RELOAD_SERVER_KEYS = frozenset({"server.lanes", "server.threads", "server.prefill_chunk",
                                "server.round_prefill_tokens"})
RESTART_KEYS = frozenset({"server.socket", "server.http_listen", "server.metrics_listen"})
RELOAD_SECTIONS = frozenset({"model", "vram", "kv", "reuse"})


def key_kind(key: str) -> str:
    """How a change of `key` ("section.name") takes effect: "reload", "now" or "restart"."""
    if key in RESTART_KEYS:
        return "restart"
    if key.split(".")[0] in RELOAD_SECTIONS or key in RELOAD_SERVER_KEYS:
        return "reload"
    return "now"


def changed_keys(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """{"section.key": (old value, new value)} for every key whose value differs, in the key table's order."""
    out = {}
    for sec in SECTIONS:
        a, b = getattr(old, sec), getattr(new, sec)
        for f in fields(a):
            va, vb = getattr(a, f.name), getattr(b, f.name)
            if va != vb:
                out[f"{sec}.{f.name}"] = (va, vb)
    return out


@dataclass
class ReloadPlan:
    """The changed keys of a re-read configuration, by kind (each a list of "section.key", in table order)."""

    reload: list[str] = field(default_factory=list)
    now: list[str] = field(default_factory=list)
    restart: list[str] = field(default_factory=list)

    @property
    def needs_reload(self) -> bool:
        """Whether the model must be drained and loaded again."""
        return bool(self.reload)

    @property
    def empty(self) -> bool:
        return not (self.reload or self.now or self.restart)


def plan_reload(old: Config, new: Config) -> ReloadPlan:
    """Sort the keys that differ between `old` and `new` by how they take effect."""
    plan = ReloadPlan()
    for key in changed_keys(old, new):
        getattr(plan, key_kind(key)).append(key)
    return plan


def effective_config(old: Config, new: Config, keep: frozenset[str] | list[str] = RESTART_KEYS) -> Config:
    """`new`, except the keys in `keep` ("section.key"), which keep their values from `old` (by default the
    restart-only keys: they stay as they are until a restart)."""
    out = new
    for key in keep:
        sec, name = key.split(".")
        out = replace(out, **{sec: replace(getattr(out, sec), **{name: getattr(getattr(old, sec), name)})})
    return out
