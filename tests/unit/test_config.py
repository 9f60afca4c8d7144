"""ignisd configuration (DESIGN §6): the key list comes from the design's own table, parsed here from the
markdown, so the code cannot drift from it; units, booleans, TOML + flag precedence, aliases, and errors that name
the key, the value and what is allowed."""
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from ignisd import config as C
from ignisd.config import ConfigError, Size, parse_serve_args

ROOT = Path(__file__).resolve().parents[2]
DESIGN_CANDIDATES = [ROOT / "DESIGN.md", ROOT / "docs" / "DESIGN.md", ROOT.parent / "shared" / "DESIGN.md"]
ENV = {"XDG_RUNTIME_DIR": "/run/user/1000", "HOME": "/home/u"}
ALIASES = {"--config", "--model", "--socket", "--lanes", "--log-level"}


def design_keys() -> list[str]:
    """Every `section.key` in the first column of the table of DESIGN §6."""
    path = next((p for p in DESIGN_CANDIDATES if p.exists()), None)
    if path is None:
        pytest.skip(f"DESIGN.md not found at {[str(p) for p in DESIGN_CANDIDATES]}")
    text = path.read_text()
    section = text[text.index("## 6. Configuration"):]
    section = section[:section.index("\n## ", 10)]
    keys = []
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        first = line.split("|")[1].strip()
        for k in first.split(","):
            k = k.strip()
            if re.fullmatch(r"(model|vram|kv|reuse|server)\.[a-z_]+", k):
                keys.append(k)
    assert len(keys) > 30, keys
    return keys


def cfg(*argv, env=ENV):
    return parse_serve_args(list(argv), env=env)


def get(c, key):
    sec, name = key.split(".")
    return getattr(getattr(c, sec), name)


def error_of(*argv, env=ENV) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        parse_serve_args(list(argv), env=env)
    return ei.value


# One valid non-default value per key of the design table, with the value it must parse to.
SAMPLES = {
    "model.path": ("/models/m.gguf", "/models/m.gguf"),
    "model.kv_format": ("bf16", "bf16"),
    "model.context_tokens": ("4096", 4096),
    "model.weight_format": ("fp32", "fp32"),
    "vram.kv_pool_bytes": ("900Ktok", Size(tokens=900 * 1024)),
    "kv.exact_window": ("128", 128),
    "kv.exact_sinks": ("4", 4),
    "kv.disk_bytes": ("100G", 100 * 2**30),
    "kv.disk_dir": ("/var/tmp/kv", "/var/tmp/kv"),
    "reuse.prompt": ("off", False),
    "reuse.device_slots": ("2", 2),
    "reuse.host_slots_per_lane": ("3", 3),
    "reuse.kv_host_pool_bytes": ("512M", 512 * 2**20),
    "reuse.retained_interactive_ttl": ("10m", 600.0),
    "reuse.restore_floor_ram": ("64", 64),
    "reuse.restore_floor_disk": ("1024", 1024),
    "reuse.evict_window_pages": ("4", 4),
    "server.socket": ("/tmp/x/ignisd.sock", "/tmp/x/ignisd.sock"),
    "server.lanes": ("2", 2),
    "server.threads": ("1", 1),
    "server.prefill_chunk": ("128", 128),
    "server.round_prefill_tokens": ("1024", 1024),
    "server.default_max_tokens": ("100", 100),
    "server.developer_message_policy": ("after-system", "after-system"),
    "server.max_queue": ("3", 3),
    "server.max_inflight_per_connection": ("2", 2),
    "server.max_line_bytes": ("64K", 65536),
    "server.log_level": ("debug", "debug"),
    "server.api_key_file": ("/etc/ignis/key", "/etc/ignis/key"),
    "server.socket_mode": ("0660", 0o660),
    "server.socket_group": ("ignis", "ignis"),
    "server.shutdown_grace_s": ("1m", 60.0),
    "server.idle_unload_s": ("2h", 7200.0),
    "server.http_listen": ("127.0.0.1:8080", "127.0.0.1:8080"),
    "server.metrics_listen": ("[::1]:9100", "[::1]:9100"),
    "server.request_log": ("/var/log/ignis/requests.log", "/var/log/ignis/requests.log"),
    "server.request_log_bytes": ("1M", 2**20),
    "server.canonicalize_tools": ("on", True),
    "server.strip_billing_header": ("off", False),
}


