"""End to end on the real built-in model (SmolLM2-135M-Instruct GGUF): the main job, logprobs against
transformers, and batched decode exactness against single-lane runs."""
import os
import subprocess
import sys

import pytest
import torch
from daemon_support import alone_and_batched

pytestmark = pytest.mark.smollm

PROMPTS = [
    "Write a haiku about the sea.", "What is 17 times 23?", "Name three primary colors.",
    "Explain recursion to a child.", "Translate 'good morning' into French.",
    "Give me a Python one-liner to reverse a list.",
    "What is the boiling point of water in Kelvin?", "Who wrote Pride and Prejudice?", "List four planets.",
    "Describe a cat in two sentences.", "What does HTTP stand for?", "Suggest a name for a bakery.",
    "Why is the sky blue?", "Write a limerick about a programmer.", "What is the square root of 144?",
    "Summarise the plot of Romeo and Juliet.",
]


def test_ignis_chat_answers_paris(smollm_daemon):
    env = dict(os.environ, IGNIS_SOCKET=smollm_daemon.socket)
    r = subprocess.run([sys.executable, "-m", "ignis_client.cli", "chat",
                        "What is the capital of France? Answer in one sentence."],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout, r.stdout
    smollm_daemon.wait_idle()


def test_ignore_eos_runs_to_max_tokens(smollm_daemon):
    """The greedy answer ends with <|im_end|> well before 48 tokens; with ignore_eos it runs to exactly 48."""
    c = smollm_daemon.conn()
    body = {"op": "chat", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0, "max_tokens": 48}
    short = c.request(dict(body, id="e0"))
    long = c.request(dict(body, id="e1", ignore_eos=True))
    c.close()
    assert short["finish_reason"] == "stop" and short["usage"]["completion_tokens"] < 48
    assert long["finish_reason"] == "length" and long["usage"]["completion_tokens"] == 48
    assert long["text"].startswith(short["text"])
    smollm_daemon.wait_idle()


def test_prompt_logprobs_match_transformers(smollm_daemon, hf_smollm):
    text = ("The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
            "It is named after the engineer Gustave Eiffel, whose company designed and built the tower.")
    c = smollm_daemon.conn()
    tok = c.request({"id": "t", "op": "tokenize", "text": text})["result"]["tokens"]
    done = c.request({"id": "p", "op": "completion", "prompt": tok, "max_tokens": 1, "temperature": 0,
                      "prompt_logprobs": 5})
    c.close()
    pl = done["prompt_logprobs"]
    assert len(pl) == len(tok) and pl[0] is None
    with torch.no_grad():
        ref = torch.log_softmax(hf_smollm(torch.tensor([tok])).logits[0].float(), -1)
    worst = 0.0
    for i in range(1, len(tok)):
        e = pl[i]
        assert e["token"] == tok[i]
        worst = max(worst, abs(e["logprob"] - float(ref[i - 1, tok[i]])))
        top = torch.topk(ref[i - 1], 5)
        assert [t for t, _ in e["top"]][:1] == top.indices.tolist()[:1]
        for (t, lp) in e["top"]:
            assert abs(lp - float(ref[i - 1, t])) < 1e-3
        assert e["rank"] == int((ref[i - 1] > ref[i - 1, tok[i]]).sum()) + 1
    assert worst < 1e-3, worst
    smollm_daemon.wait_idle()


def test_batched_decode_equals_single_lane(smollm_daemon):
    """16 prompts, 64 greedy tokens, 8 lanes at once vs each alone: identical token ids, or diverging only where
    the single-lane top-2 logits were within 1e-4 (log-softmax preserves logit differences)."""
    alone, batched = alone_and_batched(smollm_daemon, PROMPTS, 64)
    same = 0
    for i in range(len(PROMPTS)):
        a, b = alone[i], batched[i]
        assert a["type"] == "done" and b["type"] == "done", (a, b)
        ids_a = [e["token_id"] for e in a["logprobs"]]
        ids_b = [e["token_id"] for e in b["logprobs"]]
        if ids_a == ids_b:
            same += 1
            continue
        k = next((j for j, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), min(len(ids_a), len(ids_b)))
        assert k < min(len(ids_a), len(ids_b)), f"prompt {i}: one run stopped early at {k} without divergence"
        top = a["logprobs"][k]["top_logprobs"]
        gap = top[0]["logprob"] - top[1]["logprob"]
        assert gap < 1e-4, f"prompt {i} diverged at token {k} where the single-lane top-2 gap was {gap}"
    assert same >= 1
