"""Paged attention over a block-table KV cache, written as a Triton kernel.

This is the teaching version of the attention kernel used by the engine. It
combines two ideas:

* **PagedAttention** (Kwon et al., "Efficient Memory Management for Large
  Language Model Serving with PagedAttention", SOSP 2023): the KV cache is a
  pool of fixed-size physical blocks, and each request owns a *block table*
  mapping its logical blocks (token ``t`` lives in logical block
  ``t // block_size``) to physical block ids. The kernel walks that table
  instead of assuming the keys and values of a sequence are contiguous.
* **Online softmax** as in FlashAttention (Dao et al., "FlashAttention: Fast
  and Memory-Efficient Exact Attention with IO-Awareness", NeurIPS 2022; the
  running-max trick goes back to Milakov & Gimelshein, 2018): the softmax over
  all keys is computed in a single pass over the KV blocks, keeping only a
  running maximum, a running normaliser and a running weighted sum of values,
  so the full row of attention scores is never materialised.

One kernel handles a whole *mixed* step: prefill chunks (many new tokens,
possibly with context already in the cache) and decodes (one new token) are
flattened into a single ``[T, Hq, D]`` query tensor, and ``query_start_loc``
says which rows belong to which request.

An FP8 KV cache (``kv_cache_dtype="fp8"``, ``layers/kv_quant.py``) is read as
it is: each float8 tile is converted to float32 as it is loaded, the
per-tensor ``k_scale`` folded into the query and ``v_scale`` into the final
normalisation.

Triton is imported lazily, on the first call of :func:`triton_available` or
:func:`triton_paged_attention`, so ``import minengine.layers.triton_attention``
works on machines without Triton. To run the kernel on a CPU, set the
environment variable ``TRITON_INTERPRET=1`` before Triton is first imported in
the process: Triton fixes compiled vs. interpreted mode at import time.
"""

from __future__ import annotations

import os

import torch

__all__ = ["triton_available", "triton_paged_attention"]

# Filled in by _import_triton() on first use. ``tl`` must be a module global:
# the kernel body below refers to it, and Triton resolves it from the
# function's globals when the kernel is compiled or interpreted.
triton = None
tl = None
_KERNEL = None


def _interpreter_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _import_triton() -> bool:
    """Import Triton on first use; return False when it is not installed."""
    global triton, tl
    if triton is None:
        try:
            import triton as _triton
            import triton.language as _tl
        except ImportError:
            return False
        triton, tl = _triton, _tl
    return True


def triton_available() -> bool:
    """Return True when the Triton kernel can run here.

    That needs Triton to be importable and either a CUDA device or the Triton
    CPU interpreter (environment variable ``TRITON_INTERPRET=1``).
    """
    if not (torch.cuda.is_available() or _interpreter_requested()):
        return False  # checked first, so Triton is not imported in a mode we cannot use
    return _import_triton()


