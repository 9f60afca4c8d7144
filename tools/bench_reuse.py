"""Prompt reuse figures over the socket, reuse on and off in the same run (DESIGN §4.3-§4.5, issue 4).

    python tools/bench_reuse.py [--model PATH | --tiny | --hybrid] [--context 8192] [--threads N] [--repeat 3]
                                [--sections ttft,burst,replay,tax,hol] [--lengths 1024,2048,4096,8000]
                                [--round-prefill-tokens 512] [--hol-budgets 64,256,512]

Serves the built-in SmolLM2 (context 8,192) unless --model; --tiny: the tests' tiny random Llama (SmolLM2's
tokenizer and template, context 2,048); --hybrid: a tiny random-weight Qwen3.5 hybrid (hidden 256) with the real
Qwen3.5 vocabulary, tokenizer and chat template (it renders tools and reasoning; random weights write garbage, which
does not matter for TTFT or a replay). "Cold" is the same request with ``cache_prompt: false`` on the same daemon,
which is what ``--reuse-prompt off`` does to every request. Sections (--sections picks some):

- ttft: TTFT of turn 2 of a conversation whose turn 1 is about L tokens, cold vs resumed (median of --repeat), the
  ratio resumed/cold. Aim: resumed <= 5% of cold at 8K.
- burst: 1 main + 8 subagents sent at once on a shared 4,096-token system + tools block (all in the system message
  when the template renders no tools; scaled down when the context is smaller): total prompt tokens, total
  prefilled tokens and mean TTFT, reuse on and off.
- replay: a scripted 20-turn tool-calling agent conversation (system + tools block of ~2K tokens; each turn an
  assistant tool call + a tool result of 150-300 tokens, every 4th turn a plain answer + user message instead; plain
  assistant + user turns when the template renders no tools), each prompt sent with max_tokens 1; the model's own
  output is never used. cached / prompt tokens per turn and their mean from turn 2 on. Aim: >= 0.9 from turn 2.
- tax: the three-traversal tax: TTFT of a cold ~1K chat prompt that takes its captures (split at its cut points
  on a hybrid; one traversal on an attention-only model, DESIGN §4.3) against the same token ids sent as a
  completion (one traversal, no capture), both cold.
- hol: head-of-line blocking, one fresh daemon per round prefill budget B of --hol-budgets: TTFT of a resumed turn 2
  on the idle daemon (median of 3), then sent while a different ~8K-token cold prompt (~1,900 on a 2,048 context)
  is in prefill, when it is 5%, 35% and 70% through; "one round" = that prefill's round in flight when the probe
  is sent (from the progress change before the probe to the one after it; ``status`` read every 20 ms). Aim: each
  loaded TTFT <= idle + one round (the scheduler serves a short prefill in the round after it arrives and runs no
  long chunk beside it).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
from daemon_support import DaemonProc  # noqa: E402  (the tests' daemon launcher, as bench_serve uses it)
from make_tiny_checkpoint import make_tiny_llama, make_tiny_qwen3_5  # noqa: E402

SECTIONS = ("ttft", "burst", "replay", "tax", "hol")
WORDS = ("river bridge market garden harbour tower museum street square palace canal station library theatre "
         "castle forest meadow valley mountain island").split()


def words(n: int, salt: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n))


def _fn(name: str, desc: str, **props: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {k: {"type": t} for k, t in props.items()}, "required": [next(iter(props))]}}}


TOOLS = [_fn("get_weather", "Current weather for a city, with an optional number of days ahead", city="string",
             days="integer"),
         _fn("search_files", "Search the workspace for files whose text matches a pattern", pattern="string",
             max_results="integer"),
         _fn("read_file", "Read a text file of the workspace, optionally a range of lines", path="string",
             start_line="integer", end_line="integer"),
         _fn("write_file", "Write a text file of the workspace, replacing its content", path="string",
             content="string"),
         _fn("run_command", "Run a shell command in the workspace and return its output", command="string",
             timeout_s="integer")]
CALLS = [("search_files", {"pattern": "def schedule"}), ("read_file", {"path": "ignisd/scheduler.py",
                                                                       "start_line": 1, "end_line": 80}),
         ("run_command", {"command": "pytest -q tests/unit"}), ("get_weather", {"city": "Paris", "days": 2}),
         ("write_file", {"path": "notes.md", "content": "river bridge market"})]


def ttft(r: dict) -> float:
    return r["timings"]["ttft_ms"]


def cached(r: dict) -> int:
    return r["usage"]["prompt_tokens_details"]["cached_tokens"]


class Bench:
    """One daemon and a connection to it; `call` numbers the ids and raises on an error reply."""

    def __init__(self, d: DaemonProc, context: int):
        self.d, self.context, self.n = d, context, 0
        self.c = self.conn()
        self.tools = TOOLS if self.renders_tools() else None

    def conn(self):
        c = self.d.conn()
        c.sock.settimeout(900)        # an 8K cold prefill at a small round budget takes minutes on a few cores
        return c

    def call(self, body: dict, c=None) -> dict:
        self.n += 1
        r = (c or self.c).request(dict(body, id=f"r{self.n}"))
        if r["type"] == "error":
            raise RuntimeError(r)
        return r

    def chat(self, messages, tools=None, **kw) -> dict:
        body = {"op": "chat", "messages": messages, "temperature": 0, "max_tokens": 1, **kw}
        return self.call(dict(body, tools=tools) if tools else body)

    def tokenize(self, messages, tools=None) -> dict:
        body = {"op": "tokenize", "messages": messages}
        return self.call(dict(body, tools=tools) if tools else body)["result"]

    def n_tokens(self, messages, tools=None) -> int:
        return len(self.tokenize(messages, tools)["tokens"])

    def renders_tools(self) -> bool:
        """A template that ignores tools answers tokenize with an error (DESIGN §5) or leaves the name out."""
        try:
            text = self.tokenize([{"role": "user", "content": "hi"}], TOOLS[:1])["text"]
        except RuntimeError:
            return False
        return TOOLS[0]["function"]["name"] in text

    def conversation_of(self, tokens: int, salt: int) -> list[dict]:
        """[system, user] rendering to about `tokens` tokens (within 16)."""
        k = max(8, tokens // 2)
        for _ in range(6):
            m = [{"role": "system", "content": f"Brief {salt}. " + words(k, salt)},
                 {"role": "user", "content": f"Question {salt}. " + words(k, salt + 1)}]
            got = self.n_tokens(m)
            if abs(got - tokens) < 16:
                break
            k = max(8, int(k * tokens / got))
        return m

    def block_tokens(self, system: dict, tools) -> int:
        """Tokens of the rendered system + tools block: up to the token at the system message's end."""
        tk = self.tokenize([system, {"role": "user", "content": "x"}], tools)
        end = tk["messages"][0]["end"]
        return next((i for i, o in enumerate(tk["offsets"]) if o[0] >= end), len(tk["tokens"]))

    def system_block(self, target: int, salt: int, tools) -> tuple[dict, int]:
        """A system message whose block (with `tools`) is about `target` tokens (within 4 when it converges)."""
        def of(k: int) -> dict:
            return {"role": "system", "content": f"Agent brief {salt}. " + words(k, salt)}
        base = self.block_tokens(of(0), tools)
        k = max(1, target - base)
        for _ in range(8):
            got = self.block_tokens(of(k), tools)
            if abs(got - target) <= 4:
                break
            k = max(1, round(k * (target - base) / max(1, got - base)))
        return of(k), got


