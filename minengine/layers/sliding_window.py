"""Sliding-window attention on the paged cache: the step's attention plan cut to a layer's window.

Query position q sees key position k when ``q - window < k <= q`` (transformers' ``sliding_window_overlay``).
``windowed_batch`` makes, once per step and window, a copy of the ``ForwardBatch`` for the windowed layers: a
decode gathers only the blocks its window covers (a bounded number, however long the request), a prefill chunk the
blocks from the one its first query's window starts in, and every mask also hides the keys older than the window.
Its backend is "reference" (``layers/reference_attention.py``), which reads exactly these groups and masks (the
C++ kernel reads every key up to ``seq_len`` unmasked, so a windowed layer never runs it).

Keys outside the window may sit in blocks the windowed KV cache manager already freed
(``core/windowed_kv_cache_manager.py``): their ids stay in the block table, and whatever another request has
written there since is masked out where it is gathered at all (a short decode padded to its group's width may
gather a few blocks before its window).
"""

from __future__ import annotations

import dataclasses

import torch

from minengine.worker.forward_batch import DecodeGroup, ForwardBatch, PrefillGroup


def windowed_batch(batch: ForwardBatch, window: int) -> ForwardBatch:
    """``batch`` for a layer with a sliding window of ``window`` tokens (the decode groups' blocks and the groups'
    masks cut to it, the "reference" backend); the batch's own tensors are shared, not copied.

    Raises:
        ValueError: a batch built for the Triton kernel (it carries block tables, not the groups a mask is cut
            from; run a windowed model with ``attention_backend="reference"`` on CUDA).
    """
    if batch.attention_backend == "triton":
        raise ValueError("sliding-window attention runs on the 'reference' and 'cpu' attention backends; the "
                         "Triton kernel takes no window: set attention_backend='reference'")
    decode_groups = [_windowed_decode_group(g, batch.seq_lens, window, batch.block_size)
                     for g in batch.decode_groups]
    prefill_groups = [_windowed_prefill_group(g, window, batch.block_size) for g in batch.prefill_groups]
    return dataclasses.replace(batch, decode_groups=decode_groups, prefill_groups=prefill_groups,
                               attention_backend="reference")


def _windowed_decode_group(g: DecodeGroup, seq_lens: torch.Tensor, window: int, block_size: int) -> DecodeGroup:
    """Each request's one query sits at position ``seq_len - 1`` and reads keys ``seq_len - window ..``: the group
    gathers only the blocks holding those, ``1 + ceil((window - 1) / block_size)`` per request at most however
    long the request is, instead of its whole table."""
    n = g.num_requests
    seq_len = seq_lens[g.first_row:g.first_row + n].to(torch.long)
    width = min(g.num_blocks, 1 + -(-(window - 1) // block_size))
    # each request's first block read, moved back where a short request would run past the group's table
    first = torch.clamp((seq_len - window) // block_size, min=0).clamp(max=g.num_blocks - width)
    columns = first[:, None] + torch.arange(width, device=first.device)  # [n, width] logical block indices
    block_ids = g.block_ids.view(n, g.num_blocks).gather(1, columns).reshape(-1)
    keys = (columns[:, :, None] * block_size + torch.arange(block_size, device=first.device)).view(n, -1)
    key_mask = (keys < seq_len[:, None]) & (keys >= seq_len[:, None] - window)
    return DecodeGroup(first_row=g.first_row, num_requests=n, block_ids=block_ids, num_blocks=width,
                       key_mask=key_mask.view(n, 1, 1, -1))


def _windowed_prefill_group(g: PrefillGroup, window: int, block_size: int) -> PrefillGroup:
    """The group's queries sit at ``seq_len - q_len .. seq_len - 1``: a chunk after cached context gathers its
    blocks from the one holding the oldest key its first query reads; the mask stays None (SDPA's causal
    triangle) while every query sees all the keys before it anyway."""
    if g.seq_len <= window:
        return g
    n, start = g.num_requests, g.seq_len - g.q_len
    first = max(0, start - window + 1) // block_size  # 0 from position 0: the keys are the step's own rows
    table_width = g.block_ids.numel() // n
    # the reference reads the gathered keys up to seq_len: from block `first` on, fewer than seq_len when first > 0
    num_keys = min((table_width - first) * block_size, g.seq_len)
    device = g.block_ids.device
    query_pos = torch.arange(start, g.seq_len, device=device)[:, None]
    key_pos = first * block_size + torch.arange(num_keys, device=device)[None, :]
    return dataclasses.replace(g, block_ids=g.block_ids.view(n, table_width)[:, first:].reshape(-1),
                               mask=(key_pos <= query_pos) & (key_pos > query_pos - window))
