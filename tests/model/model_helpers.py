"""Helpers for the model oracles: run token sequences through ignis's paged forward in chunks."""
from __future__ import annotations

import torch

from ignisd.cache.kv_store import KVStore
from ignisd.model.batch import ForwardBatch, SeqChunk


def shuffled_pages(n_pages: int, pool_pages: int, seed: int) -> list[int]:
    """n_pages distinct page ids of a pool of pool_pages, in a scrambled (non-monotonic) order."""
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(pool_pages, generator=g)[:n_pages].tolist()


def run_chunked(model, kv: KVStore, ids: list[int], chunk: int | None, n_decode: int,
                pages: list[int]) -> torch.Tensor:
    """Prefill ids[:-n_decode] in chunks of `chunk` tokens (None: one chunk), logits for every token, then feed the
    last n_decode tokens one decode step at a time. Returns fp32 logits [len(ids), vocab], row i after token i."""
    prefill = len(ids) - n_decode
    step = chunk or prefill
    out = []
    for s in range(0, prefill, step):
        part = ids[s:min(prefill, s + step)]
        out.append(model.forward(ForwardBatch.build([SeqChunk(part, s, pages, "all")], kv.page_tokens), kv))
    for p in range(prefill, len(ids)):
        out.append(model.forward(ForwardBatch.build([SeqChunk([ids[p]], p, pages, "last")], kv.page_tokens), kv))
    return torch.cat(out)
