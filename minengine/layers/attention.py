"""Paged attention: write this step's K/V into the block-paged cache, then attend through block tables.

Idea: PagedAttention (Kwon et al., SOSP 2023, section 4.1): the K/V of a request live in fixed-size
blocks anywhere in one big pool; a block table maps its logical blocks to physical ones, and the slot
mapping says where each new token's K/V goes.

Here: ``write_kv``, the backends by name and ``paged_attention``, which runs the step's backend; by default on a
CPU that is "cpu", ``paged_attention_cpu``, the C++ kernel (``layers/cpu_attention.py``) over the plan
``ForwardBatch`` made. The same plan read in PyTorch, gather + SDPA, is the "reference" backend
(``layers/reference_attention.py``): what runs without the kernel, and for prefills too long for it.

The cache may be FP8 (``kv_cache_dtype="fp8"``, ``layers/kv_quant.py``): K/V are then written as float8 e4m3 with
the layer's per-tensor ``k_scale`` / ``v_scale`` and every path below reads them back dequantized.
"""

from __future__ import annotations

import torch

from minengine.layers import cpu_attention, kv_quant
from minengine.layers.reference_attention import paged_attention_reference, prefill_group_sdpa
from minengine.layers.triton_attention import triton_backend
from minengine.worker.forward_batch import ForwardBatch


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Scatter new K/V into the paged cache.

    Args:
        key, value: [T, Hkv, D], one row per new token of the step, in the model's dtype.
        k_cache, v_cache: [num_blocks, block_size, Hkv, D], written in place: the model's dtype, or float8 e4m3fn
            (then ``key / k_scale`` and ``value / v_scale`` are stored, saturated at +-448).
        slot_mapping: [T] int64, ``block_id * block_size + offset`` of each new token.
        k_scale, v_scale: the FP8 cache's per-tensor scales (ignored for another dtype).
    """
    if k_cache.dtype == kv_quant.FP8_DTYPE:  # the FP8 cache's own writer (``layers/kv_quant.py``)
        kv_quant.write_fp8_rows(key, k_cache, slot_mapping, k_scale)
        kv_quant.write_fp8_rows(value, v_cache, slot_mapping, v_scale)
        return
    num_kv_heads, head_dim = key.shape[1], key.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, key)
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, slot_mapping, value)


def paged_attention_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                        v_cache: torch.Tensor, batch: ForwardBatch, scale: float, kernel, k_scale: float = 1.0,
                        v_scale: float = 1.0) -> torch.Tensor:
    """The same plan as ``paged_attention_reference``, with minengine's CPU kernel (``layers/cpu_attention.cpp``)
    for every decode group and every prefill group the kernel is faster on (``cpu_attention.use_kernel``: chunks
    of at most ``MAX_QUERY_LEN`` tokens, or whose keys number at most ``MAX_PREFILL_KEYS``): it reads each
    request's blocks in place through its block table (no gather, no padding). Longer prefills keep SDPA, whose
    blocked kernel wins once a request's keys no longer fit the core's L2 cache. Shapes as in
    ``paged_attention_reference``; ``kernel`` is ``cpu_attention.kernel_for(...)``; an FP8 cache is read by the
    kernel in place, with ``k_scale`` / ``v_scale``."""
    if query.stride(-1) != 1:  # the kernel needs unit-stride head vectors, in query and out alike
        query = query.contiguous()
    out = torch.empty_like(query)
    threads = torch.get_num_threads()
    seq_lens = batch.seq_lens
    for g in batch.decode_groups:  # decodes come first in batch order: row i is request i
        rows = slice(g.first_row, g.first_row + g.num_requests)
        kernel(out[rows], query[rows], k_cache, v_cache, g.block_ids.view(g.num_requests, -1), seq_lens[rows], 1,
               scale, threads, k_scale, v_scale)
    for g in batch.prefill_groups:
        if not cpu_attention.use_kernel(g.q_len, g.seq_len):
            prefill_group_sdpa(out, query, key, value, k_cache, v_cache, g, scale, k_scale, v_scale)
            continue
        rows = slice(g.first_row, g.first_row + g.num_requests * g.q_len)
        kernel(out[rows], query[rows], k_cache, v_cache, g.block_ids.view(g.num_requests, -1),
               torch.full((g.num_requests,), g.seq_len, dtype=torch.int32), g.q_len, scale, threads, k_scale, v_scale)
    return out


def paged_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                    v_cache: torch.Tensor, batch: ForwardBatch, scale: float, k_scale: float = 1.0,
                    v_scale: float = 1.0) -> torch.Tensor:
    """Attention through the backend the step's batch was built for (``batch.attention_backend``: "reference",
    "cpu" or "triton", chosen once by the ``ModelRunner``). Shapes as in ``paged_attention_reference``;
    ``key``/``value`` are the step's rows as computed; ``k_scale``/``v_scale``: an FP8 cache's per-tensor
    scales."""
    return BACKENDS[batch.attention_backend](query, key, value, k_cache, v_cache, batch, scale, k_scale, v_scale)


def _as_cached(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, batch: ForwardBatch,
               k_scale: float, v_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's own K/V as the cache holds them: a prefill from position 0 attends to them directly, so with
    an FP8 cache they are first rounded as the cache rounds them, and every path sees the same keys."""
    if k_cache.dtype == kv_quant.FP8_DTYPE and any(g.from_start for g in batch.prefill_groups):
        return kv_quant.round_trip(key, k_scale), kv_quant.round_trip(value, v_scale)
    return key, value


def _reference_backend(query, key, value, k_cache, v_cache, batch, scale, k_scale, v_scale) -> torch.Tensor:
    key, value = _as_cached(key, value, k_cache, batch, k_scale, v_scale)
    return paged_attention_reference(query, key, value, k_cache, v_cache, batch, scale, k_scale, v_scale)


def _cpu_backend(query, key, value, k_cache, v_cache, batch, scale, k_scale, v_scale) -> torch.Tensor:
    """The C++ kernel (``cpu_attention.kernel_for``: float32/bfloat16, an FP8 cache too); the reference while
    its background build is not ready, where it failed to build, or for a layer it does not take."""
    key, value = _as_cached(key, value, k_cache, batch, k_scale, v_scale)
    kernel = cpu_attention.kernel_for(query, k_cache)
    if kernel is None:
        return paged_attention_reference(query, key, value, k_cache, v_cache, batch, scale, k_scale, v_scale)
    return paged_attention_cpu(query, key, value, k_cache, v_cache, batch, scale, kernel, k_scale, v_scale)


# The backends by name (``EngineConfig.attention_backend``, vLLM's ``--attention-backend``): the ModelRunner
# resolves "auto" once, at construction (``layers/attention_backend.py``), and every step's ForwardBatch carries
# the name. A door may add its own backend here (``worker/compiled_decode.py``).
BACKENDS = {"reference": _reference_backend, "cpu": _cpu_backend, "triton": triton_backend}
