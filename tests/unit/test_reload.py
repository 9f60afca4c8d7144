"""How each configuration key takes effect on SIGHUP (ignisd/reload.py): reload (drain + load), at once, or at the
next restart."""
from __future__ import annotations

from ignisd.config import KEYS, Config, with_overrides
from ignisd.reload import changed_keys, effective_config, key_kind, plan_reload


def test_every_key_has_a_kind_and_the_pool_and_model_keys_reload():
    kinds = {k.key: key_kind(k.key) for k in KEYS}
    assert set(kinds.values()) == {"reload", "now", "restart"}
    for key in ("model.path", "model.kv_format", "model.context_tokens", "vram.kv_pool_bytes", "kv.disk_bytes",
                "reuse.prompt", "reuse.kv_host_pool_bytes", "server.lanes", "server.threads", "server.prefill_chunk",
                "server.round_prefill_tokens"):
        assert kinds[key] == "reload", key
    for key in ("server.log_level", "server.api_key_file", "server.socket_mode", "server.socket_group",
                "server.max_queue", "server.default_max_tokens", "server.shutdown_grace_s", "server.idle_unload_s",
                "server.max_line_bytes", "server.max_inflight_per_connection", "server.developer_message_policy"):
        assert kinds[key] == "now", key
    assert [k for k, v in kinds.items() if v == "restart"] == ["server.socket", "server.http_listen",
                                                              "server.metrics_listen"]


def test_plan_and_effective_config():
    old = Config()
    new = with_overrides(old, server__log_level="debug", server__lanes=2, model__context_tokens=512,
                         server__socket="/tmp/elsewhere.sock", server__socket_mode=0o660)
    assert list(changed_keys(old, new)) == ["model.context_tokens", "server.socket", "server.lanes",
                                            "server.log_level", "server.socket_mode"]
    plan = plan_reload(old, new)
    assert plan.reload == ["model.context_tokens", "server.lanes"] and plan.needs_reload
    assert plan.now == ["server.log_level", "server.socket_mode"] and plan.restart == ["server.socket"]
    eff = effective_config(old, new)
    assert eff.server.socket == old.server.socket and eff.server.lanes == 2 and eff.server.log_level == "debug"
    back = effective_config(old, eff, plan.reload)          # a failed reload keeps the old model keys
    assert back.model.context_tokens is None and back.server.lanes == 8 and back.server.log_level == "debug"
    assert plan_reload(old, old).empty and not plan_reload(old, old).needs_reload
