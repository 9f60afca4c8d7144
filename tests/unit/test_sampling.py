"""Sampling warpers against transformers' own logits processors (the independent oracle), and seeded generators."""
import math

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ignisd.request import SamplingParams
from ignisd.sampling import make_generator, sample_row, token_logprobs, warp_logits


def _hf(logits, p: SamplingParams):
    procs = LogitsProcessorList()
    procs.append(TemperatureLogitsWarper(p.temperature))
    if p.top_k:
        procs.append(TopKLogitsWarper(p.top_k))
    if p.top_p < 1.0:
        procs.append(TopPLogitsWarper(p.top_p))
    if p.min_p:
        procs.append(MinPLogitsWarper(p.min_p))
    return procs(torch.zeros(1, 1, dtype=torch.long), logits.view(1, -1).clone())[0]


@pytest.mark.parametrize("temperature,top_k,top_p,min_p", [
    (1.0, 0, 1.0, 0.0), (0.7, 50, 1.0, 0.0), (1.3, 0, 0.9, 0.0), (1.0, 0, 1.0, 0.05),
    (0.8, 40, 0.95, 0.02), (2.0, 5, 0.5, 0.1),
])
def test_warpers_match_transformers(temperature, top_k, top_p, min_p):
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        logits = torch.randn(1000, generator=g) * 3
        p = SamplingParams(max_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
        ours, ref = warp_logits(logits, p), _hf(logits, p)
        assert torch.equal(torch.isinf(ours), torch.isinf(ref))
        keep = ~torch.isinf(ref)
        assert torch.allclose(ours[keep], ref[keep], atol=1e-6)


def test_greedy_is_argmax_and_draws_nothing():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    g = make_generator(5)
    state = g.get_state().clone()
    assert sample_row(logits, SamplingParams(max_tokens=1, temperature=0.0), g) == 1
    assert torch.equal(g.get_state(), state)


def test_seeded_sampling_repeats_and_is_isolated():
    logits = torch.randn(500, generator=torch.Generator().manual_seed(3))
    p = SamplingParams(max_tokens=1, temperature=1.0, seed=42)
    g1, g2, other = make_generator(42), make_generator(42), make_generator(7)
    a = [sample_row(logits, p, g1) for _ in range(20)]
    b = []
    for _ in range(20):
        sample_row(logits, p, other)        # another request drawing in between changes nothing for g2
        b.append(sample_row(logits, p, g2))
    assert a == b and len(set(a)) > 1


def test_sampling_follows_distribution():
    # 3 tokens with probabilities 0.5/0.3/0.2: 20000 draws land within 4 sigma of each
    probs = torch.tensor([0.5, 0.3, 0.2])
    logits = probs.log()
    g = make_generator(0)
    p = SamplingParams(max_tokens=1, temperature=1.0)
    counts = torch.bincount(torch.tensor([sample_row(logits, p, g) for _ in range(20000)]), minlength=3).float()
    sigma = (20000 * probs * (1 - probs)).sqrt()
    assert ((counts - 20000 * probs).abs() < 4 * sigma).all()


def test_token_logprobs_rank_and_top():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    lp, tops, ranks = token_logprobs(logits, torch.tensor([2]), 2)
    ref = torch.log_softmax(logits, -1)[0]
    assert lp[0] == pytest.approx(float(ref[2]))
    assert ranks == [2]
    assert [t for t, _ in tops[0]] == [1, 2]


def test_tokens_of_probability_zero_are_never_drawn():
    # top-k 2 of 6: every draw is one of the two largest, in proportion e^2 : e^1 (4 sigma)
    logits = torch.tensor([0.0, 2.0, -1.0, 1.0, 0.5, -3.0])
    g = make_generator(11)
    p = SamplingParams(max_tokens=1, temperature=1.0, top_k=2)
    counts = torch.bincount(torch.tensor([sample_row(logits, p, g) for _ in range(5000)]), minlength=6).float()
    assert counts[[0, 2, 4, 5]].sum() == 0
    share = math.e / (math.e + 1)                       # P(token 1) = e² / (e² + e¹)
    assert abs(counts[1] - 5000 * share) < 4 * math.sqrt(5000 * share * (1 - share))


def test_a_draw_at_the_top_of_the_range_takes_the_last_token_of_nonzero_probability(monkeypatch):
    logits = torch.tensor([1.0, 0.0, float("-inf"), float("-inf")])
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.tensor(1.0, dtype=torch.float64))   # u·total = total
    assert sample_row(logits, SamplingParams(max_tokens=1, temperature=1.0), make_generator(0)) == 1


def test_no_finite_probability_is_refused():
    with pytest.raises(ValueError, match="no finite probability"):
        sample_row(torch.full((4,), float("nan")), SamplingParams(max_tokens=1, temperature=1.0), make_generator(0))
