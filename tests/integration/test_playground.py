"""The playground page (GET /) in headless Chromium against a real daemon (the tiny Llama, HTTP on 127.0.0.1): a
streamed chat and the figures of its replies, the reuse fingerprint turning amber at an edited character, and the
Monitor's KV pool bar while a request runs. Every value the page shows is compared with the daemon's own answer for
the same request, computed by a separate HTTP call (tokenize, the reuse probe, the OpenAI front) or read from its
`done` log line. Stop cancels the running request."""
from __future__ import annotations

import math
import re

import pytest
from http_support import done_line, http, http_addr
from playground_support import B, base_url, browser, http_daemon

FILLER = " ".join(["river bridge market"] * 30)
SYS_CHAT = "You are a travel guide. " + FILLER
SYS_FP = "Harbour pilots answer first. " + FILLER
SYS_MON = "Quiet lighthouse keeper notes. " + FILLER
AMBER_LIGHT = "rgb(179, 92, 0)"     # --amber of style.css (light scheme, headless Chromium's default)


@pytest.fixture(scope="module")
def daemon(tiny_llama_dir):
    d = http_daemon(tiny_llama_dir)
    yield d
    d.stop()


@pytest.fixture(scope="module")
def chromium():
    yield from browser()


@pytest.fixture(scope="module")
def api(daemon):
    c = http(http_addr(daemon))
    yield c
    c.close()


def post(api, path: str, body: dict) -> dict:
    r = api.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def reply_text(api, messages: list[dict], max_tokens: int) -> str:
    """The greedy reply to `messages` from the OpenAI front, neither restoring nor keeping anything."""
    r = post(api, "/v1/chat/completions", {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                                           "cache_prompt": False})
    return r["choices"][0]["message"]["content"]


def open_chat(chromium, daemon, system: str, max_tokens: int, query: str = ""):
    page = B.open_page(chromium, base_url(daemon) + "/" + query)
    B.wait_monitor(page)
    B.set_system(page, system)
    B.set_sampling(page, temperature=0, max_tokens=max_tokens)
    return page


def narrow_page_width(page, check) -> int:
    """The page's scroll width (CSS px) in a 480-px-wide window, after asserting check() there; the window's size is
    put back."""
    size = page.viewport_size
    page.set_viewport_size({"width": 480, "height": 900})
    try:
        assert check()
        return page.evaluate("document.documentElement.scrollWidth")
    finally:
        page.set_viewport_size(size)


def test_chat_streams_replies_with_their_cached_tokens(daemon, chromium, api):
    page = open_chat(chromium, daemon, SYS_CHAT, 8)
    system = {"role": "system", "content": SYS_CHAT}
    u1 = {"role": "user", "content": "Which bridges should I see first?"}
    msgs1 = [system, u1]
    expect1 = post(api, "/ignis/reuse", {"messages": msgs1})
    f1 = B.send(page, u1["content"], keyboard=True)      # typed, and sent with Enter
    assert int(f1["prompt"]) == len(post(api, "/ignis/tokenize", {"messages": msgs1})["tokens"])
    assert int(f1["cached"]) == expect1["reuse"]["cached_tokens"] == int(done_line(daemon, f1["id"])["cached"])
    reason = expect1["reuse"]["reason"]
    assert reason is not None and f1["reuse"] == ("miss" if reason == "miss" else f"miss: {reason}")
    assert done_line(daemon, f1["id"])["reason"] == reason

    # turn 2: it resumes what turn 1 kept; the page sends reply 1 exactly as the API streamed it
    msgs2 = msgs1 + [{"role": "assistant", "content": reply_text(api, msgs1, 8)},
                     {"role": "user", "content": "And the markets?"}]
    expect2 = post(api, "/ignis/reuse", {"messages": msgs2})["reuse"]
    assert expect2["cached_tokens"] > 0 and expect2["tier"] == "device"
    with page.expect_request("**/v1/chat/completions") as sent:
        f2 = B.send(page, "And the markets?")
    assert sent.value.post_data_json["messages"] == msgs2
    done = done_line(daemon, f2["id"])
    assert int(f2["cached"]) == expect2["cached_tokens"] == int(done["cached"])
    assert int(f2["prompt"]) == int(done["prompt"]) == len(post(api, "/ignis/tokenize", {"messages": msgs2})["tokens"])
    assert f2["reuse"] == f"device {expect2['kind']}" and done["tier"] == "device" and done["kind"] == expect2["kind"]
    assert int(f2["generated"]) == int(done["generated"]) and f2["finish"] == done["finish"]
    ttft = float(re.sub(r"[^0-9.]", "", f2["ttft"]))
    assert abs(ttft - float(done["ttft_ms"])) <= 0.11
    assert f2["rate"].endswith("tok/s")
    for width, height in ((1280, 800), (480, 900)):          # readable wide and narrow: nothing runs off the side
        page.set_viewport_size({"width": width, "height": height})
        assert page.evaluate("document.documentElement.scrollWidth") <= width
    assert not page.problems, page.problems
    page.context.close()