def test_every_design_key_has_exactly_one_flag_and_a_field():
    keys = design_keys()
    assert sorted(keys) == sorted(C.KEY_BY_NAME), "config keys differ from the DESIGN §6 table"
    flags_of: dict[str, list[str]] = {}
    for flag, key in C.FLAGS.items():
        flags_of.setdefault(key, []).append(flag)
    for key in keys:
        expected = "--" + key.replace(".", "-").replace("_", "-")
        non_alias = [f for f in flags_of[key] if f not in ALIASES]
        assert non_alias == [expected], (key, flags_of[key])
        assert hasattr(getattr(C.Config(), key.split(".")[0]), key.split(".")[1])
    assert {f for f in C.FLAGS if C.FLAGS[f] is None or f in ALIASES} == ALIASES
    assert len(C.FLAGS) == len(keys) + len(ALIASES)


@pytest.mark.parametrize("key", sorted(SAMPLES))
def test_each_flag_parses(key):
    flag = "--" + key.replace(".", "-").replace("_", "-")
    raw, want = SAMPLES[key]
    assert get(cfg(flag, raw), key) == want
    assert get(cfg(f"{flag}={raw}"), key) == want


def test_samples_cover_the_design_table():
    assert sorted(SAMPLES) == sorted(design_keys())


def test_defaults_match_the_design_table():
    c = cfg()
    assert (c.model.path, c.model.kv_format, c.model.context_tokens, c.vram.kv_pool_bytes) == (None, None, None, None)
    assert (c.kv.exact_window, c.kv.exact_sinks, c.kv.disk_bytes) == (None, 1, 0)
    assert c.kv.disk_dir == "/home/u/.cache/ignis/kv"
    r = c.reuse
    assert (r.prompt, r.device_slots, r.host_slots_per_lane, r.kv_host_pool_bytes) == (True, 0, 2, 2 * 1024**3)
    assert (r.retained_interactive_ttl, r.restore_floor_ram, r.restore_floor_disk, r.evict_window_pages) == (
        300.0, None, None, 16)
    s = c.server
    assert s.socket == "/run/user/1000/ignis/ignisd.sock" or s.socket == "/run/ignis/ignisd.sock"
    assert (s.lanes, s.threads, s.prefill_chunk, s.round_prefill_tokens, s.default_max_tokens) == (
        8, None, 256, 512, 4096)
    assert (s.developer_message_policy, s.max_queue, s.max_inflight_per_connection, s.max_line_bytes) == (
        "into-system", 256, 64, 16 * 1024 * 1024)
    assert (s.log_level, s.api_key_file, s.socket_mode, s.socket_group) == ("info", None, 0o600, None)
    assert (s.shutdown_grace_s, s.idle_unload_s, s.http_listen, s.metrics_listen) == (30.0, 0.0, None, None)
    assert (s.request_log, s.request_log_bytes, s.canonicalize_tools) == (None, 64 * 1024 * 1024, False)
    assert c.config_file is None and c.effective_threads() >= 1


def test_socket_and_disk_dir_follow_the_environment():
    c = cfg(env={"IGNIS_SOCKET": "/s/a.sock", "STATE_DIRECTORY": "/var/lib/ignis", "RUNTIME_DIRECTORY": "/run/i"})
    assert c.server.socket == "/s/a.sock" and c.kv.disk_dir == "/var/lib/ignis"
    assert cfg(env={"RUNTIME_DIRECTORY": "/run/i"}).server.socket == "/run/i/ignisd.sock"
    assert cfg("--socket", "/o/x.sock", env={"IGNIS_SOCKET": "/s/a.sock"}).server.socket == "/o/x.sock"


# ------------------------------------------------------------------ units

@pytest.mark.parametrize("raw,want", [
    ("512", Size(bytes=512)), ("2G", Size(bytes=2 * 2**30)), ("2g", Size(bytes=2 * 2**30)),
    ("1.5K", Size(bytes=1536)), ("3T", Size(bytes=3 * 2**40)), ("7M", Size(bytes=7 * 2**20)),
    ("900Ktok", Size(tokens=921600)), ("100tok", Size(tokens=100)), ("1Mtok", Size(tokens=2**20)),
])
def test_sizes(raw, want):
    assert cfg("--vram-kv-pool-bytes", raw).vram.kv_pool_bytes == want


def test_size_to_bytes():
    assert Size(tokens=10).to_bytes(1000) == 10000 and Size(bytes=7).to_bytes(1000) == 7


@pytest.mark.parametrize("raw", ["2X", "-1", "G", "1.5tok", "0.3", "two", "2GB", "0", "0tok", ""])
def test_bad_sizes_name_key_value_and_units(raw):
    e = error_of("--vram-kv-pool-bytes", raw)
    assert e.key == "vram.kv_pool_bytes" and e.value == raw
    msg = str(e)
    assert msg.startswith("vram.kv_pool_bytes:") and json.dumps(raw) in msg and "K/M/G/T" in msg and "tok" in msg
    assert "--vram-kv-pool-bytes" in msg


