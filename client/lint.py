"""``ignis lint``: why a session's prompts miss the retained prefix (standard library only, †: no torch).

``lint(entries, render, prefill_tokens_per_s)`` renders every trace entry (``render(entry) -> tokenize result``: the
daemon's ``tokenize`` op over the socket, or ``ignisd lint``'s in-process one) and compares each request with the
requests before it. Per request (``RequestReport``):

* ``best``: the earlier request sharing the longest common token prefix (ties: the latest); ``common_tokens`` that
  prefix, ``observed`` = common_tokens / prompt_tokens. This is the most any retained state could give it: the
  daemon itself resumes at a cut point at or before it (DESIGN §4.3), so its ``cached_tokens`` are at most this.
* ``divergence``: where the texts first differ — ``message_index``, ``role``, ``char_offset`` in this request's
  rendered text, ``token``, and ±40 characters of the earlier (``ours``) and this (``theirs``) request — and
  ``cause`` (``lint_causes.LINT_CAUSES``) with every cause met past it in ``causes``. A divergence at or after the
  first message the earlier request did not have, or where one prompt is a prefix of the other, is ``new`` (cause
  ``extended``): the session grew (or went back to an earlier turn), nothing was lost. A byte-stable harness shows
  only such divergences.
* ``achievable_tokens``: the prefix the request would share with the same earlier request if every volatile span
  (nonce, timestamp, id, counter, whitespace, tool order, JSON key order, reasoning) were byte-stable: the
  comparison resumes past each one and stops at the first real change (an edited message, changed tools), at the
  first new message, or at the end of the earlier request (``lint_causes.explain``). ``lost_tokens`` =
  achievable − common.

The summary (``Summary``): the observed hit rate Σ common / Σ prompt tokens and the achievable one Σ achievable /
Σ prompt tokens (over every rendered request, the first included: it can hit nothing); the prefill the volatile
causes cost (Σ lost tokens, and seconds at `prefill_tokens_per_s` when known); the causes ranked by tokens lost.
Entries that cannot be rendered are reported with their line and field and left out; lint goes on.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from .divergence import diverged_at, first_divergence
from .lint_causes import Rendered, explain
from .trace import TraceEntry, TraceError


@dataclass
class RequestReport:
    """One request of the trace against the best earlier one (see the module docstring). index: 0-based among the
    trace's entries; best: the index of the earlier request (None for the first); tokens are token counts."""

    index: int
    line: int
    shape: str
    front: str | None
    prompt_tokens: int
    best: int | None = None
    common_tokens: int = 0
    achievable_tokens: int = 0
    divergence: dict | None = None
    cause: str | None = None
    causes: list[str] = field(default_factory=list)
    new: bool = False

    @property
    def lost_tokens(self) -> int:
        """Prefill tokens a byte-stable harness would not have paid: achievable − common (≥ 0)."""
        return max(0, self.achievable_tokens - self.common_tokens)