# ---------------------------------------------------------------------------
# The kernel.
#
# It is a plain Python function, handed to ``triton.jit`` on first use (see
# _get_kernel) so that this module does not need Triton at import time. The
# ``tl.constexpr`` annotations are plain strings here (``from __future__
# import annotations``), which Triton understands.
# ---------------------------------------------------------------------------
def _paged_attention_kernel(
    out_ptr,  # [T, Hq, D], query dtype
    q_ptr,  # [T, Hq, D]
    k_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    v_cache_ptr,  # [num_blocks, block_size, Hkv, D]
    block_tables_ptr,  # [B, max_blocks_per_seq] int32
    query_start_loc_ptr,  # [B + 1] int32
    seq_lens_ptr,  # [B] int32
    token_to_req_ptr,  # [T] int32: which request owns each query row
    scale,  # float: softmax scale times k_scale (a stored key times k_scale is the true key)
    v_scale,  # float: a stored value times v_scale is the true value
    stride_qt,
    stride_qh,
    stride_qd,
    stride_ot,
    stride_oh,
    stride_od,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_bt_req,
    stride_bt_blk,
    HEAD_DIM: tl.constexpr,  # D, any positive integer
    BLOCK_D: tl.constexpr,  # next power of two >= D (tl.arange needs a power of two)
    BLOCK_SIZE: tl.constexpr,  # tokens per KV-cache block (a power of two)
    QUERIES_PER_KV: tl.constexpr,  # Hq // Hkv (grouped-query attention)
):
    # ---- Which (query token, query head) is this program responsible for?
    token = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // QUERIES_PER_KV  # GQA: a group of query heads shares one KV head

    # ---- Locate the token inside its request.
    req = tl.load(token_to_req_ptr + token)
    q_start = tl.load(query_start_loc_ptr + req)
    q_end = tl.load(query_start_loc_ptr + req + 1)
    seq_len = tl.load(seq_lens_ptr + req)  # cached tokens, this step's included
    q_len = q_end - q_start
    # The q_len new tokens are the last q_len tokens of the sequence.
    position = seq_len - q_len + (token - q_start)
    # Causal attention: keys at positions 0..position, i.e. position + 1 keys.
    num_keys = position + 1

    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM  # masks the padding lanes when D is not a power of two
    offs_s = tl.arange(0, BLOCK_SIZE)  # slot index inside a KV block

    # ---- Load this token's query vector once; fold the softmax scale into it.
    q = tl.load(q_ptr + token * stride_qt + head * stride_qh + offs_d * stride_qd, mask=d_mask, other=0.0)
    q = q.to(tl.float32) * scale  # [BLOCK_D], float32

    # ---- Online-softmax state (FlashAttention): running max m, running
    # normaliser l = sum(exp(s - m)) and running numerator acc = sum(exp(s - m) * v).
    m_i = tl.full([], float("-inf"), dtype=tl.float32)
    l_i = tl.full([], 0.0, dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)

    # ---- Walk the logical KV blocks of the request through its block table.
    # Only blocks holding at least one key in 0..position are visited, so
    # padding entries of the block table are never read.
    num_blocks = tl.cdiv(num_keys, BLOCK_SIZE)
    for logical_block in range(num_blocks):
        # Logical -> physical block id (int64: cache offsets can exceed 2**31).
        table_entry = block_tables_ptr + req * stride_bt_req + logical_block * stride_bt_blk
        physical_block = tl.load(table_entry).to(tl.int64)

        key_pos = logical_block * BLOCK_SIZE + offs_s  # [BLOCK_SIZE] token positions
        key_mask = key_pos < num_keys  # causal mask (also hides slots past seq_len)
        tile_mask = key_mask[:, None] & d_mask[None, :]  # [BLOCK_SIZE, BLOCK_D]

        # Gather the K and V tiles of this block: [BLOCK_SIZE, BLOCK_D].
        k_offs = (
            physical_block * stride_kb + offs_s[:, None] * stride_ks + kv_head * stride_kh + offs_d[None, :] * stride_kd
        )
        v_offs = (
            physical_block * stride_vb + offs_s[:, None] * stride_vs + kv_head * stride_vh + offs_d[None, :] * stride_vd
        )
        k = tl.load(k_cache_ptr + k_offs, mask=tile_mask, other=0.0).to(tl.float32)
        v = tl.load(v_cache_ptr + v_offs, mask=tile_mask, other=0.0).to(tl.float32)

        # Scores of this token against the keys of the block: [BLOCK_SIZE].
        s = tl.sum(q[None, :] * k, axis=1)
        s = tl.where(key_mask, s, float("-inf"))

        # Online softmax update. Every visited block holds at least one
        # unmasked key, so m_new is finite and exp(-inf - m_new) = 0 is safe.
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp(m_i - m_new)  # rescales the old state to the new max
        p = tl.exp(s - m_new)  # [BLOCK_SIZE] unnormalised probabilities
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new

    # ---- Normalise (and undo the values' FP8 scale) and write out in the output dtype.
    out = acc * (v_scale / l_i)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + offs_d * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=d_mask,
    )


def _get_kernel():
    """Return the jitted kernel, importing Triton and jitting on first use."""
    global _KERNEL
    if _KERNEL is None:
        if not _import_triton():
            raise RuntimeError("triton_paged_attention needs Triton, which is not installed")
        _KERNEL = triton.jit(_paged_attention_kernel)
    return _KERNEL