def test_tokens_refused_where_only_bytes_make_sense():
    e = error_of("--reuse-kv-host-pool-bytes", "900Ktok")
    assert e.key == "reuse.kv_host_pool_bytes" and '"900Ktok"' in str(e)


@pytest.mark.parametrize("raw,want", [("300s", 300.0), ("5m", 300.0), ("1h", 3600.0), ("2.5", 2.5), ("1.5h", 5400.0),
                                      ("0", 0.0)])
def test_durations(raw, want):
    assert cfg("--reuse-retained-interactive-ttl", raw).reuse.retained_interactive_ttl == want


@pytest.mark.parametrize("raw", ["5d", "-1", "abc", "1 hour", "m"])
def test_bad_durations(raw):
    e = error_of("--server-shutdown-grace-s", raw)
    assert e.key == "server.shutdown_grace_s" and json.dumps(raw) in str(e) and "s/m/h" in str(e)


def test_off_for_keys_whose_zero_means_off():
    assert cfg("--server-idle-unload-s", "off").server.idle_unload_s == 0.0
    assert cfg("--kv-disk-bytes", "off").kv.disk_bytes == 0
    assert cfg("--server-http-listen", "off").server.http_listen is None


@pytest.mark.parametrize("raw,want", [("on", True), ("off", False), ("true", True), ("false", False), ("ON", True),
                                      ("False", False)])
def test_booleans(raw, want):
    assert cfg("--server-canonicalize-tools", raw).server.canonicalize_tools is want
    assert cfg(f"--reuse-prompt={raw}").reuse.prompt is want


def test_bare_boolean_flag_means_on():
    assert cfg("--server-canonicalize-tools").server.canonicalize_tools is True
    c = cfg("--server-canonicalize-tools", "--lanes", "3")
    assert c.server.canonicalize_tools is True and c.server.lanes == 3
    assert cfg("--reuse-prompt", "off", "--reuse-prompt").reuse.prompt is True


@pytest.mark.parametrize("raw", ["yes", "1", "enabled"])
def test_bad_booleans(raw):
    e = error_of("--reuse-prompt", raw)
    assert str(e) == (f"reuse.prompt: invalid value {json.dumps(raw)} (from flag --reuse-prompt); allowed: on, off, "
                      f"true or false")


# ------------------------------------------------------------------ errors: key, value, allowed

@pytest.mark.parametrize("argv,key,value,allowed", [
    (["--lanes", "0"], "server.lanes", "0", "integer >= 1"),
    (["--server-lanes", "-2"], "server.lanes", "-2", "integer >= 1"),
    (["--server-lanes", "eight"], "server.lanes", "eight", "integer >= 1"),
    (["--server-prefill-chunk", "0"], "server.prefill_chunk", "0", "integer >= 1"),
    (["--server-round-prefill-tokens", "0"], "server.round_prefill_tokens", "0", "integer >= 1"),
    (["--server-default-max-tokens", "0"], "server.default_max_tokens", "0", "integer >= 1"),
    (["--server-default-max-tokens", "3000000000"], "server.default_max_tokens", "3000000000", "<= 2147483647"),
    (["--server-max-inflight-per-connection", "0"], "server.max_inflight_per_connection", "0", "integer >= 1"),
    (["--server-max-queue", "-1"], "server.max_queue", "-1", "integer >= 0"),
    (["--server-threads", "0"], "server.threads", "0", "integer >= 1"),
    (["--reuse-evict-window-pages", "0"], "reuse.evict_window_pages", "0", "integer >= 1"),
    (["--model-context-tokens", "0"], "model.context_tokens", "0", "integer >= 1"),
    (["--server-max-line-bytes", "10"], "server.max_line_bytes", "10", "at least 1024"),
    (["--model-kv-format", "int8"], "model.kv_format", "int8", "fp32 | bf16 | hq-e8-2b"),
    (["--server-developer-message-policy", "drop"], "server.developer_message_policy", "drop",
     "keep | into-system | after-system"),
    (["--log-level", "verbose"], "server.log_level", "verbose", "debug | info | warning | error"),
    (["--server-socket-mode", "0999"], "server.socket_mode", "0999", "octal"),
    (["--server-socket-mode", "1777"], "server.socket_mode", "1777", "0777"),
    (["--server-http-listen", "localhost"], "server.http_listen", "localhost", "HOST:PORT"),
    (["--server-metrics-listen", "unix:/x"], "server.metrics_listen", "unix:/x", "HOST:PORT"),
    (["--server-metrics-listen", "h:70000"], "server.metrics_listen", "h:70000", "0-65535"),
    (["--socket", "/" + "s" * 120], "server.socket", "/" + "s" * 120, "at most 107 bytes"),
])
def test_range_and_choice_errors(argv, key, value, allowed):
    e = error_of(*argv)
    assert (e.key, e.value) == (key, value)
    msg = str(e)
    assert msg.startswith(f"{key}: invalid value {json.dumps(value)} (from flag {argv[0]}); allowed: "), msg
    assert allowed in msg