def start(args: list[str], threads: int) -> DaemonProc:
    # DaemonProc puts --server-threads 1 first; the later flag wins
    return DaemonProc([*args, "--server-threads", str(threads)], Path(tempfile.mkdtemp(prefix="ignis-bench-")))


# ---------------------------------------------------------------- sections

def section_ttft(b: Bench, lengths: list[int], repeat: int) -> None:
    print("prompt_tokens  cached  cold_ttft_ms  resumed_ttft_ms  resumed/cold")
    rows, seen = [], set()
    for L in lengths:
        target = min(L, b.context - 96)         # turn 2 adds ~30 tokens to turn 1; + 1 generated must fit
        if target in seen:
            continue
        seen.add(target)
        b.call({"op": "reset"})
        t1 = b.conversation_of(target, L)
        r1 = b.chat(t1, max_tokens=8)
        t2 = t1 + [{"role": "assistant", "content": r1["text"]}, {"role": "user", "content": "Go on."}]
        if b.n_tokens(t2) + 1 > b.context:
            print(f"{L}: turn 2 does not fit the context of {b.context}")
            continue
        cold = [ttft(b.chat(t2, cache_prompt=False)) for _ in range(repeat)]
        hot = [b.chat(t2) for _ in range(repeat)]
        cm, hm = statistics.median(cold), statistics.median(ttft(r) for r in hot)
        n = hot[0]["usage"]["prompt_tokens"]
        rows.append((n, hm / cm))
        print(f"{n:>13}  {cached(hot[0]):>6}  {cm:>12.1f}  {hm:>15.1f}  {hm / cm:>12.3f}")
    if rows:
        n, ratio = rows[-1]
        where = "" if n >= 7500 else f" (the longest row is {n} tokens, not 8K: context {b.context})"
        print(f"aim resumed <= 5% of cold at 8K: {'met' if ratio <= 0.05 else 'NOT met'}, "
              f"{ratio * 100:.1f}% at {n} tokens{where}")


