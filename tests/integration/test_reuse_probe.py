"""POST /ignis/reuse (the playground fingerprint's question: what would this chat body resume if sent now) on the
tiny Qwen3.5 hybrid, where a match also needs its state image: for a first turn, a second turn, a regenerated turn,
an edit inside the system prompt and a short prompt, the probe's answer equals the `ignis.reuse` object the OpenAI
front then returns for the same body, field for field."""
from __future__ import annotations

from http_support import http, http_addr, wait_idle

SYSTEM = {"role": "system", "content": "You are a ship's navigator. " + " ".join(["compass chart anchor"] * 30)}
EDITED = {"role": "system", "content": SYSTEM["content"].replace("chart anchor compass", "chart anchor Compass", 3)}
USER1 = {"role": "user", "content": "Plot a course " + " ".join(["north east tide"] * 20)}
USER2 = {"role": "user", "content": "And back home?"}


def test_the_probe_says_what_the_request_then_gets(http_qwen):
    c = http(http_addr(http_qwen))
    wait_idle(http_qwen)

    def check(messages: list[dict]) -> tuple[dict, dict]:
        body = {"messages": messages, "max_tokens": 6, "temperature": 0,
                "chat_template_kwargs": {"enable_thinking": False}}
        probe = c.post("/ignis/reuse", json=body)
        assert probe.status_code == 200, probe.text
        probe = probe.json()
        got = c.post("/v1/chat/completions", json=body).json()
        assert probe["prompt_tokens"] == got["usage"]["prompt_tokens"]
        assert probe["reuse"] == got["ignis"]["reuse"], (probe, got["ignis"])
        assert probe["reuse"]["cached_tokens"] == got["usage"]["prompt_tokens_details"]["cached_tokens"]
        wait_idle(http_qwen)
        return probe["reuse"], got

    first, got1 = check([SYSTEM, USER1])
    assert first["tier"] is None
    turn2 = [SYSTEM, USER1, {"role": "assistant", "content": got1["choices"][0]["message"]["content"]}, USER2]
    second, _ = check(turn2)
    assert second["tier"] == "device" and second["cached_tokens"] > 0
    again, _ = check(turn2)                            # a regeneration resumes too
    assert again["cached_tokens"] >= second["cached_tokens"]
    edited, _ = check([EDITED, USER1])
    assert edited["diverged_at"] is not None and edited["diverged_at"]["role"] == "system"
    short, _ = check([{"role": "user", "content": "hi"}])
    assert short["reason"] == "short"
    c.close()


def test_a_body_that_fills_the_context_is_still_probed(http_qwen):
    """Without max_tokens, a prompt at the context limit would be refused when sent (context_length, naming
    messages); the probe still answers what it would resume (its prompt tokens counted as the tokenizer counts)."""
    c = http(http_addr(http_qwen))
    wait_idle(http_qwen)
    big = {"role": "user", "content": " ".join(["north east tide"] * 1500)}
    body = {"messages": [SYSTEM, big], "chat_template_kwargs": {"enable_thinking": False}}
    n = len(c.post("/ignis/tokenize", json=body).json()["tokens"])
    ctx = c.get("/ignis/status").json()["model"]["context_tokens"]
    assert n >= ctx
    probe = c.post("/ignis/reuse", json=body)
    assert probe.status_code == 200, probe.text
    assert probe.json()["prompt_tokens"] == n
    sent = c.post("/v1/chat/completions", json=body)
    assert sent.status_code == 400 and sent.json()["error"]["param"] == "messages"
    wait_idle(http_qwen)


def test_status_stream_refuses_an_interval_out_of_range(http_qwen):
    c = http(http_addr(http_qwen))
    for raw in ("50", "0.1", "abc", "nan"):
        r = c.get(f"/ignis/status/stream?interval={raw}")
        assert r.status_code == 400, (raw, r.text)
        err = r.json()["error"]
        assert (err["code"], err["param"]) == ("bad_request", "interval")
        assert err["message"] == f'interval: "{raw}" is not a number of seconds from 0.2 to 10'   # JSON's quotes
    with c.stream("GET", "/ignis/status/stream?interval=0.2") as r:   # in range: the stream starts
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        assert next(r.iter_lines()).startswith("event: status")
