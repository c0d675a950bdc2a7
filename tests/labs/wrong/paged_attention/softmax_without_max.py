"""A wrong paged attention read. The bug: attend's softmax is exp(scores) / sum(exp(scores)) without first
subtracting each row's largest score: right for small scores, but exp overflows float32 (inf, then inf / inf is
NaN) once a score passes ~88.7, as in a sharp attention head.
"""

from __future__ import annotations

import torch


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One request's first ``seq_len`` keys (or values) in position order: [seq_len, Hkv, D] (see the
    skeleton for the contract)."""
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    blocks = cache.index_select(0, block_table[:num_blocks].long())  # [num_blocks, block_size, Hkv, D]
    return blocks.reshape(num_blocks * block_size, *cache.shape[2:])[:seq_len]


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal grouped-query attention of the last ``q_len`` positions against ``seq_len`` keys:
    [q_len, Hq, D]."""
    q_len, num_heads, _ = query.shape
    seq_len, num_kv_heads, _ = keys.shape
    group = num_heads // num_kv_heads
    k = keys.repeat_interleave(group, dim=1)  # [seq_len, Hq, D]: query head h reads KV head h // group
    v = values.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", query, k) * scale  # [Hq, q_len, seq_len]
    query_pos = torch.arange(seq_len - q_len, seq_len).unsqueeze(1)
    key_pos = torch.arange(seq_len).unsqueeze(0)
    scores = scores.masked_fill(key_pos > query_pos, float("-inf"))  # no key after the query's own position
    weights = torch.exp(scores)  # BUG: no max subtracted first: exp(s) overflows float32 for s > ~88.7
    weights = weights / weights.sum(-1, keepdim=True)
    return torch.einsum("hqk,khd->qhd", weights, v).to(query.dtype)


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
    """Every request's new tokens against its own cached keys: [T, Hq, D] (see the skeleton)."""
    out = torch.empty_like(query)
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        rows = slice(starts[b], starts[b + 1])
        keys = gather_kv(k_cache, block_tables[b], seq_len)
        values = gather_kv(v_cache, block_tables[b], seq_len)
        out[rows] = attend(query[rows], keys, values, scale)
    return out