def section_burst(b: Bench) -> None:
    users = [{"role": "user", "content": f"Subtask {i}: " + words(60 + 10 * i, i)} for i in range(9)]
    longest = max(b.n_tokens([u]) for u in users)
    target = min(4096, b.context - longest - 64)
    sysm, got = b.system_block(target, 1, b.tools)
    what = "system + tools" if b.tools else "system only: the template renders no tools"
    scaled = "" if target == 4096 else f", scaled to the context of {b.context}"
    print(f"burst: 1 main + 8 subagents on a {got}-token block ({what}{scaled})")
    for label, kw in (("on", {}), ("off", {"cache_prompt": False})):
        b.call({"op": "reset"})
        for i, u in enumerate(users):
            body = {"id": f"b{i}", "op": "chat", "messages": [sysm, u], "temperature": 0, "max_tokens": 1, **kw}
            b.c.send(dict(body, tools=b.tools) if b.tools else body)
        finals = {}
        while len(finals) < len(users):
            r = b.c.recv()
            if r["type"] in ("done", "error"):
                finals[r["id"]] = r
        bad = [r for r in finals.values() if r["type"] == "error"]
        if bad:
            raise RuntimeError(bad[0])
        tot = sum(r["usage"]["prompt_tokens"] for r in finals.values())
        pre = tot - sum(cached(r) for r in finals.values())
        print(f"burst reuse {label:>3}: prompt tokens {tot}, prefilled {pre}, "
              f"mean TTFT {statistics.mean(ttft(r) for r in finals.values()):.1f} ms")


def scripted_turn(t: int, tools) -> list[dict]:
    """What follows the prompt of replay turn t: a tool call and its result (150-300 tokens), or every 4th turn
    (and always without tools) a plain assistant answer and a new user message."""
    if tools and t % 4 != 3:
        name, args = CALLS[t % len(CALLS)]
        call = {"role": "assistant", "content": "", "tool_calls": [{"id": f"call_{t}", "type": "function", "function": {
            "name": name, "arguments": json.dumps(args)}}]}
        out = json.dumps({"ok": True, "output": words(140 + (t * 37) % 140, t)})
        return [call, {"role": "tool", "tool_call_id": f"call_{t}", "content": out}]
    answer = {"role": "assistant", "content": f"Step {t} done: " + words(30 + (t * 11) % 30, t + 3)}
    n = (140 + (t * 37) % 140) if not tools else 40 + (t * 13) % 40
    return [answer, {"role": "user", "content": f"Next, step {t + 1}: " + words(n, t + 5)}]