def test_hq_e8_2b_and_auto_are_accepted_by_config():
    assert cfg("--model-kv-format", "hq-e8-2b").model.kv_format == "hq-e8-2b"
    assert cfg("--model-kv-format", "fp32", "--model-kv-format", "auto").model.kv_format is None


def test_flag_errors():
    e = error_of("--server-lanez", "3")
    assert e.key == "--server-lanez" and "unknown option" in str(e) and "--server-lanes" in str(e)
    e = error_of("--lanes")
    assert e.key == "server.lanes" and "missing value" in str(e) and "integer >= 1" in str(e)
    e = error_of("--socket", "--lanes", "2")
    assert e.key == "server.socket" and "missing value" in str(e)
    e = error_of("stray")
    assert e.key == "stray" and "unexpected argument" in str(e)


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as ei:
        parse_serve_args(["--help"], env=ENV)
    assert ei.value.code == 0
    out = capsys.readouterr().out
    assert "--server-prefill-chunk" in out and "--vram-kv-pool-bytes" in out


def test_leading_serve_word_is_skipped():
    assert cfg("serve", "--lanes", "2").server.lanes == 2


# ------------------------------------------------------------------ TOML file, then flags

def write(tmp_path, text: str) -> str:
    p = tmp_path / "ignisd.toml"
    p.write_text(text)
    return str(p)


def test_toml_then_flags_override(tmp_path):
    path = write(tmp_path, """
[model]
path = "~/models/m.gguf"
kv_format = "bf16"
[vram]
kv_pool_bytes = "900Ktok"
[reuse]
prompt = false
kv_host_pool_bytes = 1073741824
retained_interactive_ttl = 90
[server]
lanes = 4
max_line_bytes = "1M"
socket_mode = 0o660
shutdown_grace_s = "2m"
canonicalize_tools = "on"
""")
    c = cfg("--lanes", "2", "--config", path, "--model-kv-format", "fp32")
    assert c.config_file == path
    assert c.model.path.endswith("/models/m.gguf") and not c.model.path.startswith("~")
    assert c.model.kv_format == "fp32"               # flag beats file, whatever the order
    assert c.server.lanes == 2
    assert c.vram.kv_pool_bytes == Size(tokens=921600)
    assert c.reuse.prompt is False and c.reuse.kv_host_pool_bytes == 2**30
    assert c.reuse.retained_interactive_ttl == 90.0
    assert c.server.max_line_bytes == 2**20 and c.server.socket_mode == 0o660 and c.server.shutdown_grace_s == 120.0
    assert c.server.canonicalize_tools is True
    assert c.server.prefill_chunk == 256             # untouched keys keep their defaults


def test_aliases(tmp_path):
    c = cfg("--model", "/m.gguf", "--socket", "/s.sock", "--lanes", "3", "--log-level", "warning")
    assert (c.model.path, c.server.socket, c.server.lanes, c.server.log_level) == ("/m.gguf", "/s.sock", 3, "warning")
    assert cfg("--lanes", "3", "--server-lanes", "5").server.lanes == 5       # the last one wins
    assert cfg("--server-lanes", "5", "--lanes=3").server.lanes == 3
    path = write(tmp_path, "[server]\nlanes = 6\n")
    assert cfg(f"--config={path}").server.lanes == 6


