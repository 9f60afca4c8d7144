"""ignis_kernels.attention (paged, causal within a chunk, GQA) against a plain dense causal attention written here
in float64: softmax(q k^T / sqrt(d) + causal mask) v over the sequence's keys in position order, kv head h // g.
Awkward shapes: GQA/MQA/MHA, odd head dims, pages of 4-64 tokens, chunks starting mid-page and crossing pages,
scrambled page tables, bf16 storage, batched decode of sequences of different lengths."""
from __future__ import annotations

import math

import pytest
import torch

import ignis_kernels.attention as kattn
from ignis_kernels.attention import PagedView, reference

torch.set_num_threads(1)


def dense_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """q [n, Hq, d] at positions start..start+n-1; k, v [start+n, Hkv, d] in position order. float64 result."""
    n, hq, d = q.shape
    g = hq // k.shape[1]
    kk = k.double().repeat_interleave(g, dim=1)            # [ctx, Hq, d]
    vv = v.double().repeat_interleave(g, dim=1)
    scores = torch.einsum("nhd,chd->hnc", q.double(), kk) / math.sqrt(d)
    pos_q = torch.arange(start, start + n)[:, None]
    pos_k = torch.arange(start + n)[None, :]
    scores = scores.masked_fill(pos_k > pos_q, float("-inf"))
    return torch.einsum("hnc,chd->nhd", torch.softmax(scores, dim=-1), vv)


