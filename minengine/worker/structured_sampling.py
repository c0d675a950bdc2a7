"""The sampler's structured-outputs door: a constrained request's row is masked by its grammar state before it is
sampled (the grammar itself is ``worker/structured_output.py``)."""

from __future__ import annotations

import torch

from minengine.core.scheduler_output import ScheduledRequest


def masked_row(work: torch.Tensor, raw: torch.Tensor, row: int, so, bitmask: torch.Tensor) -> bool:
    """Apply the grammar state ``so``'s mask to row ``row`` of ``work`` (and of ``raw``, the logprobs' logits,
    when it is another tensor), in place; False when the mask allows no token (a dead end of the grammar for
    this vocabulary)."""
    from minengine.worker.structured_output import apply_bitmask

    so.fill_bitmask(bitmask, 0)
    if not bool(bitmask.any()):
        return False
    apply_bitmask(work[row:row + 1], bitmask, [0])
    if raw is not work:
        apply_bitmask(raw[row:row + 1], bitmask, [0])
    return True


def sample_structured(sampler, work: torch.Tensor, raw: torch.Tensor, row: int, s: ScheduledRequest,
                      offset: int) -> int:
    """The token of a structured-output request at ``row``: masked by its grammar state, then sampled as any
    other. A dead end (no token allowed) gives the request's first stop token, which the grammar rejects:
    ``update_from_output`` then finishes the request with "abort" instead of appending it."""
    if sampler.bitmask is None or sampler.bitmask.shape[1] != -(-work.shape[1] // 32):
        from minengine.worker.structured_output import new_bitmask

        sampler.bitmask = new_bitmask(1, work.shape[1])
    if not masked_row(work, raw, row, s.structured_output, sampler.bitmask):
        stops = s.sampling_params.all_stop_token_ids
        return min(stops) if stops else 0
    return sampler.sample_row(work[row], s, offset)
