"""The sampler's top-k / top-p without a full sort (``worker/top_k_top_p.py``) keeps the same tokens and draws the
same token as the reference that sorts the whole row (``apply_top_k_top_p`` then ``draw_masked``)."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine.worker import top_k_top_p
from minengine.worker.sampler import token_generator
from minengine.worker.top_k_top_p import apply_top_k_top_p, draw_masked, sample_top_k_top_p


def reference_token(x: torch.Tensor, top_k: int, top_p: float, seed: int, index: int) -> int:
    return draw_masked(apply_top_k_top_p(x, top_k, top_p), token_generator(seed, index))


def fast_token(x: torch.Tensor, top_k: int, top_p: float, seed: int, index: int) -> int:
    return sample_top_k_top_p(x, top_k, top_p, token_generator(seed, index))


def logits_row(seed: int, vocab: int, scale: float, peak: int) -> torch.Tensor:
    """Random logits; ``peak`` tokens raised by 6, so the nucleus is sometimes narrow and sometimes wide."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(vocab, generator=g) * scale
    x[torch.randperm(vocab, generator=g)[:peak]] += 6.0
    return x


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**31), index=st.integers(0, 500), vocab=st.sampled_from([50, 1000, 5000, 49152]),
       scale=st.floats(0.1, 4.0), peak=st.integers(0, 40), top_k=st.sampled_from([-1, 0, 1, 2, 5, 50, 200]),
       top_p=st.sampled_from([1.0, 0.99, 0.95, 0.9, 0.5, 0.1, 1e-6]))
def test_same_token_as_the_full_sort(seed, index, vocab, scale, peak, top_k, top_p):
    x = logits_row(seed, vocab, scale, peak)
    assert fast_token(x, top_k, top_p, seed, index) == reference_token(x, top_k, top_p, seed, index)


def test_top_p_alone_takes_both_widths_and_the_fallback():
    """A narrow nucleus (inside the top 256), a wider one (inside the top 4,096) and one wider still (the full
    sort): every one draws the reference's token for many seeds."""
    vocab = 20000
    g = torch.Generator().manual_seed(0)
    for scale in (8.0, 1.0, 0.01):  # peaked to flat
        x = torch.randn(vocab, generator=g) * scale
        for seed in range(40):
            assert fast_token(x, 0, 0.9, seed, 3) == reference_token(x, 0, 0.9, seed, 3)


def test_ties_and_masked_tokens_go_to_the_reference():
    x = torch.zeros(1000)
    x[:3] = 5.0
    x[10:20] = float("-inf")
    for top_k, top_p in ((2, 1.0), (5, 0.8), (0, 0.9), (995, 1.0)):
        for seed in range(20):
            assert fast_token(x, top_k, top_p, seed, 0) == reference_token(x, top_k, top_p, seed, 0)
            assert fast_token(x, top_k, top_p, seed, 0) not in range(10, 20)


def test_draws_follow_the_distribution():
    """The draw is inverse-CDF sampling: frequencies over 4,000 seeds match softmax within 4 sigma."""
    x = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf"), 0.5])
    p = x.softmax(-1)
    n = 4000
    counts = torch.bincount(torch.tensor([fast_token(x, 0, 1.0, s, 0) for s in range(n)]), minlength=6).double()
    sigma = (n * p * (1 - p)).sqrt()
    assert counts[4] == 0
    assert bool(((counts - n * p).abs() <= 4 * sigma + 1).all()), (counts, n * p)
    top2 = torch.bincount(torch.tensor([fast_token(x, 2, 1.0, s, 0) for s in range(n)]), minlength=6)
    assert set(torch.nonzero(top2).flatten().tolist()) == {0, 1}


def test_rows_without_ties_never_sort(monkeypatch):
    """The rows above take the path without a full sort: here the reference is made to fail."""
    monkeypatch.setattr(top_k_top_p, "apply_top_k_top_p", lambda *a: (_ for _ in ()).throw(AssertionError("full sort")))
    x = logits_row(1, 151936, 1.0, 0)
    x[1000:1020] += 12.0  # 20 tokens hold about 95 % of the probability: a nucleus of 0.9 is inside them
    for top_k, top_p in ((50, 1.0), (50, 0.95), (1, 0.5), (0, 0.9)):
        assert 0 <= fast_token(x, top_k, top_p, 7, 0) < 151936
