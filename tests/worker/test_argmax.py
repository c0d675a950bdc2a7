"""The sampler's ``argmax_rows`` (block maxima, then the block) returns what ``torch.argmax`` returns."""

from __future__ import annotations

import pytest
import torch

from minengine.worker.sampler import argmax_rows


@pytest.mark.parametrize("vocab", [64, 640, 1000, 49152])
def test_same_as_torch_argmax(vocab):
    g = torch.Generator().manual_seed(vocab)
    x = torch.randn(9, vocab, generator=g).repeat(1 + 65536 // (9 * vocab), 1)  # enough logits for the blocks
    assert x.numel() >= 65536
    x[1] = 0.0  # every token tied: the first
    x[2, vocab // 2:] = x[2].max() + 1  # ties across blocks: the first block's
    x[3, 5] = float("nan")  # a NaN counts as the max
    x[4, :] = float("-inf")
    x[5, -1] = 1e30  # the last token
    x[6] = torch.randint(0, 3, (vocab,), generator=g).float()  # many ties
    assert torch.equal(argmax_rows(x), x.argmax(-1))
    assert argmax_rows(x[:0]).shape == (0,)
    t = x.t().contiguous().t()  # not contiguous
    assert torch.equal(argmax_rows(t), x.argmax(-1))
