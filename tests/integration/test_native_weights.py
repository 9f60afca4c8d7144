"""The built-in SmolLM2 GGUF served with the default model.weight_format (native: the file's Q4_1 / Q8_0 weights
through ignis_kernels.linear's C kernels, which the vram_plan line names) end to end: a factual answer, and batched
decode equal to single-lane decode (the kernels compute each row alone, so a lane's tokens do not depend on its
neighbours)."""
import pytest
from daemon_support import alone_and_batched

pytestmark = pytest.mark.smollm

PROMPTS = ["Write a haiku about the sea.", "What is 17 times 23?", "Name three primary colors.",
           "Who wrote Pride and Prejudice?"]


@pytest.fixture(scope="module")
def native_daemon(start_module_daemon):
    return start_module_daemon(["--lanes", "4", "--vram-kv-pool-bytes", "8Ktok"])


def test_native_answers_paris(native_daemon):
    c = native_daemon.conn()
    done = c.request({"id": "p", "op": "chat", "temperature": 0, "max_tokens": 24, "messages": [
        {"role": "user", "content": "What is the capital of France? Answer in one sentence."}]})
    c.close()
    assert done["type"] == "done" and "Paris" in done["text"], done
    native_daemon.wait_idle()
    plan = next(ln for ln in native_daemon.log().splitlines() if "vram_plan" in ln)
    assert 'weight_format=native weight_kernel="cpu (C kernels, exact fp32)" norm_kernel="cpu (C kernel)"' in plan, \
        plan
    assert 'kv_decode_kernel="cpu (C kernel)"' in plan, plan
    assert 'decode_step="cpu (fused C layers, 1 to 8 lanes)"' in plan, plan


def test_native_batched_decode_equals_single_lane(native_daemon):
    alone, batched = alone_and_batched(native_daemon, PROMPTS, 24)
    for i in range(len(PROMPTS)):
        ids_a = [e["token_id"] for e in alone[i]["logprobs"]]
        ids_b = [e["token_id"] for e in batched[i]["logprobs"]]
        assert ids_a == ids_b, (i, alone[i]["text"], batched[i]["text"])