def test_fingerprint_turns_amber_at_the_edited_character(daemon, chromium, api):
    page = open_chat(chromium, daemon, SYS_FP, 4)
    u1 = "Where is the harbour? " + " ".join(["tide wave"] * 40)   # long: its checkpoint lies a page past the prefix
    B.send(page, u1)
    draft = "And the tides?"
    page.fill("#input", draft)

    def body(system: str) -> dict:
        return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": u1},
                             {"role": "assistant", "content": reply_text(api, [{"role": "system", "content": SYS_FP},
                                                                               {"role": "user", "content": u1}], 4)},
                             {"role": "user", "content": draft}]}

    def shown(total: int, state: str) -> dict:
        page.wait_for_function("([t, s]) => { const e = document.getElementById('fp-summary');"
                               " return e.dataset.total === String(t) && e.dataset.state === s; }",
                               arg=[total, state], timeout=30_000)
        return B.fingerprint(page)

    # as sent now: it resumes what the first turn kept
    same = body(SYS_FP)
    want = post(api, "/ignis/reuse", same)
    total = len(post(api, "/ignis/tokenize", same)["tokens"])
    fp = shown(total, "hit")
    assert want["prompt_tokens"] == total and want["reuse"]["cached_tokens"] > 0
    assert int(fp["cached"]) == want["reuse"]["cached_tokens"]

    # one character of the system prompt edited, in its first page: nothing kept is a prefix any more
    k = SYS_FP.index("pilots")
    edited = SYS_FP[:k] + "b" + SYS_FP[k + 1:]
    B.set_system(page, edited)
    changed = body(edited)
    text = post(api, "/ignis/tokenize", changed)["text"]
    at = text.index(edited) + k                       # the edited character in the rendered prompt
    want = post(api, "/ignis/reuse", changed)["reuse"]
    assert want["cached_tokens"] == 0 and want["reason"] == "miss" and want["diverged_at"]["char_offset"] == at
    fp = shown(len(post(api, "/ignis/tokenize", changed)["tokens"]), "miss")
    assert fp["mark"] == at and fp["mark_text"].startswith("b") and fp["cached"] == "0" and fp["reason"] == "miss"
    assert f"character {at} in message 0 (system)" in fp["divergence"]
    assert page.eval_on_selector("#fp-summary", "e => getComputedStyle(e).color") == AMBER_LIGHT
    assert page.locator("#fp-theirs").inner_text() == want["diverged_at"]["theirs"].replace("\n", "\u21b5")
    # the excerpt's lines are wider than a narrow window: they scroll inside their box, the page does not
    wider = "(e => e.scrollWidth > e.clientWidth)(document.getElementById('fp-excerpt'))"
    assert narrow_page_width(page, lambda: page.evaluate(wider)) <= 480

    B.set_system(page, SYS_FP)                        # undone: it resumes again
    assert int(shown(total, "hit")["cached"]) > 0

    # an earlier message edited in place: the kept prefix still serves, the divergence is in that message
    user = page.locator("#log li.msg[data-index='0']")
    user.get_by_role("button", name="Edit message 1").click()
    u1_edited = u1[:-4] + "surf"
    user.locator("textarea.edit").fill(u1_edited)
    page.keyboard.press("Escape")
    moved = body(SYS_FP)
    moved["messages"][1]["content"] = u1_edited
    want = post(api, "/ignis/reuse", moved)["reuse"]
    assert want["cached_tokens"] > 0 and want["diverged_at"]["role"] == "user"
    page.wait_for_function("c => document.getElementById('fp-summary').dataset.char === String(c)",
                           arg=want["diverged_at"]["char_offset"], timeout=30_000)
    fp = B.fingerprint(page)
    assert (fp["state"], int(fp["cached"]), fp["mark"]) == ("hit", want["cached_tokens"],
                                                           want["diverged_at"]["char_offset"])
    assert "in message 1 (user)" in fp["divergence"]
    assert not page.problems, page.problems
    page.context.close()


