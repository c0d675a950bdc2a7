"""Lab 6: paged attention's read. Implement the three functions below; the engine then runs every attention
layer of the model through YOUR ``paged_attention``.

The K/V of a request does not live in one tensor: it lives in fixed-size blocks scattered over one big pool
per layer, ``k_cache`` / ``v_cache`` of shape [num_blocks, block_size, Hkv, D]. A request's block table lists
its blocks in order: its token at position p is in block ``block_table[p // block_size]``, slot
``p % block_size``. This step's K/V is already written into the cache before your read runs.

Grade it with ``python -m minengine lab grade paged_attention labs/paged_attention/paged_attention.py``.
"""

from __future__ import annotations

import torch


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, seq_len: int) -> torch.Tensor:
    """One request's first ``seq_len`` keys (or values), in position order, read through its block table.

    Args:
        cache: [num_blocks, block_size, Hkv, D], one layer's K (or V) pool.
        block_table: [max_blocks] int32, the request's block ids in position order (entries past the
            ``ceil(seq_len / block_size)`` blocks it holds are padding, an id past the cache's last block:
            never read them, as a GPU kernel would fault on them).
        seq_len: tokens of the request with K/V in the cache, >= 1.

    Returns:
        [seq_len, Hkv, D]: row p is position p (block ``block_table[p // block_size]``, slot
        ``p % block_size``). The last block is usually only partly filled: its unused slots are not keys.
    """
    raise NotImplementedError("implement gather_kv: index the cache with the first ceil(seq_len / block_size) "
                              "block ids, flatten blocks into positions, keep seq_len rows")


def attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal grouped-query attention of one request's new tokens against all its keys.

    The ``q_len`` new tokens are the request's LAST ``q_len`` positions: query row i sits at position
    ``seq_len - q_len + i`` and may see the keys at positions <= its own (a chunk after cached context sees
    all the context and the causal triangle of the chunk itself).

    Grouped-query attention: with Hq query heads and Hkv key/value heads (Hq a multiple of Hkv), each KV head
    serves ``Hq // Hkv`` consecutive query heads: query head h reads KV head ``h // (Hq // Hkv)``.

    Args:
        query: [q_len, Hq, D].
        keys, values: [seq_len, Hkv, D], positions 0 .. seq_len - 1 (``seq_len >= q_len``).
        scale: multiplies the scores ``q . k`` before the softmax: the model's own (often ``1 / sqrt(D)``,
            not always): use the one given.

    Returns:
        [q_len, Hq, D] in ``query``'s dtype (a bfloat16 model's next layer takes bfloat16; computing in
        float32 inside is fine): softmax(scale * q k^T, masked) v, per head. Scores may be large (hundreds, in
        a sharp head): the softmax must not overflow (``exp`` of a float32 above ~88.7 is inf).
    """
    raise NotImplementedError("implement attend: scores = scale * q.k per head (query head h uses KV head "
                              "h // (Hq // Hkv)), mask keys after each query's position, softmax, weight the values")


def paged_attention(query: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float) -> torch.Tensor:
    """The step's attention: every request's new tokens against its own cached keys.

    Args:
        query: [T, Hq, D], the new tokens of all B requests of the step; request b owns rows
            ``query_start_loc[b] : query_start_loc[b + 1]``.
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], this step's K/V already written.
        block_tables: [B, max_blocks] int32, request b's block ids in row b (padding past its blocks: an id
            past the cache's last block, never to be read).
        seq_lens: [B] int32, tokens of request b with K/V in the cache after this step (context + new).
        query_start_loc: [B + 1] int32, prefix sums of the new tokens per request.
        scale: the softmax scale.

    Returns:
        [T, Hq, D] in ``query``'s dtype, row for row the attention output of ``query``.
    """
    raise NotImplementedError("implement paged_attention: for each request, gather_kv its keys and values "
                              "through its block table, then attend its query rows; write them into the output")
