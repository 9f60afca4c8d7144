"""The ``ignis`` command: talk to a running ignisd.

    ignis chat "text" [--system S] [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P]
               [--seed N]              streams the answer (greedy unless --temperature)
    ignis status [--watch] [--json]    the pools, lanes, queue and retained states as text bars (--json: the raw op)
    ignis metrics | ignis health
    ignis lint TRACE [--json] [--prefill-rate TOK_S] [--color auto|always|never]
                                       why a session's prompts miss the retained prefix (client/lint.py): each
                                       request of a trace (JSON lines of request bodies, or the daemon's request log)
                                       is rendered by the daemon's `tokenize` op and compared with the earlier ones

Every subcommand takes ``--socket PATH`` (default: resolved as in DESIGN §6), ``--api-key-file FILE`` (or
$IGNIS_API_KEY) and ``--timeout S``. Exit status: 0 on success (`chat` too when the answer stops at max_tokens, with
a note on stderr), 1 on an error reply, an answer the daemon cancelled, or when no daemon is listening, 2 for a
command line argparse refuses, 130 when interrupted.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from .client import Client, DaemonNotRunning, IgnisError, ReplyTimeout
from .framing import MAX_TIMEOUT_S
from .sampling_fields import MAX_TEMPERATURE, SEED_MAX, SEED_MIN
from .status_view import render_status
from .wire import MAX_TOKENS_LIMIT

CLEAR = "\x1b[H\x1b[2J"      # cursor home + clear screen (ANSI), before each --watch redraw
# a done with finish_reason "cancelled" names no cause: the daemon cancels an answer still running when it stops or
# reloads its model past server.shutdown_grace_s (or on a cancel op, which `ignis chat` never sends)
CANCELLED_NOTE = ('ignis: the answer was cut short: the daemon cancelled it (finish_reason "cancelled": it stopped or '
                  'reloaded before the answer was done)\n')


COMMANDS = ("chat", "status", "metrics", "health", "lint")


def _in_range(text: str, lo: float, hi: float, wanted: str, lo_open: bool = True) -> float:
    """An option's number: above `lo` (at least `lo` when not lo_open) and at most `hi`; else argparse's error (it
    names the option, exit 2) saying `wanted` and the text given."""
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not ((lo < v if lo_open else lo <= v) and v <= hi):
        raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
    return v


def _positive(text: str, hi: float, wanted: str) -> float:
    """A number above 0 and at most `hi` (see _in_range)."""
    return _in_range(text, 0.0, hi, wanted)


def _temperature(text: str) -> float:
    """--temperature: 0 (greedy) to 2, the sampling field's range (the daemon would refuse the rest, but in its own
    spelling of the number, -1.0 for -1)."""
    return _in_range(text, 0.0, MAX_TEMPERATURE, f"a number from 0 (greedy) to {MAX_TEMPERATURE:g}", lo_open=False)


def _whole(text: str, lo: int, hi: int, wanted: str) -> int:
    """An option's whole number from `lo` to `hi`; else argparse's error (it names the option, exit 2) saying
    `wanted` and the text given."""
    try:
        v = int(text)
    except ValueError:
        v = None
    if v is None or not lo <= v <= hi:
        raise argparse.ArgumentTypeError(f"must be {wanted}, got {text!r}")
    return v


def _max_tokens(text: str) -> int:
    """--max-tokens: a whole number from 1 to MAX_TOKENS_LIMIT, the sampling field's range (the daemon would refuse
    the rest after connecting, exit 1; this is argparse's error, exit 2, like --temperature's)."""
    return _whole(text, 1, MAX_TOKENS_LIMIT, f"a whole number from 1 to {MAX_TOKENS_LIMIT:,}")


def _seed(text: str) -> int:
    """--seed: a whole number from SEED_MIN to SEED_MAX, the sampling field's range (argparse's error, exit 2)."""
    return _whole(text, SEED_MIN, SEED_MAX, f"a whole number from {SEED_MIN:,} to {SEED_MAX:,}")


def _top_p(text: str) -> float:
    """--top-p: above 0 and at most 1 (the sampling field's range)."""
    return _in_range(text, 0.0, 1.0, "a number above 0 and at most 1")


def _min_p(text: str) -> float:
    """--min-p: 0 (off) to 1 (the sampling field's range)."""
    return _in_range(text, 0.0, 1.0, "a number from 0 (off) to 1", lo_open=False)


def _top_k(text: str) -> int:
    """--top-k: a whole number from 0 (off) to MAX_TOKENS_LIMIT (the sampling field's range)."""
    return _whole(text, 0, MAX_TOKENS_LIMIT, f"a whole number from 0 (off) to {MAX_TOKENS_LIMIT:,}")


def _timeout(text: str) -> float:
    """--timeout: seconds, a finite number above 0 and at most MAX_TIMEOUT_S."""
    return _positive(text, MAX_TIMEOUT_S, f"a number of seconds above 0 and at most {MAX_TIMEOUT_S:,} (leave "
                                          f"--timeout out to wait without a limit)")


def _prefill_rate(text: str) -> float:
    """--prefill-rate: tokens/s, a finite number above 0."""
    return _positive(text, sys.float_info.max, "prefill tokens/s, a finite number above 0")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--socket", help="daemon socket (default: $IGNIS_SOCKET, $RUNTIME_DIRECTORY/ignisd.sock, "
                                         "/run/ignis/ignisd.sock, $XDG_RUNTIME_DIR/ignis/ignisd.sock, "
                                         "/tmp/ignis-$UID/ignisd.sock)")
    common.add_argument("--api-key-file", help="file holding the daemon's API key (without it, the key itself is "
                                               "read from $IGNIS_API_KEY)")
    common.add_argument("--timeout", type=_timeout, default=None, metavar="S",
                        help="seconds to wait for each reply (default: no limit)")
    p = argparse.ArgumentParser(prog="ignis", description="Client of the ignisd inference daemon.")
    sub = p.add_subparsers(dest="cmd", required=True)
    chat = sub.add_parser("chat", parents=[common], help="send one user message and stream the answer")
    chat.add_argument("text", help="the user message")
    chat.add_argument("--system", help="a system message before it")
    chat.add_argument("--max-tokens", type=_max_tokens, default=None,
                      help="cap on generated tokens (default: the daemon's)")
    chat.add_argument("--temperature", type=_temperature, default=0.0, help="sampling temperature (default 0: greedy)")
    chat.add_argument("--top-p", type=_top_p, default=None, help="nucleus sampling mass (default 1: off)")
    chat.add_argument("--top-k", type=_top_k, default=None, help="sample among the K likeliest (default 0: off)")
    chat.add_argument("--min-p", type=_min_p, default=None, help="drop tokens below P × the likeliest's probability")
    chat.add_argument("--seed", type=_seed, default=None, help="sampling seed (a fixed seed repeats the answer)")
    status = sub.add_parser("status", parents=[common], help="draw the pools, lanes, queue and retained states")
    status.add_argument("--watch", action="store_true", help="redraw every second until interrupted")
    status.add_argument("--json", action="store_true", help="print the raw status op as JSON")
    sub.add_parser("metrics", parents=[common], help="print the Prometheus metrics")
    sub.add_parser("health", parents=[common], help="print health; exit 1 unless ok")
    add_lint_arguments(sub.add_parser("lint", parents=[common], help="explain why a trace's prompts miss the "
                                                                      "retained prefix"))
    return p


def add_lint_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments `ignis lint` and `ignisd lint` share."""
    p.add_argument("trace", help="JSON lines: OpenAI chat, Anthropic Messages or Responses bodies, or the daemon's "
                                 "request log (server.request_log)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--prefill-rate", type=_prefill_rate, default=None,
                   help="prefill tokens/s to price the lost tokens at (default: the daemon's measured rate)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the causes (auto: when stdout is a terminal)")


def run_lint(args: argparse.Namespace, render, prefill_rate: float | None) -> int:
    """Read args.trace, lint it with `render` (entry -> tokenize result), print the report. Exit status 0, or 1
    when the trace cannot be read or no line of it could be used."""
    from .lint import lint
    from .lint_view import render_json, render_report
    from .trace import read_trace
    try:
        entries, errors = read_trace(args.trace)
    except OSError as e:
        print(f"ignis: cannot read the trace {args.trace}: {e.strerror or e}", file=sys.stderr)
        return 1
    rate = args.prefill_rate if args.prefill_rate else prefill_rate
    rep = lint(entries, render, rate, errors)
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    sys.stdout.write(render_json(rep) if args.json else render_report(rep, colour))
    return 0 if rep.requests or not (entries or errors) else 1


def _lint(client: Client, args: argparse.Namespace) -> int:
    rate = (client.status().get("model") or {}).get("prefill_tokens_per_s") or None

    def render(entry):
        return client.request("tokenize", api=entry.shape, body=entry.body)["result"]
    return run_lint(args, render, rate)


def _api_key(args: argparse.Namespace) -> str | None:
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as f:
            return f.read().strip()
    return os.environ.get("IGNIS_API_KEY") or None


def _chat(client: Client, args: argparse.Namespace) -> int:
    messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
        {"role": "user", "content": args.text}]
    out, err = sys.stdout, sys.stderr
    in_reasoning = False
    events = client.chat(messages, stream=True, max_tokens=args.max_tokens, temperature=args.temperature,
                         top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, seed=args.seed)
    try:
        for ev in events:
            if ev["type"] == "delta":
                if ev.get("reasoning_content"):
                    err.write(ev["reasoning_content"])
                    err.flush()
                    in_reasoning = True
                if ev.get("text"):
                    if in_reasoning:
                        err.write("\n")
                        in_reasoning = False
                    out.write(ev["text"])
                    out.flush()
            elif ev["type"] == "done":
                out.write("\n")
                out.flush()
                if ev.get("finish_reason") == "length":
                    err.write("ignis: the answer was cut at max_tokens\n")
                elif ev.get("finish_reason") == "cancelled":
                    err.write(CANCELLED_NOTE)
                    return 1
    finally:
        events.close()
    return 0


def _status(client: Client, args: argparse.Namespace) -> int:
    while True:
        st = client.status()
        text = json.dumps(st, indent=2, ensure_ascii=False) + "\n" if args.json else render_status(st)
        sys.stdout.write((CLEAR if args.watch else "") + text)
        sys.stdout.flush()
        if not args.watch:
            return 0
        time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``ignis``; returns the exit status (2 for a command line argparse refuses)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        # the options belong to each command: say so, rather than argparse's "arguments are required: cmd"
        parser.error(f"unknown option {argv[0]!r} before the command; the commands are {', '.join(COMMANDS)} "
                     f"and their options follow them (ignis chat --help)")
    args = parser.parse_args(argv)
    try:
        client = Client(args.socket, timeout=args.timeout, api_key=_api_key(args))
    except OSError as e:
        print(f"ignis: cannot read the API key file: {e}", file=sys.stderr)
        return 1
    try:
        with client:
            if args.cmd == "chat":
                return _chat(client, args)
            if args.cmd == "status":
                return _status(client, args)
            if args.cmd == "lint":
                return _lint(client, args)
            elif args.cmd == "metrics":
                sys.stdout.write(client.metrics()["text"])
            elif args.cmd == "health":
                h = client.health()
                print(json.dumps(h, ensure_ascii=False))
                return 0 if h.get("ok") else 1
            return 0
    except DaemonNotRunning as e:
        print(f"ignis: the daemon is not running: nothing listens on {e.socket_path}\n"
              "  start it with `ignisd serve` (or `make serve`), or point at it with --socket PATH / $IGNIS_SOCKET",
              file=sys.stderr)
        return 1
    except IgnisError as e:
        print(f"ignis: error {e.code}: {e.message}" + (f" (field {e.field})" if e.field else ""), file=sys.stderr)
        if e.code == "auth":
            print("ignis: the daemon wants its API key: pass --api-key-file FILE, or set $IGNIS_API_KEY to the key",
                  file=sys.stderr)
        return 1
    except ReplyTimeout as e:
        print(f"ignis: the daemon on {client.socket_path} did not answer within {e.timeout:g} s (--timeout)",
              file=sys.stderr)
        return 1
    except (ConnectionError, TimeoutError) as e:
        print(f"ignis: connection to {client.socket_path} failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