def paged_setup(ctx, hkv, d, pt, n_pool, dtype, seed):
    """A pool [n_pool, pt, hkv, d] holding one sequence's ctx keys/values under a scrambled page table."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(ctx, hkv, d, generator=g)
    v = torch.randn(ctx, hkv, d, generator=g)
    n_pages = -(-ctx // pt)
    table = torch.randperm(n_pool, generator=g)[:n_pages]
    kp = torch.randn(n_pool, pt, hkv, d, generator=g).to(dtype)   # garbage everywhere else
    vp = torch.randn(n_pool, pt, hkv, d, generator=g).to(dtype)
    for p in range(ctx):
        kp[table[p // pt], p % pt] = k[p].to(dtype)
        vp[table[p // pt], p % pt] = v[p].to(dtype)
    return k.to(dtype).float(), v.to(dtype).float(), kp, vp, table


def dense(kp: torch.Tensor, vp: torch.Tensor) -> PagedView:
    """A dense view of k/v pages [P, page_tokens, Hkv, d]."""
    return PagedView("dense", {"k": kp, "v": vp}, kp.shape[1])


def rel_err(got, ref):
    return ((got.double() - ref).abs().max() / ref.abs().max()).item()


CASES = [  # (Hq, Hkv, d, page_tokens, start, n)
    (4, 4, 16, 16, 0, 37),      # MHA, prefill from 0 across pages
    (6, 2, 32, 16, 21, 1),      # GQA decode mid-page
    (9, 3, 64, 64, 100, 45),    # SmolLM2 heads, chunk starting mid-page, crossing a page boundary
    (8, 1, 16, 8, 64, 64),      # MQA, chunk starting on a page boundary
    (6, 3, 8, 4, 3, 2),         # tiny pages, 2-token chunk
    (12, 4, 24, 16, 250, 7),    # odd head dim, long context
    (4, 2, 16, 64, 1, 63),      # chunk after a single cached token, ends on the page end
]


@pytest.mark.parametrize("split", [True, False], ids=["lse-split", "masked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_paged_attention_matches_dense(case, dtype, split, monkeypatch):
    hq, hkv, d, pt, start, n = case
    if not split:
        monkeypatch.setattr(reference, "_FLASH_LSE", None)
    ctx = start + n
    k, v, kp, vp, table = paged_setup(ctx, hkv, d, pt, n_pool=-(-ctx // pt) + 5, dtype=dtype, seed=hash(case) % 1000)
    q = torch.randn(n, hq, d, generator=torch.Generator().manual_seed(1))
    got = kattn.paged_attention(q, dense(kp, vp), table, start)
    assert got.shape == (n, hq, d) and got.dtype == torch.float32
    assert rel_err(got, dense_causal(q, k, v, start)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hq,hkv,d,pt", [(9, 3, 64, 64), (4, 4, 16, 8), (8, 1, 32, 16)])
def test_paged_decode_batch_matches_dense(hq, hkv, d, pt, dtype):
    lens = [1, pt - 1, pt, pt + 1, 3 * pt + 5]
    pool = sum(-(-c // pt) for c in lens) + 3
    g = torch.Generator().manual_seed(5)
    kp = torch.randn(pool, pt, hkv, d, generator=g).to(dtype)
    vp = torch.randn(pool, pt, hkv, d, generator=g).to(dtype)
    perm = torch.randperm(pool, generator=g).tolist()
    tables, width = [], max(-(-c // pt) for c in lens)
    for c in lens:
        need = -(-c // pt)
        tables.append(perm[:need] + [perm[0]] * (width - need))   # padding: any valid page
        perm = perm[need:]
    table = torch.tensor(tables)
    q = torch.randn(len(lens), hq, d, generator=g)
    got = kattn.paged_decode_attention(q, dense(kp, vp), table, torch.tensor(lens))
    for b, c in enumerate(lens):
        slots = [(table[b, p // pt].item(), p % pt) for p in range(c)]
        k = torch.stack([kp[i, o] for i, o in slots]).float()
        v = torch.stack([vp[i, o] for i, o in slots]).float()
        assert rel_err(got[b:b + 1], dense_causal(q[b:b + 1], k, v, c - 1)) < 1e-5, (b, c)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("consecutive", [True, False], ids=["run", "scattered"])
@pytest.mark.parametrize("ctx", [1, 15, 16, 17, 61])
def test_single_decode_shortcut_matches_dense(ctx, consecutive, dtype):
    """The one-sequence shortcut (no mask; pages read in place when they are a consecutive run) against attention
    over the context's keys stacked by hand."""
    hq, hkv, d, pt = 6, 2, 16, 16
    g = torch.Generator().manual_seed(ctx)
    kp = torch.randn(9, pt, hkv, d, generator=g).to(dtype)
    vp = torch.randn(9, pt, hkv, d, generator=g).to(dtype)
    need = -(-ctx // pt)
    pages = list(range(3, 3 + need)) if consecutive else [8, 2, 5, 0][:need]
    table = torch.tensor([pages + [pages[0]]])              # one padding page: the shortcut must ignore it
    q = torch.randn(1, hq, d, generator=g)
    got = kattn.paged_decode_attention(q, dense(kp, vp), table, torch.tensor([ctx]),
                                       single=(ctx, pages[0] if consecutive else None))
    k = torch.stack([kp[pages[p // pt], p % pt] for p in range(ctx)]).float()
    v = torch.stack([vp[pages[p // pt], p % pt] for p in range(ctx)]).float()
    assert rel_err(got, dense_causal(q, k, v, ctx - 1)) < 1e-5


def test_attention_plan_single_decode_hint():
    from ignisd.model.attention import AttentionPlan
    from ignisd.model.batch import ForwardBatch, SeqChunk
    one = AttentionPlan.from_batch(ForwardBatch.build([SeqChunk([5], 70, [4, 5, 6])], 64))
    assert one.decode_single == (71, 4)
    scattered = AttentionPlan.from_batch(ForwardBatch.build([SeqChunk([5], 70, [6, 5])], 64))
    assert scattered.decode_single == (71, None)
    two = AttentionPlan.from_batch(ForwardBatch.build([SeqChunk([5], 70, [4, 5]), SeqChunk([5], 3, [9])], 64))
    assert two.decode_single is None
    invariant = AttentionPlan.from_batch(ForwardBatch.build([SeqChunk([5], 70, [4, 5, 6])], 64), single=False)
    assert invariant.decode_single is None


def test_gather_pages_layout():
    cache = torch.arange(5 * 4 * 2 * 3, dtype=torch.float32).view(5, 4, 2, 3)
    out = kattn.gather_pages(cache, torch.tensor([[3, 0], [1, 1]]))
    assert out.shape == (2, 8, 2, 3)
    assert torch.equal(out[0, :4], cache[3]) and torch.equal(out[0, 4:], cache[0])
    assert torch.equal(out[1, 4:], cache[1])


def test_causal_mask():
    m = kattn.causal_mask(3, 2)
    assert m.tolist() == [[True, True, True, False, False], [True, True, True, True, False],
                          [True, True, True, True, True]]


def test_dispatcher_checks_shapes():
    kp = torch.zeros(4, 16, 2, 8)
    with pytest.raises(ValueError, match="heads"):
        kattn.paged_attention(torch.zeros(3, 3, 8), dense(kp, kp), torch.tensor([0]), 0)
    with pytest.raises(ValueError, match="pages"):
        kattn.paged_attention(torch.zeros(3, 4, 8), dense(kp, kp), torch.tensor([0]), 14)
    with pytest.raises(ValueError):
        kattn.paged_decode_attention(torch.zeros(2, 4, 8), dense(kp, kp), torch.zeros(3, 1, dtype=torch.long),
                                     torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="page_tokens"):
        kattn.paged_attention(torch.zeros(3, 4, 8), PagedView("dense", {"k": kp, "v": kp}, 8), torch.tensor([0]), 0)


def test_dispatcher_refuses_unknown_view_tag():
    """A view whose tag has no kernel is refused by name, by both entry points."""
    kp = torch.zeros(4, 16, 2, 8)
    view = PagedView("q9", {"codes": kp}, 16)
    with pytest.raises(ValueError, match="'q9'.*known: dense, hq-e8-2b"):
        kattn.paged_attention(torch.zeros(3, 4, 8), view, torch.tensor([0]), 0)
    with pytest.raises(ValueError, match="'q9'"):
        kattn.paged_decode_attention(torch.zeros(1, 4, 8), view, torch.zeros(1, 1, dtype=torch.long),
                                     torch.tensor([1]))