@pytest.mark.parametrize("text,key,value,allowed", [
    ("[server]\nlanez = 3\n", "server.lanez", 3, "did you mean lanes"),
    ("[server]\nlanes = \"8\"\n", "server.lanes", "8", "integer >= 1"),
    ("[server]\nlanes = 8.0\n", "server.lanes", 8.0, "integer >= 1"),
    ("[server]\nlanes = true\n", "server.lanes", True, "integer >= 1"),
    ("[server]\nlanes = 0\n", "server.lanes", 0, "integer >= 1"),
    ("[server]\nprefill_chunk = 0\n", "server.prefill_chunk", 0, "integer >= 1"),
    ("[reuse]\nprompt = 1\n", "reuse.prompt", 1, "on, off, true or false"),
    ("[reuse]\nkv_host_pool_bytes = \"2 gigs\"\n", "reuse.kv_host_pool_bytes", "2 gigs", "K/M/G/T"),
    ("[server]\nsocket_mode = 600\n", "server.socket_mode", 600, "octal"),
    ("[model]\nkv_format = \"q8\"\n", "model.kv_format", "q8", "fp32 | bf16 | hq-e8-2b"),
    ("[server]\nlog_level = \"trace\"\n", "server.log_level", "trace", "debug | info | warning | error"),
])
def test_toml_errors(tmp_path, text, key, value, allowed):
    path = write(tmp_path, text)
    e = error_of("--config", path)
    assert (e.key, e.value) == (key, value)
    assert str(e).startswith(f"{key}: ") and json.dumps(value) in str(e) and allowed in str(e) and path in str(e)


def test_toml_unknown_section_and_bad_files(tmp_path):
    e = error_of("--config", write(tmp_path, "[gpu]\nlayers = 3\n"))
    assert e.key == "[gpu]" and "unknown section" in str(e) and "model, vram, kv, reuse, server" in str(e)
    e = error_of("--config", write(tmp_path, "lanes = 3\n"))
    assert (e.key, e.value) == ("lanes", 3) and str(e).startswith("lanes: a key outside any section, given 3")
    assert "(did you mean server.lanes, under [server]?)" in str(e), str(e)
    e = error_of("--config", write(tmp_path, "layers = 3\n"))
    assert e.key == "layers" and "outside any section" in str(e) and "did you mean" not in str(e), str(e)
    e = error_of("--config", write(tmp_path, "[server\nlanes = 3\n"))
    assert e.key == "--config" and "invalid TOML" in str(e)
    e = error_of("--config", str(tmp_path / "missing.toml"))
    assert e.key == "--config" and "missing.toml" in str(e) and "cannot read" in str(e)


def test_config_from_toml_and_overrides():
    c = C.config_from_toml({"server": {"lanes": 2, "threads": 1}}, env=ENV)
    assert (c.server.lanes, c.server.threads) == (2, 1)
    c2 = C.with_overrides(c, server__prefill_chunk=16, model__kv_format="fp32")
    assert (c2.server.prefill_chunk, c2.model.kv_format, c2.server.lanes) == (16, "fp32", 2)
    with pytest.raises(ConfigError):
        C.config_from_toml({"server": {"nope": 1}}, env=ENV)


def test_config_is_frozen():
    c = cfg()
    with pytest.raises(AttributeError):
        c.server.lanes = 3


# ------------------------------------------------------------------ the example file in systemd/

def test_example_toml_lists_every_key_with_its_default():
    text = (ROOT / "systemd" / "ignisd.toml").read_text()
    uncommented, seen = [], []
    for line in text.splitlines():
        if m := re.fullmatch(r"# ([a-z_]+) = (.+)", line):
            uncommented.append(f"{m.group(1)} = {m.group(2)}")
        else:
            uncommented.append(line if line.startswith("[") else "")
        if line.startswith("["):
            section = line.strip("[]")
        elif m:
            seen.append(f"{section}.{m.group(1)}")
    assert sorted(seen) == sorted(C.KEY_BY_NAME)
    env = {"RUNTIME_DIRECTORY": "/run/ignis", "STATE_DIRECTORY": "/var/lib/ignis"}
    doc = tomllib.loads("\n".join(uncommented))
    assert C.config_from_toml(doc, env=env) == parse_serve_args([], env=env)


def test_example_toml_names_both_disk_dir_defaults():
    """kv.disk_dir defaults to $STATE_DIRECTORY (the unit's StateDirectory=ignis: /var/lib/ignis), else
    ~/.cache/ignis/kv: the example's line shows the first and names the second."""
    lines = (ROOT / "systemd" / "ignisd.toml").read_text().splitlines()
    line = next(x for x in lines if x.startswith("# disk_dir = "))
    m = re.fullmatch(r'# disk_dir = "([^"]+)" +# under systemd; outside it the default is "([^"]+)"', line)
    assert m, line
    assert "\nStateDirectory=ignis\n" in (ROOT / "systemd" / "ignisd.service").read_text()   # → /var/lib/ignis
    assert parse_serve_args([], env={"STATE_DIRECTORY": "/var/lib/ignis"}).kv.disk_dir == m.group(1) == "/var/lib/ignis"
    outside = parse_serve_args([], env={"HOME": "/home/u"}).kv.disk_dir
    assert outside == "/home/u/.cache/ignis/kv" == m.group(2).replace("~", "/home/u", 1)
