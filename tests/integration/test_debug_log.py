"""`--log-level debug` adds a line per admission (`sched admitted`) and per round (`sched round`) to the info lines
(DESIGN §6 server.log_level): before, nothing logged at debug, so the level changed nothing."""
from __future__ import annotations

from ignisd.log import parse_line


def test_debug_logs_each_admission_and_round(start_daemon, tiny_llama_dir):
    d = start_daemon(["--model", str(tiny_llama_dir), "--lanes", "2", "--vram-kv-pool-bytes", "4Ktok",
                      "--model-context-tokens", "1024", "--server-prefill-chunk", "64",
                      "--server-round-prefill-tokens", "64", "--log-level", "debug"])
    c = d.conn()
    ids = [(37 * i + 11) % 900 + 100 for i in range(150)]           # 150 prompt tokens: 3 rounds of 64 at most
    done = c.request({"id": "q1", "op": "completion", "prompt": ids, "max_tokens": 5, "temperature": 0,
                      "ignore_eos": True})
    assert done["type"] == "done" and done["finish_reason"] == "length", done
    c.close()
    lines = [parse_line(ln) for ln in d.log().splitlines() if ln.startswith(("DEBUG", "INFO"))]
    adm = [ln for ln in lines if ln.event == "admitted" and ln.fields["id"].endswith("q1")]   # (and the warm-up's)
    assert len(adm) == 1 and adm[0].level == "DEBUG" and adm[0].component == "sched", adm
    f = adm[0].fields
    assert f["prompt"] == 150 and f["resumed"] == 0 and f["tier"] is None
    assert f["pages"] == 3                              # 150 prompt + 5 new tokens: 155 tokens, 3 pages of 64
    at = lines.index(adm[0])
    rounds = [ln.fields for ln in lines[at:] if ln.event == "round"]
    # 150 prompt tokens in chunks of 64 (a round's budget): 64, 64, 22, the last one also sampling the first new
    # token; then 4 decode rounds for the other 4
    assert [r["prefill_tokens"] for r in rounds] == [64, 64, 22, 0, 0, 0, 0], rounds
    assert [r["decode_tokens"] for r in rounds] == [0, 0, 0, 1, 1, 1, 1], rounds
    assert all(r["sequences"] == 1 and r["ms"] > 0 for r in rounds), rounds
    assert [r["n"] for r in rounds] == list(range(rounds[0]["n"], rounds[0]["n"] + 7))
