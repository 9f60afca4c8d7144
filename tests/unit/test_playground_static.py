"""The playground's static files: nothing in them points anywhere but the page's own origin (the page works with no
internet), every file ships as package data, module imports and page links resolve to shipped files; the HTTP front
serves them with a same-origin Content-Security-Policy without a key, refuses other names, and the status stream's
counters are read from the daemon's own metrics."""
from __future__ import annotations

import re
import tomllib
from fnmatch import fnmatch
from pathlib import Path

import pytest
from http_support import InProcess, http

from ignisd.fronts.playground import STATIC, counters
from ignisd.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(p for p in Path(str(STATIC)).iterdir() if p.is_file())
EXTERNAL = [re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://"),     # any scheme://host (http, https, ws, ftp...)
            re.compile(r"[\"'`(]\s*//[^/\s]"),               # a protocol-relative //host in a string or url(...)
            re.compile(r"(?i)@import")]


def test_the_playground_ships_its_files():
    assert {p.name for p in FILES} >= {"index.html", "style.css", "app.js", "api.js", "chat.js", "fingerprint.js",
                                       "monitor.js", "chart.js", "format.js"}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_no_static_file_points_outside_the_origin(path):
    text = path.read_text()
    for rx in EXTERNAL:
        m = rx.search(text)
        assert m is None, f"{path.name}: {text[max(0, m.start() - 40):m.end() + 40]!r}"


def test_every_file_is_package_data_and_every_reference_resolves():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "ignisd.fronts.static" in cfg["tool"]["setuptools"]["packages"]
    globs = cfg["tool"]["setuptools"]["package-data"]["ignisd.fronts.static"]
    names = {p.name for p in FILES}
    for p in FILES:
        assert any(fnmatch(p.name, g) for g in globs), p.name
    for p in FILES:
        if p.suffix == ".js":
            for target in re.findall(r"""^import .* from "([^"]+)";$""", p.read_text(), re.M):
                assert target.startswith("./") and target[2:] in names, (p.name, target)
    html = (Path(str(STATIC)) / "index.html").read_text()
    for target in re.findall(r"""(?:src|href)="([^"]+)\"""", html):
        if target.startswith("data:") or target.startswith("#"):
            continue
        assert target.startswith("/playground/") and target[len("/playground/"):] in names, target


def test_the_front_serves_the_page_without_a_key():
    srv = InProcess(edge=None, api_key="k")
    try:
        c = http(srv.addr)
        r = c.get("/")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert r.text == (Path(str(STATIC)) / "index.html").read_text()
        csp = r.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "connect-src 'self'" in csp and "script-src 'self'" in csp
        r = c.get("/playground/app.js")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript")
        for bad in ("/playground/nothing.js", "/playground/..%2Fhttp.py", "/playground/.hidden.js",
                    "/playground/http.py"):
            assert c.get(bad).status_code == 404, bad
        assert c.get("/ignis/status").status_code == 503          # no model attached yet
        c.close()
    finally:
        srv.close()


def test_counters_come_from_the_metrics():
    m = Metrics()
    m.reuse_hits.labels(kind="checkpoint", tier="device").inc(2)
    m.reuse_hits.labels(kind="prefix", tier="ram").inc()
    m.reuse_tokens_restored.inc(640)
    m.ttft_seconds.observe(0.25)
    m.ttft_seconds.observe(0.5)
    m.requests_total.labels(finish_reason="stop").inc(3)
    c = counters(m.render())
    assert (c["reuse_hits"], c["reuse_tokens_restored"], c["requests"]) == (3, 640, 3)
    assert (c["ttft_count"], c["ttft_sum_s"]) == (2, 0.75)
    assert counters("") == dict.fromkeys(c, 0.0)
