"""Screenshots of the playground page in each of its states, for a person to look at.

    .venv/bin/python tools/playground_shots.py OUT_DIR [--url http://127.0.0.1:PORT] [--model PATH]

Without --url it starts a daemon (the built-in SmolLM2, or --model) with its HTTP fronts on a free local port. It
drives the page in headless Chromium (/usr/bin/chromium; see tools/playground_browser.py) at 1280×800 and writes:

* 01-chat.png: a two-turn conversation with its streamed replies and their figures (cached tokens, TTFT, rate, reuse);
* 02-fingerprint-hit.png: a draft next message; the fingerprint shows what it would resume;
* 03-fingerprint-miss.png: one character of the system prompt edited; the fingerprint turns amber at that character;
* 04-monitor.png: the Monitor while a long request runs (live pages in the KV pool bar, a busy lane);
* 05-narrow.png: the page in a 480-pixel-wide window.
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import playground_browser as B  # noqa: E402

SYSTEM = ("You are a patient tutor for people learning how large language model servers work. Explain one idea at "
          "a time, in plain words, with a small concrete example. Prefer short paragraphs. When the user asks about "
          "caching, talk about prompts, pages of keys and values, and what can be reused between two requests that "
          "start the same way. Never invent numbers you were not given.")


def start_daemon(model: str | None):
    """A daemon with its HTTP fronts on 127.0.0.1 (a free port) → (DaemonProc, base URL)."""
    from daemon_support import DaemonProc
    args = ["--lanes", "2", "--vram-kv-pool-bytes", "8Ktok", "--server-http-listen", "127.0.0.1:0"]
    if model:
        args += ["--model", model]
    d = DaemonProc(args, Path(tempfile.mkdtemp(prefix="ignis-shots-", dir="/tmp")))
    m = re.search(r"http_listening addr=(\S+)", d.log())
    return d, f"http://{m[1]}"


def shoot(out: Path, url: str) -> list[Path]:
    """Drive the page at `url` through each state; returns the PNG paths written under `out`."""
    from playwright.sync_api import sync_playwright
    out.mkdir(parents=True, exist_ok=True)
    shots = []

    def snap(page, name: str, **kw) -> None:
        path = out / name
        page.screenshot(path=str(path), **kw)
        shots.append(path)
        print(path)

    with sync_playwright() as p:
        browser = B.launch(p)
        page = B.open_page(browser, url.rstrip("/") + "/?interval=0.5")
        B.wait_monitor(page)
        B.set_system(page, SYSTEM)
        B.set_sampling(page, temperature=0, max_tokens=60)
        B.send(page, "What does a prompt cache keep between two requests?")
        B.send(page, "And why does that help an agent that calls tools in a loop?")
        page.wait_for_timeout(1200)           # two status snapshots: the retained states are listed
        snap(page, "01-chat.png")

        page.fill("#input", "Give me a one-line summary.")
        B.wait_fingerprint(page, "hit")
        snap(page, "02-fingerprint-hit.png")

        edited = SYSTEM.replace("patient", "patiens", 1)
        B.set_system(page, edited)
        B.wait_fingerprint(page, "miss")
        page.locator("#fingerprint").scroll_into_view_if_needed()
        snap(page, "03-fingerprint-miss.png")
        B.set_system(page, SYSTEM)
        B.wait_fingerprint(page, "hit")

        B.set_sampling(page, max_tokens=400)
        page.fill("#input", "Now explain it again slowly, step by step, with an example of three requests.")
        page.click("#send")
        B.wait_pool(page, "v.live > 0", 60_000)
        page.wait_for_timeout(1500)
        page.locator("#monitor").scroll_into_view_if_needed()
        snap(page, "04-monitor.png")
        page.locator("#log li.msg.assistant").nth(2).locator("dl.stats").wait_for(timeout=300_000)

        page.set_viewport_size({"width": 480, "height": 900})
        page.wait_for_timeout(500)
        page.evaluate("window.scrollTo(0, 0)")
        snap(page, "05-narrow.png", full_page=True)
        if page.problems:
            print("page problems:", *page.problems, sep="\n  ", file=sys.stderr)
        browser.close()
    return shots


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, start a daemon unless --url, and write the screenshots."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="folder for the PNG files")
    ap.add_argument("--url", help="a running daemon's HTTP front (http://HOST:PORT); default: start one")
    ap.add_argument("--model", help="model path for the daemon this tool starts (default: the built-in SmolLM2)")
    a = ap.parse_args(argv)
    d = None
    url = a.url
    if url is None:
        d, url = start_daemon(a.model)
    try:
        shoot(a.out, url)
    finally:
        if d is not None:
            d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
