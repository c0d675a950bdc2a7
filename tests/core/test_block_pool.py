"""BlockPool: ref counts, LRU free queue, hash index and eviction."""

import pytest

from minengine.core.block_pool import BlockPool


def test_allocate_and_free_in_lru_order():
    pool = BlockPool(4)
    a = pool.get_new_blocks(2)
    assert [b.block_id for b in a] == [0, 1] and pool.num_free_blocks == 2
    pool.free_blocks([a[1], a[0]])  # freed tail first
    assert pool.num_free_blocks == 4
    # Never-used blocks 2, 3 come first, then 1 (freed first), then 0.
    assert [b.block_id for b in pool.get_new_blocks(4)] == [2, 3, 1, 0]


def test_cached_block_survives_free_until_reused():
    pool = BlockPool(2)
    (blk,) = pool.get_new_blocks(1)
    pool.cache_full_block(blk, b"h")
    pool.free_blocks([blk])
    assert pool.get_cached_block(b"h") is blk and pool.num_cached_free_blocks == 1
    pool.touch([blk])  # a prefix hit revives it
    assert blk.ref_cnt == 1 and pool.num_free_blocks == 1
    pool.free_blocks([blk])
    pool.get_new_blocks(2)  # reuse evicts: the hash entry is dropped
    assert pool.get_cached_block(b"h") is None and blk.block_hash is None


def test_shared_block_ref_counts():
    pool = BlockPool(3)
    (blk,) = pool.get_new_blocks(1)
    pool.touch([blk])
    assert blk.ref_cnt == 2
    pool.free_blocks([blk])
    assert not pool.is_free(blk)
    pool.free_blocks([blk])
    assert pool.is_free(blk)
    with pytest.raises(RuntimeError):
        pool.free_blocks([blk])


def test_over_allocation_raises():
    pool = BlockPool(2)
    with pytest.raises(ValueError):
        pool.get_new_blocks(3)
    with pytest.raises(ValueError, match="num_kv_blocks"):
        BlockPool(0)
