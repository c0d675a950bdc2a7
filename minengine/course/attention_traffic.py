"""The HBM bytes and FLOPs of one head's attention, kernel by kernel: the counts chapter 11 derives on toy kernels.

Every count is for one (KV) head and assumes no cache between the kernel and HBM keeps anything, so a re-read is
paid again; a real GPU's L2 absorbs part of the re-reads. Chapter 11 checks each formula against a toy kernel that
counts the bytes it loads and stores; chapter 8 quotes the same numbers. Sources: Dao et al., *FlashAttention*,
NeurIPS 2022 (the IO analysis of standard vs tiled attention); Ainslie et al., *GQA*, EMNLP 2023 (query heads
sharing a KV head).
"""

from __future__ import annotations

import math

DEFAULT_BLOCK_SIZE = 16  # tokens per KV block, the engine's default (EngineConfig.block_size)


def dense_bytes(n: int, c: int, d: int, b: int = 2) -> int:
    """Bytes dense attention moves for ``n`` queries over ``c`` keys, head dim ``d``, ``b`` bytes per element:
    Q, K, V and O cross once each, and the ``n x c`` scores S and probabilities P are each written and read back.
    """
    return b * (2 * n * d + 2 * c * d + 4 * n * c)


def gather_bytes(c: int, d: int, b: int = 2, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Bytes of gathering the K and V of ``c`` tokens of one KV head from a paged cache into a contiguous copy:
    whole ``block_size``-token blocks read, ``c`` tokens written, for K and for V."""
    return 2 * b * d * (math.ceil(c / block_size) * block_size + c)


def flash_bytes(n: int, c: int, d: int, q_tile: int, group: int = 1, b: int = 2,
                block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    """Bytes tiled (FlashAttention-style) attention moves for one KV head: Q and O of its ``group`` query heads
    once, and for each tile of ``q_tile`` query positions (the last ``n`` of ``c``, causal) the K/V blocks up to
    the tile's last position, read once for the whole group (GQA packing). ``q_tile = 1, group = 1`` is one
    query of one head per program.
    """
    kv = sum(min(c, math.ceil((c - n + min(t0 + q_tile, n)) / block_size) * block_size) for t0 in range(0, n, q_tile))
    return b * (2 * n * d * group + 2 * d * kv)


def attention_flops(n: int, c: int, d: int, heads: int) -> int:
    """FLOPs of causal attention of the last ``n`` of ``c`` positions over ``heads`` query heads: 4 d per
    (query, visible key) pair and head, 2 d for the score and 2 d for the weighted value."""
    return 4 * d * heads * (n * (c - n) + n * (n + 1) // 2)
