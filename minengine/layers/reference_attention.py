"""The reference paged attention (``attention_backend="reference"``): each request's new tokens attend to its own
cached keys, read through its block table, in PyTorch (a gather of whole blocks, then SDPA).

It runs where minengine's C++ kernel does not (``MINENGINE_CPU_KERNEL=0``, no compiler, a build still under way,
a layer the kernel does not take) and for the prefill chunks too long for the kernel (``cpu_attention.use_kernel``);
``layers/attention.py`` chooses. The kernel computes the same plan (``ForwardBatch``'s groups) and the same
numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minengine.worker.forward_batch import DecodeGroup, ForwardBatch, PrefillGroup


def paged_attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                              v_cache: torch.Tensor, batch: ForwardBatch, scale: float, k_scale: float = 1.0,
                              v_scale: float = 1.0) -> torch.Tensor:
    """Causal attention of each request's new tokens against its own cached keys, read via its block table.

    The PyTorch path (CPU, or CUDA without Triton), with no block-diagonal mask over the whole batch. It follows
    the plan ``ForwardBatch`` made once for the step (shared by all layers):

    - decodes (one new token) in groups of similar length: each group gathers its requests' KV *blocks*
      (contiguous rows of the cache, not single slots) into one [n, L, Hkv, D] tensor and runs one SDPA call,
      the G query heads of a KV head as G query rows against it (grouped-query attention without copying K/V);
    - prefill chunks in groups of equal (q_len, seq_len), one SDPA call per group, with PyTorch's fused CPU
      kernel (4-D inputs). A prefill from position 0 attends to this step's own K/V rows, which need no gather
      (with an FP8 cache, ``key`` and ``value`` must then be what the cache holds: ``kv_quant.round_trip``).

    With an FP8 cache the gathered blocks are converted to the query's dtype, ``k_scale`` is folded into the
    softmax scale and ``v_scale`` multiplies the output.

    Args:
        query: [T, Hq, D] for all new tokens of the step (request i owns rows
            ``query_start_loc[i]:query_start_loc[i+1]``).
        key, value: [T, Hkv, D], this step's new K/V (already written to the cache too).
        k_cache, v_cache: [num_blocks, block_size, Hkv, D] with this step's K/V already written.
        batch: the step's metadata (``ForwardBatch`` built for a CPU backend: its attention groups).
        scale: softmax scale, usually ``1 / sqrt(D)``.
        k_scale, v_scale: an FP8 cache's per-tensor scales (a stored element times its scale is the true value).

    Returns:
        [T, Hq, D], same dtype as ``query``.
    """
    out = torch.empty_like(query)
    for g in batch.decode_groups:
        _decode_group_sdpa(out, query, k_cache, v_cache, g, scale, k_scale, v_scale)
    for g in batch.prefill_groups:
        prefill_group_sdpa(out, query, key, value, k_cache, v_cache, g, scale, k_scale, v_scale)
    return out


def _gather(cache: torch.Tensor, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The blocks ``block_ids`` of ``cache`` ([n_blocks, block_size, Hkv, D]) in ``dtype`` (an FP8 cache's bytes
    converted, not yet scaled: the scales are applied once per group, on the scores and the output)."""
    blocks = cache.index_select(0, block_ids)
    return blocks.to(dtype) if blocks.dtype != dtype else blocks


def _decode_group_sdpa(out: torch.Tensor, query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       g: DecodeGroup, scale: float, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """One decode group: gather its requests' blocks, then one SDPA call (writes ``out``'s group rows)."""
    num_heads = query.shape[1]
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    n, rows = g.num_requests, slice(g.first_row, g.first_row + g.num_requests)
    # [n * num_blocks, block_size, Hkv, D] -> [n, L, Hkv, D] -> [n, Hkv, L, D] (a view)
    k = _gather(k_cache, g.block_ids, query.dtype).view(n, -1, num_kv_heads, head_dim).transpose(1, 2)
    v = _gather(v_cache, g.block_ids, query.dtype).view(n, -1, num_kv_heads, head_dim).transpose(1, 2)
    q = query[rows].view(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=g.key_mask, scale=scale * k_scale)
    if v_scale != 1.0:
        o = o * v_scale
    out[rows] = o.view(n, num_heads, head_dim)


def prefill_group_sdpa(out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        k_cache: torch.Tensor, v_cache: torch.Tensor, g: PrefillGroup, scale: float,
                        k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """One group of equal-shape prefill chunks, one SDPA call (writes ``out``'s group rows). ``key``/``value``
    are the step's rows in true values; cached blocks are stored ones (times ``k_scale``/``v_scale``)."""
    num_heads = query.shape[1]
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    n, q_len, seq_len = g.num_requests, g.q_len, g.seq_len
    rows = slice(g.first_row, g.first_row + n * q_len)
    q = query[rows].view(n, q_len, num_heads, head_dim)
    if g.from_start:  # prefill from position 0: the keys are this step's own rows
        k = key[rows].view(n, q_len, num_kv_heads, head_dim)
        v = value[rows].view(n, q_len, num_kv_heads, head_dim)
        k_scale = v_scale = 1.0  # true values already
    else:  # a chunk after cached context: gather the requests' blocks, cut to seq_len
        k = _gather(k_cache, g.block_ids, query.dtype).view(n, -1, num_kv_heads, head_dim)[:, :seq_len]
        v = _gather(v_cache, g.block_ids, query.dtype).view(n, -1, num_kv_heads, head_dim)[:, :seq_len]
    # [n, H, len, D]: with a batch dimension SDPA takes PyTorch's fused CPU kernel (several times faster
    # than the 3-D call, and no [len, len] score matrix in memory).
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       attn_mask=g.mask, is_causal=g.mask is None, scale=scale * k_scale,
                                       enable_gqa=num_heads != num_kv_heads)
    if v_scale != 1.0:
        o = o * v_scale
    out[rows] = o.transpose(1, 2).reshape(n * q_len, num_heads, head_dim)
