"""Driving the playground page (GET / of the HTTP front) in a real headless browser: Debian's Chromium
(/usr/bin/chromium) through Playwright's Python package — never ``playwright install`` (its downloads fail offline).

Shared by tools/playground_shots.py and the playground tests. Every helper waits on what the page shows, never on
a fixed sleep.
"""
from __future__ import annotations

import os
import shutil

CHROMIUM = os.environ.get("IGNIS_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 800}


def chromium_path() -> str | None:
    """The Chromium executable, or None when it is not installed (apt-get install -y chromium)."""
    return CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")


def launch(playwright):
    """A headless Chromium browser from Playwright's sync API object `playwright`."""
    path = chromium_path()
    if path is None:
        raise FileNotFoundError(f"{CHROMIUM} is missing: apt-get install -y chromium")
    return playwright.chromium.launch(executable_path=path, args=ARGS, headless=True)


def new_context(browser, viewport: dict | None = None):
    """A fresh browser context (its own sessionStorage: a new tab of a new session) at `viewport` (1280×800), with
    reduced motion (the bars jump to their width: what a reader measures is the value shown)."""
    return browser.new_context(viewport=viewport or VIEWPORT, bypass_csp=True, reduced_motion="reduce")


def open_page(browser, url: str, viewport: dict | None = None, context=None):
    """A new page at `url` in `context` (a fresh browser context when None: its own sessionStorage); console errors
    and failed requests are collected in ``page.problems``. The context bypasses the page's Content-Security-Policy
    only because Playwright's wait_for_function evaluates its predicate as a string (the page itself needs no eval)."""
    ctx = context or new_context(browser, viewport)
    page = ctx.new_page()
    page.problems = []
    page.on("console", lambda m: m.type == "error" and page.problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: page.problems.append(f"pageerror: {e}"))
    page.goto(url)
    return page


def wait_monitor(page, timeout_ms: int = 30_000) -> None:
    """Wait until the Monitor drew its first status snapshot."""
    page.wait_for_function("document.getElementById('kv-bar').dataset.total !== undefined", timeout=timeout_ms)


def set_system(page, text: str) -> None:
    """Replace the system prompt (an input event per edit, as typing)."""
    page.fill("#system", text)


def set_sampling(page, **fields) -> None:
    """Fill sampling fields by id: temperature, top_p, max_tokens, seed ("" clears one)."""
    for k, v in fields.items():
        page.fill(f"#{k}", "" if v is None else str(v))


def send(page, text: str, timeout_ms: int = 120_000, keyboard: bool = False) -> dict:
    """Send `text` as the next user message (keyboard: typed into the focused message box and sent with Enter, else
    filled in and the Send button clicked) and wait for the reply to finish; returns the reply's figures as the page
    shows them (cached, prompt, reuse, ttft, rate, generated, finish, id) and its text."""
    n = page.locator("#log li.msg.assistant").count()
    if keyboard:
        page.focus("#input")
        page.keyboard.type(text)
        page.keyboard.press("Enter")
    else:
        page.fill("#input", text)
        page.click("#send")
    reply = page.locator("#log li.msg.assistant").nth(n)
    reply.locator("dl.stats").wait_for(timeout=timeout_ms)
    figures = {k: reply.locator(f"[data-k={k}] dd").inner_text() for k in
               ("cached", "prompt", "reuse", "ttft", "rate", "generated", "finish", "id")}
    figures["text"] = reply.locator(".body").inner_text()
    return figures


def fingerprint(page) -> dict:
    """The fingerprint's state as the page shows it: state (hit | miss | idle | error), summary text, cached, total,
    reason, the marked divergence character (None without one), the divergence line."""
    s = page.locator("#fp-summary")
    mark = page.locator("#fp-mark")
    return {"state": s.get_attribute("data-state"), "text": s.inner_text(),
            "cached": s.get_attribute("data-cached"), "total": s.get_attribute("data-total"),
            "reason": s.get_attribute("data-reason"),
            "mark": int(mark.get_attribute("data-char")) if mark.count() else None,
            "mark_text": mark.inner_text() if mark.count() else None,
            "divergence": page.locator("#fp-divergence").inner_text()}


def wait_fingerprint(page, state: str, timeout_ms: int = 30_000) -> dict:
    """Wait until the fingerprint shows `state` (hit | miss) for the current draft; returns fingerprint(page)."""
    page.wait_for_function(f"document.getElementById('fp-summary').dataset.state === {state!r}", timeout=timeout_ms)
    return fingerprint(page)


POOL_JS = """() => { const b = document.getElementById('kv-bar'); if (b.dataset.total === undefined) return null;
  const v = {live: +b.dataset.live, retained: +b.dataset.retained, shared: +b.dataset.shared, free: +b.dataset.free,
             total: +b.dataset.total, bar_width: b.getBoundingClientRect().width,
             live_width: document.getElementById('kv-live').getBoundingClientRect().width,
             retained_width: document.getElementById('kv-retained').getBoundingClientRect().width,
             busy_lanes: document.querySelectorAll('#lanes .lane.decode, #lanes .lane.prefill').length}; return v; }"""


def pool(page) -> dict:
    """The KV pool bar's values as the Monitor shows them (live, retained, shared by both, free, total
    pages), the widths of the bar and of its live and
    retained segments in pixels and the lanes shown busy, read at one instant."""
    return page.evaluate(POOL_JS)


def wait_pool(page, condition: str, timeout_ms: int = 30_000) -> dict:
    """Wait until the KV pool bar's values `v` satisfy the JavaScript expression `condition` (e.g. "v.live > 0");
    returns them as they were at that instant."""
    js = f"() => {{ const v = ({POOL_JS})(); return v !== null && ({condition}) ? v : null; }}"
    return page.wait_for_function(js, timeout=timeout_ms).json_value()
