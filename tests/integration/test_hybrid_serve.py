"""Serving a hybrid (Gated DeltaNet + gated attention) model over the socket: the tiny Qwen3.5 with the real
vocabulary, tokenizer and chat template; live state slots; tools and reasoning in the reply; prompt logprobs
against transformers on the same weights."""
import json

import torch

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city"]}}}]

CONVERSATION = [
    {"role": "system", "content": "You are a helpful agent."},
    {"role": "user", "content": "What's the weather in Paris for 2 days?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 2})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp_c\": 18, \"sky\": \"clear\"}"},
    {"role": "user", "content": "And should I take an umbrella?"},
]


def test_status_reports_live_state_slots(qwen_daemon, tiny_qwen35_real_dir):
    st = qwen_daemon.status()
    cfg = json.loads((tiny_qwen35_real_dir / "config.json").read_text())
    n_gdn = sum(1 for t in cfg["layer_types"] if t == "linear_attention")
    hv, dk, dv = cfg["linear_num_value_heads"], cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    conv_dim = 2 * cfg["linear_num_key_heads"] * dk + hv * dv
    # fp32 recurrent state + fp32 conv history of K-1 columns, per GDN layer (DESIGN §4.2)
    expect = n_gdn * (hv * dk * dv * 4 + conv_dim * (cfg["linear_conv_kernel_dim"] - 1) * 4)
    assert st["model"]["state_bytes"] == expect
    assert st["model"]["arch"] == "qwen3_5"
    assert st["live_states"] == {"slots_total": 4, "slots_used": 0, "bytes_used": 0}


def test_streamed_chat_with_tools_round_trips(qwen_daemon):
    c = qwen_daemon.conn()
    body = {"id": "tc", "op": "chat", "messages": CONVERSATION, "tools": TOOLS, "temperature": 0,
            "max_tokens": 24, "stream": True}
    tok = c.request({"id": "tk", "op": "tokenize", "messages": CONVERSATION, "tools": TOOLS})["result"]
    # the template rendered the tool schema and the earlier call with its arguments as an object (XML form)
    assert "get_weather" in tok["text"] and "<function=get_weather>" in tok["text"]
    assert "<parameter=city>\nParis\n</parameter>" in tok["text"]
    assert tok["text"].endswith("<|im_start|>assistant\n<think>\n")
    c.send(body)
    deltas, done = c.until_done("tc")
    assert done["type"] == "done", done
    assert done["usage"]["prompt_tokens"] == len(tok["tokens"])
    msg = done["message"]
    # generation starts inside <think>: the streamed reasoning pieces add up to the final reasoning_content
    streamed_reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
    streamed_content = "".join(d["text"] for d in deltas)
    assert streamed_reasoning.strip() == (msg["reasoning_content"] or "")
    assert streamed_content.strip() == (msg["content"] or "").strip()
    assert "<tool_call>" not in streamed_content
    assert done["finish_reason"] in ("length", "stop", "tool_calls")
    c.close()
    qwen_daemon.wait_idle()
    assert qwen_daemon.status()["live_states"]["slots_used"] == 0


def test_forced_tool_choice_opens_the_reply_with_the_call(qwen_daemon):
    """tool_choice naming a function: the reply's first tokens are the call's opening (forced by the scheduler a
    token a step: prefill's sample, then decode steps), whatever the random model would have written; the model
    goes on after them. Streamed, the forced call's header is the first tool-call piece."""
    c = qwen_daemon.conn()
    body = {"id": "fc", "op": "chat", "messages": CONVERSATION, "tools": TOOLS, "temperature": 0, "max_tokens": 12,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "chat_template_kwargs": {"enable_thinking": False}, "stream": True}
    forced = "<tool_call>\n<function=get_weather>\n"
    n_forced = len(c.request({"id": "tk", "op": "tokenize", "text": forced})["result"]["tokens"])
    c.send(body)
    deltas, done = c.until_done("fc")
    assert done["type"] == "done" and done["usage"]["completion_tokens"] == 12, done
    assert done["text"].startswith(forced) and len(done["text"]) > len(forced)
    pieces = [p for d in deltas for p in d.get("tool_calls") or []]
    assert pieces and pieces[0]["function"]["name"] == "get_weather" and pieces[0]["index"] == 0
    free = dict(body, id="free", stream=False)
    free.pop("tool_choice")
    auto = c.request(free)
    assert not auto["text"].startswith(forced)           # the random model does not open a call by itself
    assert n_forced < 12
    c.close()


def test_tools_refused_on_a_template_without_tools(tiny_daemon):
    c = tiny_daemon.conn()
    r = c.request({"id": "nt", "op": "chat", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS})
    assert r["type"] == "error" and r["error"]["field"] == "tools"
    c.close()


def test_prompt_logprobs_match_transformers(qwen_daemon, tiny_qwen35_real_dir):
    from transformers import AutoModelForCausalLM
    c = qwen_daemon.conn()
    text = "Gated DeltaNet layers keep a recurrent state; attention layers keep KV pages. " * 3
    ids = c.request({"id": "t", "op": "tokenize", "text": text})["result"]["tokens"]
    done = c.request({"id": "p", "op": "completion", "prompt": ids, "max_tokens": 4, "temperature": 0,
                      "prompt_logprobs": 3})
    c.close()
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_qwen35_real_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    pl = done["prompt_logprobs"]
    assert pl[0] is None and len(pl) == len(ids)
    worst = max(abs(pl[i]["logprob"] - float(ref[i - 1, ids[i]])) for i in range(1, len(ids)))
    assert worst < 1e-3, worst
    # greedy continuation equals transformers' argmax chain
    with torch.no_grad():
        g = hf.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    want = g[0, len(ids):].tolist()
    c = qwen_daemon.conn()
    got = c.request({"id": "g", "op": "completion", "prompt": ids, "max_tokens": 4, "temperature": 0,
                     "logprobs": True})
    c.close()
    assert [e["token_id"] for e in got["logprobs"]] == want[:len(got["logprobs"])]
    qwen_daemon.wait_idle()
