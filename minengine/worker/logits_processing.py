"""What happens to one request's logits between the model and the draw, when it needs more than an argmax:
token masks (``allowed_token_ids``, ``bad_words``, ``logit_bias``), ``min_tokens``, the penalties, then (not for
greedy requests) temperature, min-p, top-k and top-p (``process_logits``). The ``Sampler`` sends a row here only
when its request has one of these features.

Sources: top-p is nucleus sampling (Holtzman et al., ICLR 2020); min-p (Nguyen et al., 2024); the repetition
penalty from CTRL (Keskar et al., 2019); presence and frequency penalties as OpenAI's API defines them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minengine.sampling_params import SamplingParams


def finite_overflow(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``y`` (computed elementwise from ``x``) with float32 overflow clamped to the largest finite value where
    ``x`` was finite: a logit divided by a tiny repetition penalty or temperature, or multiplied by a huge
    penalty, would become +-inf, and softmax over +inf is NaN. Where ``x`` is -inf (a masked token) it stays
    -inf (-inf times a penalty that rounds to 0 in float32 would be NaN)."""
    big = torch.finfo(y.dtype).max
    return torch.where(torch.isfinite(x), y.clamp(-big, big), x)


def apply_penalties(logits: torch.Tensor, prompt_ids: Sequence[int], output_ids: Sequence[int],
                    params: SamplingParams) -> torch.Tensor:
    """Repetition penalty over prompt + output tokens, then frequency and presence penalties over the output.

    Args:
        logits: [V] float32 raw logits. prompt_ids, output_ids: the request's tokens so far.
    Returns:
        [V] float32 (a new tensor).
    """
    logits = logits.clone()
    vocab = logits.shape[-1]
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(list(prompt_ids) + list(output_ids), dtype=torch.long).unique()
        seen = seen[seen < vocab]
        x = logits[seen]
        logits[seen] = finite_overflow(torch.where(x > 0, x / params.repetition_penalty,
                                                   x * params.repetition_penalty), x)
    if output_ids and (params.frequency_penalty or params.presence_penalty):
        ids = torch.tensor(list(output_ids), dtype=torch.long)
        counts = torch.bincount(ids[ids < vocab], minlength=vocab).to(logits.dtype)
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def apply_token_masks(logits: torch.Tensor, params: SamplingParams, output_ids: Sequence[int]) -> torch.Tensor:
    """``allowed_token_ids``, ``bad_words`` and ``logit_bias`` of one request, in vLLM's order.

    A bad word of tokens ``w`` is masked at its last token whenever the output ends with ``w[:-1]`` (a
    one-token word always); the logit bias is added to the logits.

    Args:
        logits: [V] float32. output_ids: the request's generated tokens so far.
    Returns:
        [V] float32 (a new tensor).
    """
    vocab = logits.shape[-1]
    if params.allowed_token_ids:
        keep = torch.tensor(params.allowed_token_ids, dtype=torch.long)
        out = torch.full_like(logits, float("-inf"))
        out[keep] = logits[keep]
        logits = out
    else:
        logits = logits.clone()
    if params.bad_words_token_ids:
        n = len(output_ids)
        banned = [w[-1] for w in params.bad_words_token_ids
                  if len(w) <= n + 1 and (len(w) == 1 or list(output_ids[n - len(w) + 1:]) == list(w[:-1]))]
        if banned:
            logits[torch.tensor(banned, dtype=torch.long)] = float("-inf")
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), dtype=torch.long)
        ok = ids < vocab
        logits[ids[ok]] += torch.tensor(list(params.logit_bias.values()), dtype=logits.dtype)[ok]
    return logits


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Mask to -inf tokens whose probability is below ``min_p`` x the top probability. logits: [V] float32."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p * probs.max(), float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask to -inf every logit outside the top-k and outside the top-p nucleus.

    Args:
        logits: [V] float32 (already divided by the temperature).
        top_k: keep the k largest (0 or -1 keeps all). top_p: keep the smallest prefix of the sorted
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


def process_logits(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                   output_ids: Sequence[int]) -> torch.Tensor:
    """Everything between the raw logits and the draw, for one request: min_tokens, penalties, then (not for
    greedy requests) temperature, min-p, top-k and top-p. ``softmax`` of the result is the distribution the
    token is drawn from (greedy takes its argmax).

    Args:
        logits: [V] float32 raw logits of the position being sampled.
        params: the request's settings (``all_stop_token_ids`` filled by the engine).
        prompt_ids, output_ids: the request's tokens so far (``len(output_ids)`` tokens generated).
    Returns:
        [V] float32.
    """
    if params.has_token_masks:
        logits = apply_token_masks(logits, params, output_ids)
    if len(output_ids) < params.min_tokens and params.all_stop_token_ids:
        logits = logits.clone()
        stop = torch.tensor(sorted(params.all_stop_token_ids), dtype=torch.long)
        logits[stop[stop < logits.shape[-1]]] = float("-inf")
    if params.has_penalties:
        logits = apply_penalties(logits, prompt_ids, output_ids, params)
    if params.greedy:
        return logits
    logits = apply_min_p(finite_overflow(logits / params.temperature, logits), params.min_p)
    return apply_top_k_top_p(logits, params.top_k, params.top_p)
