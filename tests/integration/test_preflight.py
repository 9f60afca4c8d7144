"""Start-up checks that need no weights are made before the weights load (ignisd/preflight.py, issue 8): each
refusal is exit 2 naming the key. The model used here has a valid config.json but unreadable weights, so a check
made after the load would end in exit 1 ("cannot load") instead."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from ignisd.config import Config, KvConfig, ReuseConfig, Size, VramConfig, ServerConfig
from ignisd.preflight import StartupError, check_exact_window, check_state_memory, plan_pool_pages, state_slot_counts


@pytest.fixture(scope="module")
def broken_weights_dir(tiny_llama_dir, tmp_path_factory):
    d = tmp_path_factory.mktemp("broken") / "model"
    shutil.copytree(tiny_llama_dir, d)
    (d / "model.safetensors").write_bytes(b"not a safetensors file")
    return d


def _serve(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "ignisd", "serve", "--socket", str(tmp_path / "s.sock"), *args],
                          capture_output=True, text=True, timeout=120)


def test_the_broken_model_really_fails_to_load(broken_weights_dir, tmp_path):
    r = _serve(tmp_path, "--model", str(broken_weights_dir))
    assert r.returncode == 1 and "cannot load" in r.stderr, r.stderr


@pytest.mark.parametrize("args, needle", [
    (["--vram-kv-pool-bytes", "63tok"], "vram.kv_pool_bytes = 63 tokens holds no whole KV page"),
    (["--vram-kv-pool-bytes", "100"], "vram.kv_pool_bytes = 100 bytes holds no whole KV page"),
    (["--vram-kv-pool-bytes", "1T"], "vram.kv_pool_bytes = 1099511627776 bytes asks for a KV pool of "),
    (["--model-context-tokens", "999999"], "model.context_tokens = 999999 exceeds the model's context"),
    (["--server-api-key-file", "/nonexistent/key"], "server.api_key_file '/nonexistent/key'"),
    (["--model-weight-format", "int4"], 'model.weight_format: invalid value "int4"'),
    (["--reuse-kv-host-pool-bytes", "64T"], "reuse.kv_host_pool_bytes = 70368744177664 bytes does not fit in the "
                                            "available memory ("),
    (["--model-kv-format", "hq-e8-2b", "--model-context-tokens", "512", "--kv-exact-window", "513"],
     "kv.exact_window = 513 tokens is more than the context of 512 tokens; at most 512"),
    (["--model-kv-format", "hq-e8-2b", "--kv-exact-window", "1000000"], "kv.exact_window = 1000000 tokens is more "),
    (["--model-kv-format", "hq-e8-2b", "--model-context-tokens", "512", "--kv-exact-sinks", "600"],
     "kv.exact_sinks = 600 tokens is more than the context of 512 tokens"),
])
def test_refused_before_the_weights_load(broken_weights_dir, tmp_path, args, needle):
    r = _serve(tmp_path, "--model", str(broken_weights_dir), *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and "Traceback" not in r.stderr and "cannot load" not in r.stderr, r.stderr


def test_an_empty_api_key_file_is_refused_before_the_load(broken_weights_dir, tmp_path):
    key = tmp_path / "key"
    key.write_text("  \n")
    r = _serve(tmp_path, "--model", str(broken_weights_dir), "--server-api-key-file", str(key))
    assert r.returncode == 2 and f"server.api_key_file '{key}' is empty" in r.stderr, r.stderr


def _cfg(size: Size | None, lanes: int = 2) -> Config:
    return Config(vram=VramConfig(kv_pool_bytes=size), server=ServerConfig(lanes=lanes))


@pytest.mark.parametrize("size, pages", [
    (Size(tokens=64), 1), (Size(tokens=127), 1), (Size(tokens=128), 2), (Size(tokens=900 * 1024), 14400),
    (Size(bytes=1000 * 64), 1), (Size(bytes=1000 * 64 * 3 - 1), 2),
])
def test_pool_sizes_round_down_to_whole_pages(size, pages):
    # 1,000 bytes a token: a page is 64,000 bytes
    assert plan_pool_pages(_cfg(size), 1000, 4096, 1 << 40) == pages


def test_pool_sizes_below_a_page_are_refused_in_tokens_and_bytes():
    for size in (Size(tokens=1), Size(tokens=63), Size(bytes=63_999)):
        with pytest.raises(StartupError) as e:
            plan_pool_pages(_cfg(size), 1000, 4096, 1 << 40)
        assert e.value.exit_code == 2 and "vram.kv_pool_bytes" in str(e.value)


def test_a_pool_larger_than_the_available_memory_is_refused():
    # a page is 64,000 bytes: 3 pages (192,000 bytes) fit in 192,000 bytes of MemAvailable, not in 191,999
    assert plan_pool_pages(_cfg(Size(bytes=192_000)), 1000, 4096, 192_000) == 3
    assert plan_pool_pages(_cfg(Size(tokens=192)), 1000, 4096, 192_000) == 3
    for size in (Size(bytes=192_000), Size(tokens=192)):
        with pytest.raises(StartupError) as e:
            plan_pool_pages(_cfg(size), 1000, 4096, 191_999)
        msg = str(e.value)
        assert e.value.exit_code == 2 and "vram.kv_pool_bytes" in msg, msg
        assert "192000 bytes (3 pages of 64000 bytes)" in msg and "(191999 bytes, MemAvailable)" in msg, msg
        assert "at most 128 tokens fit" in msg, msg                 # 2 whole pages of 64 tokens


def test_the_default_pool_is_lanes_times_context_capped_at_half_the_memory():
    assert plan_pool_pages(_cfg(None, lanes=2), 1000, 4096, 1 << 40) == 2 * 4096 // 64
    assert plan_pool_pages(_cfg(None, lanes=2), 1000, 4096, 2 * 64_000 * 10 + 5) == 10
    with pytest.raises(StartupError) as e:
        plan_pool_pages(_cfg(None), 1000, 4096, 64_000)
    assert e.value.exit_code == 2 and "half of the available memory" in str(e.value)


def test_the_window_may_fill_the_context_and_other_formats_ignore_it():
    cfg = Config(kv=KvConfig(exact_window=512, exact_sinks=512))
    check_exact_window(cfg, "hq-e8-2b", 512)                 # as long as the context: allowed
    big = Config(kv=KvConfig(exact_window=10**6))
    check_exact_window(big, "fp32", 512)                     # dense formats keep no window
    with pytest.raises(StartupError) as e:
        check_exact_window(big, "hq-e8-2b", 512)
    assert e.value.exit_code == 2 and "kv.exact_window = 1000000 tokens" in str(e.value)


def test_state_slots_and_their_memory():
    # 2 lanes, 3 device slots, 2 host slots a lane: 2 + 3 + 4 = 9 slots; with reuse off only the lanes' 2
    cfg = Config(server=ServerConfig(lanes=2), reuse=ReuseConfig(device_slots=3, host_slots_per_lane=2))
    assert state_slot_counts(cfg) == (2, 3, 4)
    off = Config(server=ServerConfig(lanes=2), reuse=ReuseConfig(prompt=False, device_slots=3, host_slots_per_lane=2))
    assert state_slot_counts(off) == (2, 0, 0)
    check_state_memory(cfg, 1000, 1000, 10_000)              # 9 × 1,000 + 1,000 = 10,000 bytes: fits exactly
    check_state_memory(cfg, 0, 10**12, 10)                   # no state: nothing to check (the pool has its own)
    with pytest.raises(StartupError) as e:
        check_state_memory(cfg, 1000, 1001, 10_000)
    msg = str(e.value)
    assert e.value.exit_code == 2 and "9 slots" in msg and "9000 bytes" in msg and "1001 bytes" in msg, msg
    assert "kv.exact_window" in msg and "server.lanes" in msg


def test_unusable_kv_disk_dirs_are_refused_before_the_load(broken_weights_dir, tmp_path):
    """A KV-disk directory that is a file, that cannot be created (a file in its path) or that is read-only stops
    the start with exit 2 naming kv.disk_dir and the cause in words (it was `[Errno 17] File exists` after the
    weights loaded); a missing one is created, mode 0700."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    for where, words in ((afile, "not a directory"), (afile / "kv", "cannot be created: Not a directory")):
        r = _serve(tmp_path, "--model", str(broken_weights_dir), "--kv-disk-bytes", "64M", "--kv-disk-dir", str(where))
        assert r.returncode == 2, r.stderr
        assert f"kv.disk_dir '{where}': {words}" in r.stderr and "Errno" not in r.stderr, r.stderr
    fresh = tmp_path / "a" / "b"
    r = _serve(tmp_path, "--model", str(broken_weights_dir), "--kv-disk-bytes", "64M", "--kv-disk-dir", str(fresh))
    assert r.returncode == 1 and "cannot load" in r.stderr, r.stderr       # past the check: the weights' failure
    assert fresh.is_dir() and fresh.stat().st_mode & 0o777 == 0o700
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        r = _serve(tmp_path, "--model", str(broken_weights_dir), "--kv-disk-bytes", "64M", "--kv-disk-dir", str(ro))
        assert r.returncode == 2 and f"kv.disk_dir '{ro}': on a read-only file system" in r.stderr, r.stderr
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)