def triton_paged_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Causal attention of a mixed prefill/decode batch against a paged KV cache.

    Args:
        query: ``[T, Hq, D]`` float32 / float16 / bfloat16. The new tokens of
            the whole step; request ``i`` owns rows
            ``query_start_loc[i]:query_start_loc[i + 1]``. May be a strided view.
        k_cache: ``[num_blocks, block_size, Hkv, D]``, same dtype as ``query``,
            or float8 e4m3fn (an FP8 cache: stored values times ``k_scale``).
            ``Hq`` must be a multiple of ``Hkv``; query head ``h`` reads KV head
            ``h // (Hq // Hkv)`` (grouped-query attention). ``block_size`` must
            be a power of two.
        v_cache: ``[num_blocks, block_size, Hkv, D]``, the dtype of ``k_cache``.
        block_tables: ``[B, max_blocks_per_seq]`` int32. Row ``i`` lists the
            physical block ids of request ``i`` in logical order; entries past
            ``ceil(seq_lens[i] / block_size)`` are padding and never read.
        query_start_loc: ``[B + 1]`` int32 cumulative offsets into ``query``,
            with ``query_start_loc[0] == 0`` and ``query_start_loc[B] == T``.
        seq_lens: ``[B]`` int32. Tokens of request ``i`` whose K/V is in the
            cache, this step's new tokens included (they must already be
            written). The ``q_len`` new tokens sit at positions
            ``seq_len - q_len + j``; a query at position ``p`` attends to
            positions ``0..p`` of its own request.
        scale: softmax scale, usually ``1 / sqrt(D)``.
        k_scale, v_scale: an FP8 cache's per-tensor scales (1.0 otherwise).

    Returns:
        ``[T, Hq, D]`` tensor in ``query.dtype`` (accumulation is float32).

    The kernel runs one program per (query token, query head) and visits the
    token's KV blocks through the block table with an online softmax
    (PagedAttention, Kwon et al., SOSP 2023; FlashAttention, Dao et al., 2022).
    Preconditions that would need a device sync to check (``q_len <= seq_len``,
    block ids in range, ``query_start_loc[B] == T``) are not verified.
    """
    kernel = _get_kernel()
    if query.dim() != 3 or k_cache.dim() != 4 or v_cache.dim() != 4:
        raise ValueError("expected query [T, Hq, D] and k_cache / v_cache [num_blocks, block_size, Hkv, D]")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (query.dtype, torch.float8_e4m3fn):
        raise ValueError(f"dtype mismatch: query {query.dtype}, k_cache {k_cache.dtype}, v_cache {v_cache.dtype} "
                         "(the caches must have the query's dtype or be float8_e4m3fn)")
    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"unsupported dtype {query.dtype}")
    num_tokens, num_q_heads, head_dim = query.shape
    _, block_size, num_kv_heads, kv_head_dim = k_cache.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"head dim mismatch: query {head_dim}, cache {kv_head_dim}")
    if num_q_heads % num_kv_heads != 0:
        raise ValueError(f"Hq={num_q_heads} is not a multiple of Hkv={num_kv_heads}")
    if block_size <= 0 or block_size & (block_size - 1) != 0:
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    if block_tables.dim() != 2 or query_start_loc.dim() != 1 or seq_lens.dim() != 1:
        raise ValueError("expected block_tables [B, max_blocks], query_start_loc [B + 1], seq_lens [B]")
    num_reqs = seq_lens.shape[0]
    if query_start_loc.shape[0] != num_reqs + 1 or block_tables.shape[0] != num_reqs:
        raise ValueError("block_tables, query_start_loc and seq_lens disagree on the number of requests")

    out = torch.empty((num_tokens, num_q_heads, head_dim), dtype=query.dtype, device=query.device)
    if num_tokens == 0:
        return out

    query_start_loc = query_start_loc.to(torch.int32).contiguous()
    seq_lens = seq_lens.to(torch.int32).contiguous()
    block_tables = block_tables.to(torch.int32)
    # Row -> request map, computed on the device without a host sync: the
    # request owning row t is the number of request ends <= t.
    rows = torch.arange(num_tokens, dtype=torch.int32, device=query.device)
    token_to_req = torch.searchsorted(query_start_loc[1:], rows, right=True, out_int32=True)

    grid = (num_tokens, num_q_heads)
    kernel[grid](
        out,
        query,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        token_to_req,
        float(scale) * float(k_scale),
        float(v_scale),
        query.stride(0),
        query.stride(1),
        query.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_cache.stride(3),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        v_cache.stride(3),
        block_tables.stride(0),
        block_tables.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        QUERIES_PER_KV=num_q_heads // num_kv_heads,
    )
    return out


def triton_backend(query, key, value, k_cache, v_cache, batch, scale, k_scale, v_scale) -> torch.Tensor:
    """``paged_attention``'s "triton" backend (``layers/attention.py``): the kernel over a ``ForwardBatch``
    built for it (its ``block_tables``). ``key`` / ``value`` are unused: the kernel reads the cache only."""
    return triton_paged_attention(query, k_cache, v_cache, batch.block_tables, batch.query_start_loc,
                                  batch.seq_lens, scale, k_scale, v_scale)
