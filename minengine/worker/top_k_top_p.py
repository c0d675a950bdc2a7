"""Top-k, top-p and the draw of one row without sorting the vocabulary (``sample_top_k_top_p``).

A 150k-token vocabulary makes a full sort of each sampled row cost far more than the rest of the step's host work,
so the sampler finds the candidates with ``torch.topk`` instead: the top-k tokens for top-k (already in order, so
top-p sorts only them), and for top-p alone the smallest top-m (m = 256, then 4,096) that holds the whole nucleus.
The reference, ``apply_top_k_top_p`` (here, and what ``process_logits`` applies), sorts the whole row; both
compute the same floats in the same order, so they keep the same tokens and draw the same one
(``tests/worker/test_top_k_top_p.py`` checks it for many rows, seeds and settings). Where they could part (a tie of
logits at the k-th place, or a logit that is not finite), the row takes the reference path.

The draw: the kept tokens in ascending token-id order, weights ``exp(x - max)``, one uniform number from the
request's generator, and the first token whose cumulative weight exceeds it (inverse-CDF sampling). One random
number per token, whatever the vocabulary.
"""

from __future__ import annotations

import torch

_TOP_P_WIDTHS = (256, 4096)  # candidate counts tried for top-p alone before the full sort


def draw(token_ids: torch.Tensor, x: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token drawn from ``softmax(x)`` over ``token_ids``.

    Args:
        token_ids: [K] int64, ascending. x: [K] float32 finite processed logits of those tokens.
        generator: the request's generator (None: torch's default).
    Returns:
        a token id from ``token_ids``.
    """
    cdf = torch.exp(x - x.max()).cumsum(0)
    u = torch.rand((), generator=generator) * cdf[-1]
    i = int(torch.searchsorted(cdf, u, right=True))
    return int(token_ids[min(i, len(token_ids) - 1)])


def draw_masked(x: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token drawn from ``softmax(x)``, x: [V] float32 with -inf for the tokens left out (the reference)."""
    token_ids = torch.nonzero(torch.isfinite(x)).flatten()
    return draw(token_ids, x[token_ids], generator)


def nucleus_size(weights_desc: torch.Tensor, total: torch.Tensor, top_p: float) -> int:
    """How many candidates the top-p nucleus keeps: ``weights_desc`` [K] float32, the weights ``exp(x - max)`` of
    the most likely candidates in descending order (all of them, or a prefix), ``total`` their sum over every
    candidate. A token is dropped when the weight before it already reaches ``top_p x total``; the first always
    stays. torch's CPU cumsum adds one after another, so a prefix gives the whole row's counts."""
    cumulative = weights_desc.cumsum(0)
    before = torch.cat([cumulative.new_zeros(1), cumulative[:-1]])
    return max(1, int((before < top_p * total).sum()))


def _top_k(x: torch.Tensor, top_k: int, top_p: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The kept tokens of top-k (then top-p among them) of x: [V] float32, as (ids ascending, logits), or None
    for a masked token among the top k or a tie at the k-th place (the reference keeps every tie)."""
    vals, ids = torch.topk(x, top_k)
    if not bool(torch.isfinite(vals).all()) or int((x >= vals[-1]).sum()) != top_k:
        return None
    ids, order = torch.sort(ids)
    vals = vals[order]
    if top_p >= 1.0:
        return ids, vals
    weights = torch.exp(vals - vals.max())
    weights_desc, by_weight = torch.sort(weights, descending=True)
    kept = torch.sort(by_weight[:nucleus_size(weights_desc, weights.sum(), top_p)]).values
    return ids[kept], vals[kept]


def _top_p(x: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The top-p nucleus of a whole row (x: [V] float32) as (ids ascending, logits), from its top m weights for
    the first m of ``_TOP_P_WIDTHS`` that holds it; None when none does or a logit is not finite."""
    if not bool(torch.isfinite(x).all()):
        return None
    weights = torch.exp(x - x.max())
    total = weights.sum()
    for m in _TOP_P_WIDTHS:
        if m >= x.shape[0]:
            return None
        weights_desc, ids = torch.topk(weights, m)
        keep = nucleus_size(weights_desc, total, top_p)
        if keep < m:  # the (keep + 1)-th is dropped, so are all after it: the nucleus is inside the top m
            ids = torch.sort(ids[:keep]).values
            return ids, x[ids]
    return None


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask to -inf every logit outside the top-k and outside the top-p nucleus.

    Args:
        logits: [V] float32 (already divided by the temperature).
        top_k: keep the k largest (0 or -1 keeps all). top_p: keep the smallest prefix of the sorted
            distribution whose probability reaches top_p (1.0 keeps all); the most likely token always stays.
            This sorts the whole row: the reference ``sample_top_k_top_p`` agrees with.
    Returns:
        [V] float32.
    """
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ids = torch.nonzero(torch.isfinite(logits)).flatten()  # the candidates, in ascending id order
        weights = torch.exp(logits[ids] - logits[ids].max())
        weights_desc, order = torch.sort(weights, descending=True)
        kept = ids[order[:nucleus_size(weights_desc, weights.sum(), top_p)]]
        logits = torch.full_like(logits, float("-inf")).index_copy_(0, kept, logits[kept])
    return logits


def sample_top_k_top_p(x: torch.Tensor, top_k: int, top_p: float, generator: torch.Generator | None) -> int:
    """A token drawn from ``x`` after top-k and top-p (the same token as ``apply_top_k_top_p`` then
    ``draw_masked``).

    Args:
        x: [V] float32 processed logits (after the temperature; -inf for masked tokens).
        top_k: 0 or -1 keeps all. top_p: 1.0 keeps all.
        generator: the request's generator (None: torch's default).
    """
    found = None
    if 0 < top_k < x.shape[0]:
        found = _top_k(x, top_k, top_p)
    elif top_p < 1.0:
        found = _top_p(x, top_p)
    if found is None:  # no top-k or top-p (all tokens are candidates), or a row the reference must decide
        return draw_masked(apply_top_k_top_p(x, top_k, top_p), generator)
    return draw(*found, generator)