@dataclass
class Summary:
    """The trace's totals: requests rendered, prompt / common / achievable / lost tokens, the two hit rates
    (fractions 0–1), the prefill rate used (tokens/s; None: unknown) and the seconds lost at it, and the causes
    ``[{"cause", "requests", "lost_tokens"}]`` ranked by tokens lost, then by requests."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    common_tokens: int = 0
    achievable_tokens: int = 0
    lost_tokens: int = 0
    observed_hit_rate: float = 0.0
    achievable_hit_rate: float = 0.0
    prefill_tokens_per_s: float | None = None
    lost_seconds: float | None = None
    causes: list[dict] = field(default_factory=list)


@dataclass
class Report:
    """What lint found: one RequestReport per rendered request, the lines it could not use, and the Summary."""

    requests: list[RequestReport]
    errors: list[TraceError]
    summary: Summary

    def to_json(self) -> dict:
        """The ``--json`` object: ``{"requests": [...], "errors": [{"line", "field", "message"}], "summary"}``."""
        reqs = [{**asdict(r), "lost_tokens": r.lost_tokens} for r in self.requests]
        return {"requests": reqs, "errors": [asdict(e) for e in self.errors], "summary": asdict(self.summary)}


def _compare(i: int, entry: TraceEntry, theirs: Rendered, earlier: list[tuple[int, Rendered]]) -> RequestReport:
    rep = RequestReport(i, entry.line, entry.shape, entry.front, len(theirs.tokens))
    best, best_common = None, -1
    for j, r in earlier:
        d = first_divergence(r.tokens, theirs.tokens)
        common = min(len(r.tokens), len(theirs.tokens)) if d is None else d
        if common >= best_common:
            best, best_common = (j, r), common
    if best is None:
        return rep
    j, ours = best
    rep.best, rep.common_tokens, rep.achievable_tokens = j, best_common, best_common
    same = ours.tokens == theirs.tokens and ours.text == theirs.text
    div = None if same else diverged_at(ours.tokens, theirs.tokens, ours.text, theirs.text, theirs.offsets,
                                        theirs.spans, token=best_common)
    if div is None:
        rep.cause, rep.achievable_tokens = "none", len(theirs.tokens)
        return rep
    rep.divergence = div
    char = div["char_offset"]
    shorter = min(len(ours.text), len(theirs.text))
    if char >= theirs.new_from(len(ours.spans)) or ours.text[:shorter] == theirs.text[:shorter]:
        rep.new, rep.cause, rep.causes = True, "extended", ["extended"]
        return rep
    ex = explain(ours, theirs, char)
    rep.cause, rep.causes = ex.causes[0], list(dict.fromkeys(ex.causes))
    rep.achievable_tokens = max(best_common, ex.achievable_tokens)
    return rep


def summarize(requests: list[RequestReport], errors: int, prefill_tokens_per_s: float | None) -> Summary:
    """The Summary of `requests` (see the module docstring); `errors`: lines that could not be used."""
    s = Summary(requests=len(requests), errors=errors)
    by_cause: dict[str, list[int]] = {}
    for r in requests:
        s.prompt_tokens += r.prompt_tokens
        s.common_tokens += r.common_tokens
        s.achievable_tokens += r.achievable_tokens
        s.lost_tokens += r.lost_tokens
        if r.cause not in (None, "none", "extended"):
            c = by_cause.setdefault(r.cause, [0, 0])
            c[0] += 1
            c[1] += r.lost_tokens
    if s.prompt_tokens:
        s.observed_hit_rate = s.common_tokens / s.prompt_tokens
        s.achievable_hit_rate = s.achievable_tokens / s.prompt_tokens
    if prefill_tokens_per_s:
        s.prefill_tokens_per_s = float(prefill_tokens_per_s)
        s.lost_seconds = s.lost_tokens / s.prefill_tokens_per_s
    s.causes = [{"cause": k, "requests": v[0], "lost_tokens": v[1]}
                for k, v in sorted(by_cause.items(), key=lambda kv: (-kv[1][1], -kv[1][0], kv[0]))]
    return s


def lint(entries: Iterable[TraceEntry], render: Callable[[TraceEntry], dict], prefill_tokens_per_s: float | None,
         errors: list[TraceError] | None = None) -> Report:
    """Render and compare every entry (see the module docstring). render(entry) returns the ``tokenize`` result of
    the entry's body and raises an exception with ``field`` / ``message`` attributes (ProtocolError, IgnisError) or
    any other exception for a body it cannot render: that entry becomes a TraceError and lint goes on."""
    errors = list(errors or ())
    done: list[tuple[int, Rendered]] = []
    reports: list[RequestReport] = []
    for entry in entries:
        try:
            result = render(entry)
        except (ConnectionError, KeyboardInterrupt):
            raise
        except Exception as e:  # a body the renderer refuses: report its line and field, go on
            fld = getattr(e, "field", None) or "body"
            errors.append(TraceError(entry.line, fld, getattr(e, "message", None) or str(e)))
            continue
        chat = result.get("chat") or {"messages": entry.body.get("messages"), "tools": entry.body.get("tools")}
        theirs = Rendered.from_tokenize(result, chat)
        reports.append(_compare(len(done), entry, theirs, done))
        done.append((len(done), theirs))
    errors.sort(key=lambda e: e.line)
    return Report(reports, errors, summarize(reports, len(errors), prefill_tokens_per_s))
