"""How the playground shows a reply's reasoning (folded in a <details>) and its tool calls, in headless Chromium,
over the daemon's own HttpFront and Edge with the real Qwen3.5 tokenizer, template and output parser; only the engine
is scripted (canned token ids, as tests/unit/test_http_canned.py). The page's reasoning and tool call equal the
non-streamed reply of the same front, asked separately."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from http_support import InProcess, ScriptedEngine, http
from playground_support import B, browser

from ignisd.edge import Edge
from ignisd.text.chat_template import ChatTemplate
from ignisd.text.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from make_tiny_checkpoint import write_qwen3_5_tokenizer  # noqa: E402

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"
TEXT = "The user wants the weather.\n</think>\n\nLet me check.\n\n" + CALL   # the generation prompt opens <think>


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen_tok")
    write_qwen3_5_tokenizer(d)
    tok = Tokenizer.from_dir(d)
    engine = ScriptedEngine(tok)
    engine.text = TEXT
    edge = Edge(engine, tok, ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token),
                model_info={"name": "tiny-qwen"}, context_tokens=4096, default_max_tokens=64,
                developer_policy="into-system", output_family="qwen3_5")
    srv = InProcess(edge, listen="127.0.0.1:0")
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def chromium():
    yield from browser()


def test_reasoning_is_folded_and_tool_calls_are_shown_as_such(served, chromium):
    c = http(served.addr)
    want = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Weather in Paris?"}],
                                                "tools": [WEATHER]}).json()["choices"][0]
    call = want["message"]["tool_calls"][0]["function"]
    assert want["finish_reason"] == "tool_calls" and call["name"] == "get_weather"

    page = B.open_page(chromium, f"http://{served.addr}/")
    B.wait_monitor(page)
    page.click("#tools-box summary")                                                # a user unfolds the tools box
    page.fill("#tools", json.dumps([WEATHER]))
    f = B.send(page, "Weather in Paris?")
    reply = page.locator("#log li.msg.assistant").last
    details = reply.locator("details.reasoning")
    assert details.count() == 1 and details.get_attribute("open") is None          # folded
    assert details.locator(".text").text_content() == want["message"]["reasoning_content"]
    assert reply.locator(".body").text_content() == want["message"]["content"]
    assert reply.locator("[data-k=tool-call]").inner_text().startswith(f"tool call get_weather({call['arguments']})")
    assert f["finish"] == "tool_calls"
    details.locator("summary").click()                                              # unfolds on demand
    assert details.get_attribute("open") is not None
    page.context.close()
    c.close()
