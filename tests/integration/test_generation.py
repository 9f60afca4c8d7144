"""Generation over the socket: streaming, stop strings, seeds, status schema, metrics (tiny random Llama)."""



def _completion(rid, prompt, **kw):
    return {"id": rid, "op": "completion", "prompt": prompt, **kw}


def test_stream_concatenates_to_done_text(tiny_daemon):
    c = tiny_daemon.conn()
    c.send({"id": "s", "op": "chat", "messages": [{"role": "user", "content": "Tell me a story"}],
            "temperature": 0, "max_tokens": 40, "stream": True})
    deltas, done = c.until_done("s")
    assert done["type"] == "done"
    assert "".join(d["text"] for d in deltas) == done["text"]
    assert done["message"]["role"] == "assistant" and done["message"]["content"] == done["text"]
    u = done["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["prompt_tokens_details"]["cached_tokens"] == 0
    assert done["ignis"]["reuse"]["cached_tokens"] == 0
    for k in ("queue_ms", "load_ms", "ttft_ms", "prefill_tokens_per_s", "decode_tokens_per_s"):
        assert k in done["timings"]
    # the prompt is the template's render: tokenize the same body and compare counts
    t = c.request({"id": "t", "op": "tokenize", "messages": [{"role": "user", "content": "Tell me a story"}]})
    assert len(t["result"]["tokens"]) == u["prompt_tokens"]
    c.close()


def test_greedy_is_deterministic_and_length_finish(tiny_daemon):
    c = tiny_daemon.conn()
    a = c.request(_completion("a", "The quick brown fox", temperature=0, max_tokens=16))
    b = c.request(_completion("b", "The quick brown fox", temperature=0, max_tokens=16))
    assert a["text"] == b["text"]
    assert a["finish_reason"] in ("length", "stop")
    if a["finish_reason"] == "length":
        assert a["usage"]["completion_tokens"] == 16
    c.close()


def test_seed_repeats_under_concurrency(tiny_daemon):
    body = dict(temperature=1.0, top_p=0.95, max_tokens=24, seed=1234)
    c = tiny_daemon.conn()
    alone = c.request(_completion("x1", "Once upon a time", **body))
    # same seed while other sampled requests (other seeds) run beside it
    for i in range(3):
        c.send(_completion(f"noise{i}", "Noise noise", temperature=1.0, max_tokens=30, seed=i))
    c.send(_completion("x2", "Once upon a time", **body))
    finals = {}
    while len(finals) < 4:
        r = c.recv()
        if r["type"] in ("done", "error"):
            finals[r["id"]] = r
    assert finals["x2"]["text"] == alone["text"]
    other = c.request(_completion("x3", "Once upon a time", **dict(body, seed=999)))
    c.close()
    # different seeds give different samples (24 tokens of a 49k vocabulary at temperature 1)
    assert other["text"] != alone["text"]
    tiny_daemon.wait_idle()


def test_logit_bias_and_penalties_steer_the_daemons_sampling(tiny_daemon):
    """logit_bias +100 on one token makes greedy decoding pick it every step; with a frequency penalty of 2 each
    pick costs it 2 logits, so the same bias of 100 still wins (100 − 2·4 ≫ any other logit of the random model),
    while a bias of −100 on the greedy reply's first token moves the first pick elsewhere. An id outside the
    vocabulary is refused naming it."""
    c = tiny_daemon.conn()
    base = _completion("lb0", "Once upon a time", temperature=0, max_tokens=5, ignore_eos=True, logprobs=True)
    first = c.request(base)["logprobs"][0]["token_id"]
    for rid, extra in (("lb1", {}), ("lb2", {"frequency_penalty": 2.0, "presence_penalty": 1.0})):
        r = c.request({**base, "id": rid, "logit_bias": {"321": 100}, **extra})
        assert [e["token_id"] for e in r["logprobs"]] == [321] * 5, r
    r = c.request({**base, "id": "lb3", "logit_bias": {str(first): -100}})
    assert r["logprobs"][0]["token_id"] != first
    r = c.request({**base, "id": "lb4", "logit_bias": {"99999999": 1}})
    assert r["type"] == "error" and r["error"]["field"] == "logit_bias.99999999", r
    c.close()


def test_stop_string_cuts_text_exactly(tiny_daemon):
    c = tiny_daemon.conn()
    full = c.request(_completion("f", "Numbers:", temperature=0, max_tokens=30))
    text = full["text"]
    assert len(text) > 6
    stop = text[3:6]                       # a stop string from the middle of the greedy continuation
    cut = c.request(_completion("c", "Numbers:", temperature=0, max_tokens=30, stop=[stop], stream=False))
    assert cut["finish_reason"] == "stop"
    assert cut["text"] == text[:text.index(stop)]
    c.send(_completion("cs", "Numbers:", temperature=0, max_tokens=30, stop=stop, stream=True))
    deltas, done = c.until_done("cs")
    assert "".join(d["text"] for d in deltas) == text[:text.index(stop)] == done["text"]
    c.close()
    tiny_daemon.wait_idle()


def test_status_schema_and_metrics(tiny_daemon):
    st = tiny_daemon.status()
    assert set(st) >= {"model", "lanes", "queue", "kv_pool", "slots", "tiers", "retained", "requests"}
    assert set(st["model"]) >= {"name", "arch", "kv_format", "context_tokens", "page_tokens", "page_bytes",
                                "state_bytes"}
    assert st["model"]["kv_format"] == "fp32" and st["model"]["context_tokens"] == 1024
    # page bytes of the tiny Llama, by hand: 64 tokens x 2 (K,V) x layers x kv_heads x head_dim x 4 bytes
    import json
    from pathlib import Path
    cfg = json.loads((Path(tiny_daemon_model_dir(tiny_daemon)) / "config.json").read_text())
    hd = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    assert st["model"]["page_bytes"] == 64 * 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * hd * 4
    assert set(st["lanes"]) == {"total", "prefill", "decode", "evicted"} and st["lanes"]["total"] == 4
    assert st["kv_pool"]["pages_total"] == 64
    assert set(st["slots"]) == {"device_total", "device_free", "host_total", "host_free"}
    c = tiny_daemon.conn()
    text = c.request({"id": "m", "op": "metrics"})["result"]["text"]
    c.close()
    from prometheus_client.parser import text_string_to_metric_families
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["ignis_kv_pool_pages"].samples[0].value == 64
    assert fams["ignis_kv_page_bytes"].samples[0].value == st["model"]["page_bytes"]
    assert "ignis_ttft_seconds" in fams and "ignis_decode_tokens" in fams


def tiny_daemon_model_dir(d):
    for i, a in enumerate(d.proc.args):
        if a == "--model":
            return d.proc.args[i + 1]
    raise AssertionError("no --model")


def test_done_log_line(tiny_daemon):
    c = tiny_daemon.conn()
    c.request(_completion("logme", "Hi", temperature=0, max_tokens=3))
    c.close()
    lines = [ln for ln in tiny_daemon.log().splitlines() if " done " in ln and "id=logme" in ln]
    assert len(lines) == 1
    for key in ("prompt=", "cached=0", "prefilled=", "generated=", "tier=", "kind=", "ttft_ms=", "tok_s=",
                "finish="):
        assert key in lines[0], lines[0]
    assert any("vram_plan" in ln and "kv_pool_pages=64" in ln for ln in tiny_daemon.log().splitlines())
