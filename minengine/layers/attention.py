"""Paged attention: write this step's K/V into the block-paged cache, then attend through block tables.

Idea: PagedAttention (Kwon et al., SOSP 2023, section 4.1): the K/V of a request live in fixed-size
blocks anywhere in one big pool; a block table maps its logical blocks to physical ones, and the slot
mapping says where each new token's K/V goes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minengine.worker.forward_batch import ForwardBatch


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V into the paged cache.

    Args:
        key, value: [T, Hkv, D], one row per new token of the step.
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], written in place.
        slot_mapping: [T] int64, ``block_id * block_size + offset`` of each new token.
    """
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def paged_attention_reference(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                              batch: ForwardBatch, scale: float) -> torch.Tensor:
    """Causal attention of each request's new tokens against its own cached keys, read via its block table.

    A clear PyTorch reference with no block-diagonal mask over the batch: requests with one new token (decodes)
    are attended together, each against its own keys gathered through its block table (padding masked out);
    requests with a prefill chunk are attended one at a time with a causal mask offset by their context.

    Args:
        query: [T, Hq, D] for all new tokens of the step (request i owns rows
            ``query_start_loc[i]:query_start_loc[i+1]``).
        k_cache, v_cache: [num_blocks, block_size, Hkv, D] with this step's K/V already written.
        batch: the step's metadata (``ForwardBatch``).
        scale: softmax scale, usually ``1 / sqrt(D)``.

    Returns:
        [T, Hq, D], same dtype as ``query``.
    """
    out = torch.empty_like(query)
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    gqa = query.shape[1] != num_kv_heads
    k_flat = k_cache.view(-1, num_kv_heads, head_dim)  # one row per slot
    v_flat = v_cache.view(-1, num_kv_heads, head_dim)

    rows = batch.single_query_rows
    if rows.numel():
        # Keys of each single-token request, gathered through its block table: [N, L, Hkv, D] (index_select on
        # the flat slot view is much faster than fancy indexing on CPU), viewed as [N, Hkv, L, D].
        n, length = batch.single_query_slots.shape
        flat_slots = batch.single_query_slots.reshape(-1)
        k = k_flat.index_select(0, flat_slots).view(n, length, num_kv_heads, head_dim).transpose(1, 2)
        v = v_flat.index_select(0, flat_slots).view(n, length, num_kv_heads, head_dim).transpose(1, 2)
        # Grouped-query attention: the G query heads that share a KV head become G query rows against it.
        group = query.shape[1] // num_kv_heads
        q = query[rows].view(n, num_kv_heads, group, head_dim)
        mask = batch.single_query_mask[:, None, None, :]  # [N, 1, 1, L]: a request sees only its own keys
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        out[rows] = o.reshape(n, num_kv_heads * group, head_dim)

    starts = batch.query_start_loc_list
    block_size = k_cache.shape[1]
    for i in batch.multi_query_requests:
        seq_len = batch.seq_lens_list[i]
        q_start, q_end = starts[i], starts[i + 1]
        q_len = q_end - q_start
        blocks = batch.block_tables_list[i][:-(-seq_len // block_size)]
        # Gather this request's K/V through its block table: [seq_len, Hkv, D].
        k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
        v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:seq_len]
        q = query[q_start:q_end]
        if q_len == seq_len:
            mask, causal = None, True  # a prefill from position 0: the plain causal triangle
        else:
            # A chunk after cached context: query j sits at position seq_len - q_len + j.
            q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
            mask, causal = torch.arange(seq_len, device=query.device)[None, :] <= q_pos[:, None], False
        # [1, H, len, D]: with a batch dimension SDPA takes PyTorch's fused CPU kernel (several times faster
        # than the 3-D call, and no [len, len] score matrix in memory).
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                           attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=gqa)
        out[q_start:q_end] = o[0].transpose(0, 1)
    return out


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch,
                    scale: float) -> torch.Tensor:
    """Dispatch: the Triton kernel on CUDA (when triton is installed), the PyTorch reference elsewhere.
    Shapes as in ``paged_attention_reference``."""
    if query.is_cuda:
        from minengine.layers.triton_attention import triton_available, triton_paged_attention

        if triton_available():
            return triton_paged_attention(query, k_cache, v_cache, batch.block_tables, batch.query_start_loc,
                                          batch.seq_lens, scale)
    return paged_attention_reference(query, k_cache, v_cache, batch, scale)
