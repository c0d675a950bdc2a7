"""What happens to one request's logits between the model and the draw, when it needs more than an argmax
(``process_logits``): token masks and penalties where the request sets them (``worker/penalties.py``),
``min_tokens``, then (not for greedy requests) temperature, min-p, top-k and top-p (``worker/top_k_top_p.py``).
The ``Sampler`` sends a row here only when its request needs it (``SamplingParams.needs_processing``).

Sources: top-p is nucleus sampling (Holtzman et al., ICLR 2020); min-p (Nguyen et al., 2024).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from minengine.sampling_params import SamplingParams
from minengine.worker.finite import finite_overflow
from minengine.worker.penalties import apply_penalties, apply_token_masks
from minengine.worker.top_k_top_p import apply_top_k_top_p


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Mask to -inf tokens whose probability is below ``min_p`` x the top probability. logits: [V] float32."""
    if min_p <= 0:
        return logits
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p * probs.max(), float("-inf"))


def process_logits(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                   output_ids: Sequence[int]) -> torch.Tensor:
    """Everything between the raw logits and the draw, for one request: min_tokens, penalties, then (not for
    greedy requests) temperature, min-p, top-k and top-p. ``softmax`` of the result is the distribution the
    token is drawn from (greedy takes its argmax). The sampler does the top-k and top-p of
    ``scaled_logits``'s result without sorting the row (``worker/top_k_top_p.py``), with the same result.

    Args:
        logits: [V] float32 raw logits of the position being sampled.
        params: the request's settings (``all_stop_token_ids`` filled by the engine).
        prompt_ids, output_ids: the request's tokens so far (``len(output_ids)`` tokens generated).
    Returns:
        [V] float32.
    """
    logits = scaled_logits(logits, params, prompt_ids, output_ids)
    if params.greedy:
        return logits
    return apply_top_k_top_p(logits, params.top_k, params.top_p)


def scaled_logits(logits: torch.Tensor, params: SamplingParams, prompt_ids: Sequence[int],
                  output_ids: Sequence[int]) -> torch.Tensor:
    """``process_logits`` up to top-k and top-p: token masks, min_tokens, penalties, then (not for greedy
    requests) temperature and min-p. Arguments as ``process_logits``; returns [V] float32."""
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
    return apply_min_p(finite_overflow(logits / params.temperature, logits), params.min_p)
