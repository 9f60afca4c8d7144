"""Playground test support: a headless Chromium (Debian's /usr/bin/chromium through Playwright; see
tools/playground_browser.py) for a test module, a daemon with its HTTP fronts on 127.0.0.1, and the daemon's own
answers computed by separate HTTP calls. (A plain module, like daemon_support.)

Without Chromium or Playwright the browser tests skip, unless IGNIS_REQUIRE_BROWSER is set (.ci/run sets it): then
they fail.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
from daemon_support import DaemonProc
from http_support import http_addr

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import playground_browser as B  # noqa: E402


def browser():
    """Generator for a module fixture: yields a launched Chromium browser, closed after the module."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    missing = "playwright is not installed" if sync_playwright is None else \
        ("chromium is not installed (apt-get install -y chromium)" if B.chromium_path() is None else None)
    if missing:
        if os.environ.get("IGNIS_REQUIRE_BROWSER"):
            pytest.fail(f"{missing}, and IGNIS_REQUIRE_BROWSER is set")
        pytest.skip(missing)
    with sync_playwright() as p:
        b = B.launch(p)
        yield b
        b.close()


def http_daemon(model_dir: Path, *extra: str) -> DaemonProc:
    """The tiny model at `model_dir` with its HTTP fronts on 127.0.0.1 (a free port): 4 lanes, 4,096 KV tokens,
    context 1,024. Stop it at the end of the module."""
    return DaemonProc(["--model", str(model_dir), "--lanes", "4", "--vram-kv-pool-bytes", "4Ktok",
                       "--model-context-tokens", "1024", "--server-http-listen", "127.0.0.1:0", *extra],
                      Path(tempfile.mkdtemp(prefix="ignis-play-", dir="/tmp")))


def base_url(d: DaemonProc) -> str:
    """http://127.0.0.1:PORT of daemon `d`'s HTTP front."""
    return "http://" + http_addr(d)
