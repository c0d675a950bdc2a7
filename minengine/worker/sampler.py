"""Sampler: greedy, temperature, top-k, top-p, with per-request seeds.

A seeded request draws each token from a generator seeded by (seed, index of the token), so its output
does not depend on the other requests in the batch, on chunking or on preemption.
Top-p is nucleus sampling (Holtzman et al., ICLR 2020).
"""

from __future__ import annotations

import torch

from minengine.core.scheduler_output import ScheduledRequest

_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: spreads (seed, index) pairs over the seed space


def token_generator(seed: int, output_index: int) -> torch.Generator:
    """A CPU generator for the ``output_index``-th token of a request seeded with ``seed``."""
    return torch.Generator().manual_seed((seed * _MIX + output_index) % (2**63 - 1))


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask to -inf every logit outside the top-k and outside the top-p nucleus.

    Args:
        logits: [V] float32 (already divided by the temperature).
        top_k: keep the k largest (-1 keeps all). top_p: keep the smallest prefix of the sorted
            distribution whose probability reaches top_p (1.0 keeps all); the most likely token always stays.
    Returns:
        [V] float32.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the tokens strictly before it already reach top_p.
        drop = (probs.cumsum(-1) - probs) >= top_p
        drop[0] = False
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


class Sampler:
    """Turns the logits of the sampling requests into token ids.

    Args:
        seed: seeds the shared generator used by requests without their own seed.
    """

    def __init__(self, seed: int = 0):
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor, requests: list[ScheduledRequest]) -> list[int]:
        """logits: [S, V] float32, one row per sampling request, in ``requests`` order -> S token ids."""
        logits = logits.float().cpu()
        tokens = logits.argmax(-1).tolist()  # greedy for temperature 0
        for row, s in enumerate(requests):
            p = s.sampling_params
            if p.greedy:
                continue
            x = apply_top_k_top_p(logits[row] / p.temperature, p.top_k, p.top_p)
            gen = self.generator if p.seed is None else token_generator(p.seed, s.output_index)
            tokens[row] = int(torch.multinomial(x.softmax(-1), 1, generator=gen).item())
        return tokens
