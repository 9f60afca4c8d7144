"""The weight-format quality check (issue 11's Done-when), shared by tests/model/test_weight_formats.py and
tools/bench_weights.py: on 20 real prompts (the tokenizer corpus' code and prose, tests/text_corpus.py), the
teacher-forced next-token KL(p_ref ‖ p_got) of one loaded model against another (e.g. native against fp32) and
whether greedy continuations are identical."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from text_corpus import CODE, PROSE  # noqa: E402

from ignisd.cache.kv_format import get_kv_format  # noqa: E402
from ignisd.cache.kv_store import KVStore  # noqa: E402
from ignisd.model.batch import ForwardBatch, SeqChunk  # noqa: E402

PROMPT_TOKENS = 96
GREEDY_TOKENS = 16


def real_prompts(tokenizer, n: int = 20, tokens: int = PROMPT_TOKENS) -> list[list[int]]:
    """n prompts of at most `tokens` ids: the corpus' code samples and prose passages (whole, in order), those of at
    least 24 tokens. Raises ValueError when the corpus has fewer."""
    out = []
    for text in [*CODE, *PROSE]:
        ids = tokenizer.encode(text)
        if len(ids) >= 24:
            out.append(ids[:tokens])
        if len(out) == n:
            return out
    raise ValueError(f"only {len(out)} corpus texts of >= 24 tokens, {n} wanted")


def _store(spec, tokens: int) -> KVStore:
    return KVStore(get_kv_format("fp32"), spec, -(-tokens // 64) + 1)


def teacher_forced(model, spec, ids: list[int]) -> torch.Tensor:
    """fp32 logits [len(ids), vocab] of one prefill (row i predicts ids[i + 1]), fp32 KV pages."""
    kv = _store(spec, len(ids))
    pages = list(range(kv.num_pages))
    return model.forward(ForwardBatch.build([SeqChunk(ids, 0, pages, "all")], kv.page_tokens), kv)


def greedy(model, spec, ids: list[int], n: int = GREEDY_TOKENS) -> list[int]:
    """n greedy tokens after ids (one prefill, then single-token decode steps), fp32 KV pages."""
    kv = _store(spec, len(ids) + n)
    pages = list(range(kv.num_pages))
    logits = model.forward(ForwardBatch.build([SeqChunk(ids, 0, pages, "last")], kv.page_tokens), kv)
    out = [int(logits[-1].argmax())]
    for p in range(len(ids), len(ids) + n - 1):
        logits = model.forward(ForwardBatch.build([SeqChunk([out[-1]], p, pages, "last")], kv.page_tokens), kv)
        out.append(int(logits[-1].argmax()))
    return out


@dataclass
class Quality:
    """mean_kl: mean over prompts of the per-position mean KL(p_ref ‖ p_got) (nats); max_kl: its largest prompt;
    top1: fraction of positions with the same argmax; greedy_same: prompts whose greedy continuations are identical;
    prompts: how many; margins: for each prompt whose continuations differ, the gap between ref's two largest logits
    at the first differing token (a near-tie there is a tie broken the other way, not a different model)."""

    mean_kl: float
    max_kl: float
    top1: float
    greedy_same: int
    prompts: int
    margins: list[float]


def compare_models(ref, got, spec, prompts: list[list[int]], n_greedy: int = GREEDY_TOKENS) -> Quality:
    """Quality of model `got` against model `ref` (both Decoders of the same spec) on `prompts`."""
    kls, top1, margins = [], [], []
    same = 0
    for ids in prompts:
        lr = torch.log_softmax(teacher_forced(ref, spec, ids), -1)
        lg = torch.log_softmax(teacher_forced(got, spec, ids), -1)
        kls.append(float((lr.exp() * (lr - lg)).sum(-1).mean()))
        top1.append(float((lr.argmax(-1) == lg.argmax(-1)).float().mean()))
        a, b = greedy(ref, spec, ids, n_greedy), greedy(got, spec, ids, n_greedy)
        if a == b:
            same += 1
            continue
        j = next(i for i in range(len(a)) if a[i] != b[i])
        top = teacher_forced(ref, spec, ids + a[:j])[-1].topk(2).values
        margins.append(float(top[0] - top[1]))
    return Quality(sum(kls) / len(kls), max(kls), sum(top1) / len(top1), same, len(prompts), margins)
