"""What a chat body would resume if it were sent now: the admission's own lookup, run as a peek (DESIGN §4.4, §4.5).

The playground's fingerprint asks this before the user sends: how many prompt tokens the kept states would restore,
from which tier and kind, and where the prompt first diverges from the best kept state. Nothing here decides reuse
on its own: the prompt is prepared by the edge as a real request is (template, tokens, cut points), the lookup is the
retained store's (the same restore floors and token limit as ``CacheManager.admit``, unpinned: a peek changes no
rank and holds nothing), the miss reason is the scheduler's, and the report (``best_candidate``, ``diverged_at``) is
built by ``Prompts.reuse`` as for a finished request. The answer is therefore what ``ignis.reuse`` of the same body
sent now would say, unless the kept states change in between. †: imports no torch.
"""
from __future__ import annotations

from ignisd.cache.manager import ReuseMatch
from ignisd.fronts.ndjson import reuse_object
from ignisd.reuse_report import reuse_info


def probe(edge, op) -> dict:
    """``{"prompt_tokens", "reuse"}`` for chat op `op` on `edge` (ignisd.edge.Edge, or the daemon's ModelHost that
    forwards to it): ``reuse`` is the ``ignis.reuse`` wire object the request would get if admitted now.
    Raises ProtocolError for a body the chat op refuses, except context_length: whether the prompt and reply fit
    the context is the send's question, not reuse's, so a prompt that fills it is probed too."""
    gen = edge.prepare_chat(op, "probe", fits=False)   # rendered, tokenized and cut; never submitted
    req = gen.request
    engine = edge.engine
    cache = engine.cache
    match = None
    if cache.reuse_enabled and req.cache_prompt:   # as the scheduler's _capturing: lookups only where admission would
        lk = cache.retained.lookup(req.prompt_ids, pin=False, explain=True, floors=cache.tiers.floors)
        match = ReuseMatch.of(lk)
    info = reuse_info(cache, req, match)             # the admission's own report rules, not a twin
    reuse = edge.prompts.reuse(info, info.cached_tokens, gen.prompt)
    return {"prompt_tokens": len(req.prompt_ids), "reuse": reuse_object(reuse)}
