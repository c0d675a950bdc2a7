"""Sliding-window attention on the paged cache: the step's attention plan with every mask cut to the window.

A windowed layer reads the same blocks as a full-attention layer, through the same reference path
(``layers/reference_attention.py``): only its masks differ. Query position q sees key position k when
``q - window < k <= q`` (transformers' ``sliding_window_overlay``), so ``windowed_batch`` makes, once per step and
window, a copy of the ``ForwardBatch`` whose decode groups' key masks and prefill groups' masks also hide the keys
older than the window, and whose backend is "reference" (the C++ kernel reads every key up to ``seq_len``
unmasked, so a windowed layer never runs it).

Keys outside the window may sit in blocks the windowed KV cache manager already freed
(``core/windowed_kv_cache_manager.py``): their ids stay in the block table, and whatever another request has
written there since is gathered but masked out, never weighed.
"""

from __future__ import annotations

import dataclasses

import torch

from minengine.worker.forward_batch import DecodeGroup, ForwardBatch, PrefillGroup


def windowed_batch(batch: ForwardBatch, window: int) -> ForwardBatch:
    """``batch`` for a layer with a sliding window of ``window`` tokens (the groups' masks cut to it, the
    "reference" backend); the tensors other than the masks are shared, not copied.

    Raises:
        ValueError: a batch built for the Triton kernel (it carries block tables, not the groups a mask is cut
            from; run a windowed model with ``attention_backend="reference"`` on CUDA).
    """
    if batch.attention_backend == "triton":
        raise ValueError("sliding-window attention runs on the 'reference' and 'cpu' attention backends; the "
                         "Triton kernel takes no window: set attention_backend='reference'")
    decode_groups = [_windowed_decode_group(g, batch.seq_lens, window) for g in batch.decode_groups]
    prefill_groups = [_windowed_prefill_group(g, window) for g in batch.prefill_groups]
    return dataclasses.replace(batch, decode_groups=decode_groups, prefill_groups=prefill_groups,
                               attention_backend="reference")


def _windowed_decode_group(g: DecodeGroup, seq_lens: torch.Tensor, window: int) -> DecodeGroup:
    """Each request's one query sits at position ``seq_len - 1`` and sees keys ``seq_len - window ..``."""
    seq_len = seq_lens[g.first_row:g.first_row + g.num_requests].to(torch.long).view(-1, 1, 1, 1)
    keys = torch.arange(g.key_mask.shape[-1], device=g.key_mask.device)
    return dataclasses.replace(g, key_mask=g.key_mask & (keys >= seq_len - window))


def _windowed_prefill_group(g: PrefillGroup, window: int) -> PrefillGroup:
    """The group's queries sit at ``seq_len - q_len .. seq_len - 1``; the mask stays None (SDPA's causal
    triangle) while every query sees all the keys before it anyway."""
    if g.seq_len <= window:
        return g
    device = g.block_ids.device
    query_pos = torch.arange(g.seq_len - g.q_len, g.seq_len, device=device)[:, None]
    keys = torch.arange(g.seq_len, device=device)[None, :]
    return dataclasses.replace(g, mask=(keys <= query_pos) & (keys > query_pos - window))