def section_replay(b: Bench, turns: int = 20) -> None:
    b.call({"op": "reset"})
    sysm, got = b.system_block(2048 if b.context >= 4096 else b.context // 2, 2, b.tools)
    msgs = [sysm, {"role": "user", "content": "Task: find where the scheduler plans a round and fix it. "
                   + words(60, 9)}]
    what = "tool calls and results" if b.tools else "plain assistant / user turns: the template renders no tools"
    rows = []
    for t in range(turns):
        if b.n_tokens(msgs, b.tools) + 1 > b.context:
            break
        r = b.chat(msgs, b.tools)
        rows.append((cached(r), r["usage"]["prompt_tokens"]))
        msgs += scripted_turn(t, b.tools)
    print(f"replay: {len(rows)} turns on a {got}-token block ({what}); cached/prompt per turn:")
    print("  " + " ".join(f"{c}/{p}" for c, p in rows))
    if len(rows) > 1:
        mean = statistics.mean(c / p for c, p in rows[1:])
        print(f"replay mean cached/prompt from turn 2: {mean:.3f}; aim >= 0.9: {'met' if mean >= 0.9 else 'NOT met'}"
              + ("" if len(rows) == turns else f" (stopped at turn {len(rows)}: the next prompt exceeds the context)"))


def section_tax(b: Bench, repeat: int) -> None:
    """The chat and the completion of the same ids alternate (the machine drifts): median of max(5, repeat) each.
    The chat runs with reuse on after a ``reset`` (cold, and it takes its captures, as a real first request does);
    the completion with cache_prompt false (one traversal, no capture)."""
    t = b.conversation_of(1024, 7)
    tk = b.tokenize(t)
    ids = tk["tokens"]
    split, one = [], []
    for _ in range(max(5, repeat)):
        b.call({"op": "reset"})
        split.append(ttft(b.chat(t)))
        one.append(ttft(b.call({"op": "completion", "prompt": ids, "max_tokens": 1, "temperature": 0,
                                "cache_prompt": False})))
    s, o = statistics.median(split), statistics.median(one)
    print(f"three-traversal tax on {len(ids)} tokens (cuts at {tk['cut_points']['publish']} and "
          f"{tk['cut_points']['opener']}): split {s:.1f} ms vs one traversal {o:.1f} ms ({(s / o - 1) * 100:+.1f}%)")


class ProgressProbe:
    """Polls ``status`` every ``period`` s in a thread and records (monotonic s, prefilled tokens) of request `rid`,
    so the bench sees the rounds of a long prefill as they happen: a round is the time between two changes."""

    PERIOD = 0.02      # seconds between status reads

    def __init__(self, d: DaemonProc, rid: str, period: float = PERIOD):
        self.d, self.rid, self.period = d, rid, period
        self.marks: list[tuple[float, int, str]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        c = self.d.conn()
        try:
            while not self._stop.is_set():
                rows = [r for r in c.request({"id": "probe", "op": "status"})["result"]["requests"]
                        if r["id"].endswith(":" + self.rid)]
                if rows:
                    self.marks.append((time.monotonic(), rows[0]["prefilled"], rows[0]["state"]))
                time.sleep(self.period)
        finally:
            c.close()

    def stop(self) -> None:
        self._stop.set()
        self._t.join()

    def state(self) -> tuple[str | None, int]:
        """(state, prefilled) of the latest sample ((None, 0) before the first)."""
        return (self.marks[-1][2], self.marks[-1][1]) if self.marks else (None, 0)

    def round_at(self, t: float) -> float:
        """The length (s) of the prefill's round in flight at `t`: from the last change of the prefilled count at or
        before `t` to the first after it (a round's end is such a change; the first sample in prefill stands for the
        start of the first round). 0 when `t` is not inside a seen round. Accurate to the polling period."""
        marks = [m for m in self.marks if m[2] == "prefill"]
        ends = [marks[0][0]] if marks else []
        ends += [t1 for (t1, n, _), (_, m, _) in zip(marks[1:], marks[:-1]) if n != m]
        if len(self.marks) > len(marks) and marks:      # the prefill ended: its last round ended at the state change
            ends.append(next(m[0] for m in self.marks if m[0] > marks[-1][0]))
        before = [x for x in ends if x <= t]
        after = [x for x in ends if x > t]
        return after[0] - before[-1] if before and after else 0.0


def section_hol(args: list[str], threads: int, context: int, budgets: list[int]) -> None:
    """Per budget B: resumed turn-2 TTFT idle and while a long cold prompt prefills (module docstring). The aim's
    "one round" is the long prefill's round in flight when each probe is sent (status polled every 20 ms), since a
    round's length grows with the context it attends to."""
    for B in budgets:
        d = start([*args, "--server-round-prefill-tokens", str(B)], threads)
        try:
            b = Bench(d, context)
            t1 = b.conversation_of(min(1024, context // 4), 11)
            r1 = b.chat(t1, max_tokens=8)
            t2 = t1 + [{"role": "assistant", "content": r1["text"]}, {"role": "user", "content": "And then?"}]
            idle_rs = [b.chat(t2) for _ in range(3)]
            if not all(cached(r) > 0 for r in idle_rs):
                raise RuntimeError(f"turn 2 did not resume: {idle_rs[0]['ignis']['reuse']}")
            idle = statistics.median(ttft(r) for r in idle_rs)
            long = b.conversation_of(min(8000, context - 148), 77)
            n_long = b.n_tokens(long)
            other = b.conn()
            rows = []
            for i, frac in enumerate((0.05, 0.35, 0.7)):
                rid = f"long{i}"
                probe = ProgressProbe(d, rid)
                other.send({"id": rid, "op": "chat", "messages": long, "temperature": 0, "max_tokens": 1,
                            "cache_prompt": False})
                t_give_up = time.monotonic() + 900
                while True:          # until the long prompt is `frac` of the way through its prefill
                    state, done_tokens = probe.state()
                    if (state == "prefill" and done_tokens >= frac * n_long) or state == "decode" \
                            or time.monotonic() > t_give_up:
                        break
                    time.sleep(0.02)
                at = done_tokens / n_long
                t_send = time.monotonic()
                r2 = b.chat(t2)
                t_back = time.monotonic()
                done = other.until_done(rid)[1]
                probe.stop()
                if done["type"] != "done":
                    raise RuntimeError(done)
                loaded_under = probe.state()[0] == "prefill" or any(
                    t_send <= t <= t_back and st == "prefill" for t, _, st in probe.marks)
                rnd = probe.round_at(t_send) * 1e3
                rows.append((ttft(r2), at, rnd, loaded_under))
            other.close()
            probe_ms = ProgressProbe.PERIOD * 1e3
            parts, ok = [], True
            for x, at, rnd, under in rows:
                good = x <= idle + rnd + 2 * probe_ms     # the round is read to +-1 polling period
                ok &= good or not under
                parts.append(f"{x:.0f} ms at {at * 100:.0f}% (round there {rnd:.0f} ms{'' if under else ', not loaded'}"
                             f"{'' if good else ', OVER'})")
            print(f"hol budget {B}: idle TTFT {idle:.0f} ms; loaded TTFT " + "; ".join(parts)
                  + f" into a {n_long}-token cold prefill; aim loaded <= idle + the round in flight"
                  + f" (+{2 * probe_ms:.0f}"
                  " ms of status polling resolution): "
                  + ("met" if ok else "NOT met"))
        finally:
            d.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--model", help="GGUF file or HF directory (default: the built-in SmolLM2)")
    which.add_argument("--tiny", action="store_true", help="the tiny random Llama of the tests (context 2,048)")
    which.add_argument("--hybrid", action="store_true",
                       help="a tiny random Qwen3.5 hybrid with the real Qwen3.5 tokenizer and template")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset of " + ",".join(SECTIONS))
    ap.add_argument("--lengths", default="1024,2048,4096,8000", help="turn-1 prompt tokens of the ttft section")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=min(8, os.cpu_count() or 1))
    ap.add_argument("--context", type=int, default=8192, help="model.context_tokens (--tiny: 2,048)")
    ap.add_argument("--round-prefill-tokens", type=int, default=512, help="of the daemon of every section but hol")
    ap.add_argument("--hol-budgets", default="64,256,512", help="round prefill budgets of the hol section")
    a = ap.parse_args()
    sections = a.sections.split(",")
    if not set(sections) <= set(SECTIONS):
        ap.error(f"--sections: choose from {','.join(SECTIONS)}")
    context = 2048 if a.tiny else a.context
    if a.tiny:
        a.model = str(make_tiny_llama(Path(tempfile.mkdtemp(prefix="ignis-tiny-")), seed=0))
    elif a.hybrid:
        a.model = str(make_tiny_qwen3_5(Path(tempfile.mkdtemp(prefix="ignis-hybrid-")), seed=0, hidden=256,
                                        real_tokenizer=True, max_position_embeddings=max(context, 4096)))
    args = ["--lanes", "8", "--vram-kv-pool-bytes", "160Ktok", "--model-context-tokens", str(context)]
    if a.model:
        args += ["--model", a.model]
    main_sections = [s for s in sections if s != "hol"]
    if main_sections:
        d = start([*args, "--server-round-prefill-tokens", str(a.round_prefill_tokens)], a.threads)
        try:
            b = Bench(d, context)
            print(f"# model {b.call({'op': 'status'})['result']['model']['name']}, context {context}, threads "
                  f"{a.threads}, round prefill {a.round_prefill_tokens}, tools "
                  f"{'rendered' if b.tools else 'not rendered by the template'}")
            if "ttft" in sections:
                section_ttft(b, [int(x) for x in a.lengths.split(",")], a.repeat)
            if "burst" in sections:
                section_burst(b)
            if "replay" in sections:
                section_replay(b)
            if "tax" in sections:
                section_tax(b, a.repeat)
        finally:
            d.stop()
    if "hol" in sections:
        section_hol(args, a.threads, context, [int(x) for x in a.hol_budgets.split(",")])


if __name__ == "__main__":
    main()