def test_monitor_pool_bar_shows_a_running_request(daemon, chromium, api):
    max_tokens = 900
    page = open_chat(chromium, daemon, SYS_MON, max_tokens, "?interval=0.2")
    idle = B.wait_pool(page, "v.live === 0")
    assert idle["live_width"] == 0 and idle["total"] == 64          # --vram-kv-pool-bytes 4Ktok: 64 pages
    msgs = [{"role": "system", "content": SYS_MON}, {"role": "user", "content": "Log the night."}]
    prompt = len(post(api, "/ignis/tokenize", {"messages": msgs})["tokens"])
    assert post(api, "/ignis/reuse", {"messages": msgs})["reuse"]["cached_tokens"] == 0
    page.fill("#input", "Log the night.")
    page.click("#send")
    running = B.wait_pool(page, "v.live > 0")
    # admission reserves the whole bound (prompt + max_tokens), nothing shared on a miss
    assert running["live"] == math.ceil((prompt + max_tokens) / 64)
    assert running["busy_lanes"] == 1
    # the segments as wide as their pages: live, then pages held by retained states only (a capture shares its
    # pages with the live sequence in place: those count once), then free
    w = running["bar_width"] / 64
    assert abs(running["live_width"] - w * running["live"]) <= 2
    assert abs(running["retained_width"] - w * (64 - running["free"] - running["live"])) <= 2
    # a running request's row (its id is 36 characters with no break) still fits a narrow window
    page.locator("#requests tbody tr").first.wait_for(timeout=10_000)
    assert narrow_page_width(page, lambda: page.locator("#requests tbody tr").count() >= 1) <= 480

    page.locator("#log li.msg.assistant dl.stats").wait_for(timeout=120_000)
    after = B.wait_pool(page, "v.live === 0")
    assert after["live_width"] == 0 and after["retained"] > idle["retained"]
    kept = api.get("/ignis/status").json()["retained"]
    page.wait_for_function("n => document.querySelectorAll('#retained tbody tr[data-kind]').length === n",
                           arg=len(kept), timeout=10_000)
    rows = page.locator("#retained tbody tr[data-kind]")
    shown = sorted((rows.nth(i).get_attribute("data-kind"), int(rows.nth(i).get_attribute("data-tokens")))
                   for i in range(rows.count()))
    assert shown == sorted((r["kind"], r["tokens"]) for r in kept)
    assert not page.problems, page.problems
    page.context.close()


def test_stop_cancels_the_running_request(daemon, chromium):
    page = open_chat(chromium, daemon, "Stopwatch. " + FILLER, 900, "?interval=0.2")
    B.wait_pool(page, "v.live === 0")
    page.fill("#input", "Count slowly.")
    page.click("#send")
    B.wait_pool(page, "v.live > 0")
    # the reply's id comes with its first streamed token: stop once tokens flow (a stop during the prefill cancels
    # too, but the page then never learns which request it was)
    page.wait_for_function("() => { const b = [...document.querySelectorAll('#log li.msg.assistant .body')].pop();"
                           " return b && b.textContent.length > 0; }", timeout=30_000)
    page.click("#stop")
    reply = page.locator("#log li.msg.assistant").last
    reply.locator("[data-k=finish] dd", has_text="stopped").wait_for(timeout=30_000)
    rid = reply.locator("[data-k=id] dd").inner_text()
    done = done_line(daemon, rid)                     # the daemon cancelled it when the page dropped the stream
    assert done["finish"] == "cancelled" and int(done["generated"]) < 900
    assert B.wait_pool(page, "v.live === 0")["live_width"] == 0
    assert page.locator("#send").is_enabled() and page.locator("#stop").is_disabled()
    page.context.close()
