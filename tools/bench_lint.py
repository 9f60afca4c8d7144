"""How long `ignis lint` takes on a 50-request agent trace against a running daemon (issue 14; aim: under 10 s).

    python tools/bench_lint.py [--model DIR] [--requests 50] [--width 1] [--shape anthropic] [--threads 1]

Serves the tests' tiny random Qwen3.5 hybrid with the real Qwen3.5 vocabulary, tokenizer and chat template (tools,
reasoning) unless --model. The trace is a byte-stable tool loop (tests/lint_support.agent_session: one user message,
then per request one more assistant tool call with reasoning and one tool result of --width × ~120 tokens) whose
system prompt carries a clock that changes every 10 requests (a timestamp cause), written as JSON lines of
--shape bodies. Timed: the whole `ignis lint TRACE --json` path in this process (read the trace, one `tokenize` op
per request over the socket, compare, summarise), after one untimed warm-up request. Prints the trace size, the
seconds, the requests/s and the report's summary figures.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tools"))
from daemon_support import DaemonProc  # noqa: E402
from lint_support import SHAPES, SYSTEM, TOOLS, agent_session, body  # noqa: E402

from ignis_client.cli import main as ignis_main  # noqa: E402


def write_trace(path: Path, requests: int, width: int, shape: str) -> int:
    """Write the trace (see the module docstring); returns its size in bytes."""
    with open(path, "w") as f:
        for k, msgs in enumerate(agent_session(requests, width)):
            system = SYSTEM + f" Current time: 2025-03-14 09:{k // 10:02d}:00."
            f.write(json.dumps(body(shape, system, TOOLS, msgs)) + "\n")
    return path.stat().st_size


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory (default: the tiny real-vocabulary Qwen3.5, built here)")
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--width", type=int, default=1, help="tool result size, in units of ~120 tokens")
    ap.add_argument("--shape", choices=SHAPES, default="anthropic")
    ap.add_argument("--threads", type=int, default=1, help="the daemon's torch threads")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ignis-bench-lint-", dir="/tmp"))
    model = args.model
    if model is None:
        from make_tiny_checkpoint import make_tiny_qwen3_5
        model = str(make_tiny_qwen3_5(tmp / "model", seed=0, hidden=64, real_tokenizer=True))
    trace = tmp / "trace.jsonl"
    size = write_trace(trace, args.requests, args.width, args.shape)
    d = DaemonProc(["--model", model, "--lanes", "2", "--vram-kv-pool-bytes", "4Ktok", "--server-threads",
                    str(args.threads)], tmp)
    try:
        argv = ["lint", str(trace), "--json", "--socket", d.socket]
        warm = trace.with_name("warm.jsonl")             # one request: connection and template caches warm
        warm.write_text(trace.read_text().split("\n", 1)[0] + "\n")
        with contextlib.redirect_stdout(io.StringIO()):
            ignis_main(["lint", str(warm), "--socket", d.socket])
        out = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out):
            rc = ignis_main(argv)
        dt = time.perf_counter() - t0
    finally:
        d.stop()
    if rc != 0:
        print(f"ignis lint exited with {rc}", file=sys.stderr)
        return rc
    s = json.loads(out.getvalue())["summary"]
    print(f"trace: {args.requests} {args.shape} requests, {size / 1e6:.2f} MB, {s['prompt_tokens']} prompt tokens")
    print(f"ignis lint: {dt:.2f} s ({args.requests / dt:.1f} requests/s) — aim: under 10 s")
    print(f"report: observed hit rate {100 * s['observed_hit_rate']:.1f}%, achievable "
          f"{100 * s['achievable_hit_rate']:.1f}%, lost {s['lost_tokens']} tokens "
          f"({s['lost_seconds']:.2f} s at {s['prefill_tokens_per_s']:.0f} tok/s), top cause "
          f"{s['causes'][0]['cause'] if s['causes'] else None}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
