"""Penalties and token masks of one request's logits (``SamplingParams``: ``repetition_penalty``,
``frequency_penalty``, ``presence_penalty``; ``allowed_token_ids``, ``bad_words``, ``logit_bias``), in vLLM's order.
``worker/logits_processing.py`` applies them only to requests that set them.

Sources: the repetition penalty from CTRL (Keskar et al., 2019); presence and frequency penalties as OpenAI's API
defines them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minengine.sampling_params import SamplingParams
from minengine.worker.finite import finite_overflow


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
