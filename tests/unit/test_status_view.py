"""`ignis status` bars (client/status_view.py) checked against a status reply by hand, and the CLI's --json and
--watch on a scripted daemon."""
from __future__ import annotations

import copy
import json

from ignis_client import cli
from ignis_client.status_view import bar, human_age, human_bytes, render_status

STATUS = {
    "model": {"name": "Qwen3.5-27B", "arch": "qwen3_5", "kv_format": "bf16", "context_tokens": 32768,
              "page_tokens": 64, "page_bytes": 262144, "state_bytes": 150994944},
    "lanes": {"total": 8, "prefill": 1, "decode": 2, "evicted": 0}, "queue": {"waiting": 3},
    "kv_pool": {"pages_total": 1000, "pages_free": 600, "pages_live": 300, "pages_retained": 100},
    "slots": {"device_total": 2, "device_free": 1, "host_total": 16, "host_free": 12},
    "tiers": [{"tier": "ram", "bytes_total": 2 << 30, "bytes_used": 512 << 20, "states": 3}],
    "retained": [{"kind": "prefix", "tier": "device", "tokens": 4096, "priority": "agent", "age_s": 75,
                  "idle_s": 12, "holders": 2},
                 {"kind": "checkpoint", "tier": "ram", "tokens": 5120, "priority": "interactive", "age_s": 4000,
                  "idle_s": 3, "holders": 1}],
    "requests": [{"id": "c1:r1", "request_id": "r1", "state": "decode", "prompt_tokens": 5000, "cached_tokens": 4096,
                  "generated": 12}],
    "live_states": {"slots_total": 8, "slots_used": 3, "bytes_used": 452984832},
    "daemon": {"state": "ready", "uptime_s": 3725},
}

EXPECTED = """\
ignisd    Qwen3.5-27B (qwen3_5, bf16 KV, context 32768)  ready, up 1h02m
KV pool   [##########===...................] 100 MiB used of 250 MiB, 150 MiB free
          300 live + 100 retained of 1000 pages (64 tokens a page, 256 KiB)
slots     [#########.......................] 5 used of 18 (device 1/2, host 4/16), 720 MiB of 2.53 GiB
KV-RAM    [########........................] 512 MiB used of 2.00 GiB, 1.50 GiB free, 3 states
KV-disk   off
lanes     [############....................] 3 of 8 busy (1 prefill, 2 decode, 0 evicted)
queue     3 waiting
retained  kind        tokens  tier       age    idle  priority
          prefix        4096  device   1m15s     12s  agent
          checkpoint    5120  ram      1h06m      3s  interactive
requests  id                      state      prompt cached generated
          r1                      decode       5000   4096        12
"""


def test_the_drawing_of_a_status_reply():
    assert render_status(STATUS) == EXPECTED


def test_a_request_row_shows_the_id_of_the_logs_or_else_the_engine_key():
    """Rows name the request by the id its log lines use (request_id); a daemon from before request_id gives only
    the engine's key, which is drawn instead."""
    st = copy.deepcopy(STATUS)
    del st["requests"][0]["request_id"]
    assert render_status(st).endswith("          c1:r1                   decode       5000   4096        12\n")


def test_an_idle_attention_only_model_with_the_tiers_off():
    st = copy.deepcopy(STATUS)
    st["kv_pool"] = {"pages_total": 32, "pages_free": 32, "pages_live": 0, "pages_retained": 0}
    st["slots"] = {"device_total": 0, "device_free": 0, "host_total": 0, "host_free": 0}
    st["lanes"] = {"total": 4, "prefill": 0, "decode": 0, "evicted": 0}
    st["tiers"], st["retained"], st["requests"], st["queue"] = [], [], [], {"waiting": 0}
    del st["daemon"]
    lines = render_status(st, width=8).splitlines()
    assert lines[0] == "ignisd    Qwen3.5-27B (qwen3_5, bf16 KV, context 32768)"
    assert lines[1] == "KV pool   [........] 0 B used of 8.00 MiB, 8.00 MiB free"
    assert lines[3] == "slots     none (no per-sequence state to retain on this model)"
    assert lines[4:6] == ["KV-RAM    off", "KV-disk   off"]
    assert lines[6] == "lanes     [........] 0 of 4 busy (0 prefill, 0 decode, 0 evicted)"
    assert lines[-1] == "retained  none"


def test_bars_and_units():
    assert bar([(1, "#")], 1000, 10) == "[#.........]"            # a non-zero share gets a cell
    assert bar([(6, "#"), (6, "=")], 10, 10) == "[######====]"     # never wider than the bar
    assert bar([], 0, 4) == "[    ]"
    assert [human_bytes(n) for n in (0, 1023, 1536, 10 << 20, 150 << 20, 3 << 40)] == [
        "0 B", "1023 B", "1.50 KiB", "10.0 MiB", "150 MiB", "3.00 TiB"]
    assert [human_age(s) for s in (0, 59.9, 60, 3599, 7260)] == ["0s", "59s", "1m00s", "59m59s", "2h01m"]


class FakeClient:
    def __init__(self, *a, **k):
        self.calls = 0

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False

    def status(self):
        self.calls += 1
        if self.calls > 2:
            raise KeyboardInterrupt
        return STATUS


def test_cli_draws_bars_json_and_watch(monkeypatch, capsys):
    monkeypatch.setattr(cli, "Client", FakeClient)
    assert cli.main(["status"]) == 0
    assert capsys.readouterr().out == EXPECTED
    assert cli.main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == STATUS
    monkeypatch.setattr(cli.time, "sleep", lambda s: None)
    assert cli.main(["status", "--watch"]) == 130                 # redraws until interrupted
    assert capsys.readouterr().out == (cli.CLEAR + EXPECTED) * 2
