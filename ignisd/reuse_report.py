"""The reuse report of a request (``ignis.reuse`` on its `done`, DESIGN §5): how many prompt tokens resumed, from which
tier and kind, or the reason none did. The scheduler fills it at admission; the Playground's reuse probe
(reuse_probe.py) computes the same report for a prompt it does not admit.

†: imports no torch. `cache` is the CacheManager (its reuse_enabled, page_tokens and can_keep_images).
"""
from __future__ import annotations

from ignisd.cache.manager import ReuseMatch
from ignisd.request import Request, ReuseInfo


def reuse_info(cache, req: Request, match: ReuseMatch | None) -> ReuseInfo:
    """The reuse report of `req` admitted with `match` (None: no lookup was made, reuse off or prompt logprobs
    asked): the tokens resumed with their tier and kind, or why none were (miss_reason), and the best candidate."""
    if match is None:
        reason = "prompt_logprobs" if (req.prompt_logprobs is not None and req.cache_prompt
                                       and cache.reuse_enabled) else "reuse_off"
        return ReuseInfo(reason=reason)
    extra = dict(candidate_tokens=match.candidate_tokens, candidate_kind=match.candidate_kind,
                 candidate_tier=match.candidate_tier, candidate_common=match.candidate_common)
    if match.state_id is not None:
        return ReuseInfo(tier=match.tier, kind=match.kind, cached_tokens=match.tokens, reason=None, **extra)
    return ReuseInfo(reason=miss_reason(cache, req, match.reason), **extra)


def miss_reason(cache, req: Request, found: str) -> str:
    """Why a lookup that restored nothing missed (``ignis.reuse.reason``, DESIGN §5), most specific first:
    stamp_mismatch (only states of another stamp matched); short (`is_short`); no_slot (a hybrid model with no
    retained slot at all can keep no image, so nothing is ever retained); the prompt's missing cut (cut_unaligned,
    below_page); else miss. A miss whose own capture is then refused for want of a slot is re-labelled no_slot
    when that happens (Scheduler._capture_skipped)."""
    if found != "miss":
        return found
    if is_short(cache, req):
        return "short"
    if not cache.can_keep_images:
        return "no_slot"
    return req.cut_reason or "miss"


def queued_reuse_info(cache, req: Request) -> ReuseInfo:
    """The report of a request that ended before admission: reuse_off / prompt_logprobs as at admission, short for
    a prompt of at most one page (like every other short request), else miss."""
    if not (cache.reuse_enabled and req.cache_prompt and req.prompt_logprobs is None):
        return reuse_info(cache, req, None)
    return ReuseInfo(reason="short" if is_short(cache, req) else "miss")


def is_short(cache, req: Request) -> bool:
    """The prompt has at most one page of tokens: no retained state, at least a page long, can leave a token of it
    to prefill, and it captures nothing (reason "short")."""
    return len(req.prompt_ids) <= cache.page_tokens
