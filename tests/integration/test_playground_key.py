"""The playground page against a daemon with server.api_key_file: the page itself loads without the key, asks for it
once (a wrong key is refused and asked again), keeps it for the tab (sessionStorage: a reload does not ask, another
session does) and sends it as the bearer header on every route it calls."""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from http_support import HTTP_KEY, done_line, http, http_addr
from playground_support import B, base_url, browser, http_daemon


@pytest.fixture(scope="module")
def daemon(tiny_llama_dir):
    key = Path(tempfile.mkdtemp(prefix="ignis-key-", dir="/tmp")) / "key"
    key.write_text(HTTP_KEY + "\n")
    d = http_daemon(tiny_llama_dir, "--server-api-key-file", str(key))
    yield d
    d.stop()


@pytest.fixture(scope="module")
def chromium():
    yield from browser()


def dialog_open(page) -> bool:
    return page.evaluate("document.getElementById('key-dialog').open")


def test_the_page_asks_for_the_key_once_and_keeps_it_for_the_tab(daemon, chromium):
    c = http(http_addr(daemon))
    assert c.get("/").status_code == 200 and c.get("/playground/app.js").status_code == 200   # no key needed
    assert c.get("/ignis/status").status_code == 401
    assert c.post("/ignis/tokenize", json={"text": "hi"}).status_code == 401
    assert c.get("/ignis/status", headers={"Authorization": f"Bearer {HTTP_KEY}"}).status_code == 200

    page = B.open_page(chromium, base_url(daemon) + "/")
    page.wait_for_selector("#key-dialog[open]")
    page.fill("#key-input", "not-the-key")
    page.click("#key-ok")
    page.wait_for_function("document.getElementById('key-error').textContent.includes('refused')", timeout=15_000)
    assert dialog_open(page) and page.evaluate("sessionStorage.getItem('ignis.apiKey')") is None
    page.fill("#key-input", HTTP_KEY)
    page.click("#key-ok")
    B.wait_monitor(page)
    assert not dialog_open(page)
    assert page.evaluate("sessionStorage.getItem('ignis.apiKey')") == HTTP_KEY

    B.set_sampling(page, temperature=0, max_tokens=4)
    with page.expect_request("**/v1/chat/completions") as sent:
        f = B.send(page, "Say hello.")
    assert sent.value.headers["authorization"] == f"Bearer {HTTP_KEY}"
    assert int(f["generated"]) == int(done_line(daemon, f["id"])["generated"])

    page.reload()                                    # the same tab: the key is kept, nothing is asked
    B.wait_monitor(page)
    assert not dialog_open(page)

    other = B.open_page(chromium, base_url(daemon) + "/")   # another session: asked again
    other.wait_for_selector("#key-dialog[open]")
    assert other.evaluate("sessionStorage.getItem('ignis.apiKey')") is None
    other.context.close()
    page.context.close()
    c.close()
