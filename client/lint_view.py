"""``ignis lint`` output: one line per request and a summary for a terminal, or the report as JSON (standard library
only, †: no torch). Colour (ANSI) only when asked — the CLI asks when stdout is a tty."""
from __future__ import annotations

import json

from .lint import Report, RequestReport
from .lint_causes import VOLATILE

RED, YELLOW, GREEN, DIM, BOLD, RESET = "\x1b[31m", "\x1b[33m", "\x1b[32m", "\x1b[2m", "\x1b[1m", "\x1b[0m"


def _paint(text: str, code: str, colour: bool) -> str:
    return f"{code}{text}{RESET}" if colour else text


def _cause_colour(cause: str | None) -> str:
    if cause in VOLATILE:
        return RED
    if cause in (None, "none", "extended"):
        return GREEN
    return YELLOW


def _pct(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:5.1f}%" if whole else "  0.0%"


def _clip(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)[1:-1]


def request_line(r: RequestReport, colour: bool = False) -> str:
    """One request: index, line, shape, prompt tokens, the shared prefix (tokens and fraction), the achievable one,
    the earlier request it was compared with, and where and why it diverged (±40 characters of both sides)."""
    head = (f"#{r.index:<3} line {r.line:<4} {r.shape:<9} {r.prompt_tokens:>7} tok  prefix {r.common_tokens:>7} "
            f"({_pct(r.common_tokens, r.prompt_tokens)})  achievable {r.achievable_tokens:>7} "
            f"({_pct(r.achievable_tokens, r.prompt_tokens)})")
    if r.best is None:
        return head + "  first request"
    vs = f"  vs #{r.best}"
    cause = _paint(r.cause or "none", _cause_colour(r.cause), colour)
    d = r.divergence
    if d is None:
        return f"{head}{vs}  {cause} (identical prompt)"
    where = f"msg {d['message_index']} {d['role']}" if d["message_index"] is not None else "template text"
    more = f" (+{', '.join(r.causes[1:])})" if len(r.causes) > 1 else ""
    if r.new:
        return f"{head}{vs}  {cause} at {where} @{d['char_offset']}"
    return (f"{head}{vs}  {cause}{more} at {where} @{d['char_offset']}  "
            f"{_paint('ours', DIM, colour)} \"{_clip(d['ours'])}\"  {_paint('theirs', DIM, colour)} "
            f"\"{_clip(d['theirs'])}\"")


def _count(n: int, noun: str) -> str:
    """`n noun`, the noun plural unless n is 1 ("1 request", "2 requests", "0 unusable lines")."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def render_report(rep: Report, colour: bool = False) -> str:
    """The terminal report: the lines lint could not use, one line per request, then the summary."""
    out = [f"error: {e}" for e in rep.errors]
    out += [request_line(r, colour) for r in rep.requests]
    s = rep.summary
    out.append("")
    out.append(_paint("summary", BOLD, colour) + f": {_count(s.requests, 'request')}, "
               f"{_count(s.errors, 'unusable line')}, {s.prompt_tokens} prompt tokens")
    out.append(f"  observed hit rate   {100 * s.observed_hit_rate:5.1f}%  ({s.common_tokens} tokens shared with an "
               "earlier request)")
    out.append(f"  achievable hit rate {100 * s.achievable_hit_rate:5.1f}%  ({s.achievable_tokens} tokens with "
               "byte-stable volatile spans)")
    secs = (f", {s.lost_seconds:.2f} s at {s.prefill_tokens_per_s:.0f} prefill tokens/s"
            if s.lost_seconds is not None else " (prefill rate unknown: pass --prefill-rate)")
    out.append(f"  lost to volatile causes: {s.lost_tokens} prefill tokens{secs}")
    if s.causes:
        out.append("  top causes: " + ", ".join(
            f"{_paint(c['cause'], _cause_colour(c['cause']), colour)} ({_count(c['requests'], 'request')}, "
            f"{c['lost_tokens']} tokens)" for c in s.causes[:5]))
    return "\n".join(out) + "\n"


def render_json(rep: Report) -> str:
    """The report as one JSON document (Report.to_json)."""
    return json.dumps(rep.to_json(), ensure_ascii=False, indent=1) + "\n"
