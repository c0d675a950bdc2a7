"""Tests for the Triton paged-attention kernel, run on the CPU through the Triton interpreter.

The kernel is compared with a deliberately simple torch reference that gathers each
request's K/V through its block table and applies a causal mask. Sizes are kept tiny
because the interpreter executes every Triton program in Python.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"  # must be set before Triton jits anything

import math

import pytest

pytest.importorskip("triton")

import torch

from minengine.layers.triton_attention import triton_available, triton_paged_attention

BLOCK_SIZE = 16


@pytest.fixture(autouse=True)
def _require_interpreter():
    """Triton fixes interpreted vs. compiled mode when it is first imported in the process."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.zeros, InterpretedFunction):
        pytest.fail(
            "triton was imported before TRITON_INTERPRET=1 was set (by another test module?); "
            "run this file on its own or export TRITON_INTERPRET=1"
        )


# (tokens already in the cache before this step, new tokens this step) per request:
# a fresh prefill, decodes, prefill chunks with prior context (one crossing a block
# boundary, one starting exactly on a boundary) and a request with no new tokens.
MIXED_BATCH = [(0, 5), (20, 1), (17, 6), (0, 1), (10, 0), (32, 3), (40, 1)]


def reference_paged_attention(query, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale):
    """Plain torch reference: per request, gather K/V via the block table, causal mask, softmax."""
    num_q_heads, num_kv_heads = query.shape[1], k_cache.shape[2]
    group = num_q_heads // num_kv_heads
    block_size = k_cache.shape[1]
    out = torch.zeros(query.shape, dtype=torch.float32)
    for i in range(seq_lens.shape[0]):
        start, end = int(query_start_loc[i]), int(query_start_loc[i + 1])
        seq_len, q_len = int(seq_lens[i]), end - start
        if q_len == 0:
            continue
        blocks = block_tables[i, : math.ceil(seq_len / block_size)].long()
        k = k_cache[blocks].reshape(-1, num_kv_heads, k_cache.shape[-1])[:seq_len].float()
        v = v_cache[blocks].reshape(-1, num_kv_heads, v_cache.shape[-1])[:seq_len].float()
        k = k.repeat_interleave(group, dim=1)  # [seq_len, Hq, D]
        v = v.repeat_interleave(group, dim=1)
        q = query[start:end].float()  # [q_len, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        q_pos = torch.arange(seq_len - q_len, seq_len)[:, None]
        k_pos = torch.arange(seq_len)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
    return out


def make_batch(requests, num_q_heads, num_kv_heads, head_dim, dtype=torch.float32, pad_value=None, seed=0):
    """Build a paged KV cache and step inputs for ``requests`` = [(context_len, q_len), ...].

    Physical blocks are handed out in a shuffled order. Every cache slot that holds no
    real token, and an extra "poison" block, are filled with NaN: if the kernel ever
    reads an unused slot or a padding entry of the block table (which point at the
    poison block unless ``pad_value`` is given), the output turns NaN.
    """
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [ctx + q_len for ctx, q_len in requests]
    blocks_per_req = [math.ceil(s / BLOCK_SIZE) for s in seq_lens]
    max_blocks = max(blocks_per_req) + 1  # at least one padding column for every request
    num_blocks = sum(blocks_per_req) + 1  # + the poison block
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    poison = perm.pop()

    shape = (num_blocks, BLOCK_SIZE, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    block_tables = torch.full(
        (len(requests), max_blocks), poison if pad_value is None else pad_value, dtype=torch.int32
    )
    for i, (seq_len, n_blocks) in enumerate(zip(seq_lens, blocks_per_req, strict=True)):
        for logical in range(n_blocks):
            physical = perm.pop()
            block_tables[i, logical] = physical
            used = min(BLOCK_SIZE, seq_len - logical * BLOCK_SIZE)  # the last block may be partial
            k_cache[physical, :used] = torch.randn(used, num_kv_heads, head_dim, generator=gen).to(dtype)
            v_cache[physical, :used] = torch.randn(used, num_kv_heads, head_dim, generator=gen).to(dtype)

    q_lens = [q_len for _, q_len in requests]
    query_start_loc = torch.tensor([0, *q_lens], dtype=torch.int32).cumsum(0).to(torch.int32)
    query = torch.randn(sum(q_lens), num_q_heads, head_dim, generator=gen).to(dtype)
    return query, k_cache, v_cache, block_tables, query_start_loc, torch.tensor(seq_lens, dtype=torch.int32)


def test_triton_available_under_interpreter():
    assert triton_available()


@pytest.mark.parametrize(
    "num_q_heads,num_kv_heads,head_dim",
    [(4, 2, 32), (8, 1, 80)],
    ids=["gqa4-2_d32", "mqa8-1_d80"],
)
def test_mixed_prefill_and_decode_matches_reference(num_q_heads, num_kv_heads, head_dim):
    inputs = make_batch(MIXED_BATCH, num_q_heads, num_kv_heads, head_dim)
    scale = head_dim**-0.5
    out = triton_paged_attention(*inputs, scale)
    ref = reference_paged_attention(*inputs, scale)
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert not out.isnan().any(), "kernel read an unused cache slot or a padding block-table entry"
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


def test_negative_padding_and_strided_query():
    """-1 padding in the block table and a query that is a non-contiguous view (as out of a fused QKV)."""
    requests = [(3, 2), (16, 1)]
    query, k_cache, v_cache, block_tables, qsl, seq_lens = make_batch(requests, 4, 2, 32, pad_value=-1, seed=1)
    qkv = torch.randn(query.shape[0], 3 * 4, 32)
    qkv[:, :4] = query
    strided_query = qkv[:, :4]
    assert not strided_query.is_contiguous()
    out = triton_paged_attention(strided_query, k_cache, v_cache, block_tables, qsl, seq_lens, 0.2)
    ref = reference_paged_attention(query, k_cache, v_cache, block_tables, qsl, seq_lens, 0.2)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_output_dtype(dtype):
    requests = [(5, 2), (18, 1)]
    inputs = make_batch(requests, 2, 1, 32, dtype=dtype, seed=2)
    out = triton_paged_attention(*inputs, 32**-0.5)
    ref = reference_paged_attention(*inputs, 32**-0.5)
    assert out.dtype == dtype
    tol = 1e-2 if dtype == torch.float16 else 3e-2
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)


def test_empty_step_returns_empty():
    query, k_cache, v_cache, block_tables, qsl, seq_lens = make_batch([(4, 0)], 2, 1, 32)
    out = triton_paged_attention(query, k_cache, v_cache, block_tables, qsl, seq_lens, 1.0)
    assert out.shape == (0, 2, 32)


def test_module_imports_without_triton(monkeypatch):
    """The module must import (and report unavailability) on machines without Triton."""
    import importlib.util
    import sys

    import minengine.layers.triton_attention as module

    monkeypatch.setitem(sys.modules, "triton", None)  # makes `import triton` raise ImportError
    monkeypatch.setitem(sys.modules, "triton.language", None)
    spec = importlib.util.spec_from_file_location("_triton_attention_without_triton", module.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    assert not fresh.triton_available()
    with pytest.raises(RuntimeError, match="needs Triton"):
        fresh.triton_paged_attention(*make_batch([(0, 1)], 2, 1, 32), 1.0)
