"""Lab 1: the KV block pool. Write the part of the engine that hands out KV cache blocks.

The KV cache is cut into ``num_blocks`` fixed-size blocks (PagedAttention). A request holds a list of blocks (its
block table); this pool owns them all and keeps three things straight:

- **ref counts**: ``block.ref_cnt`` is how many block tables hold the block (two requests sharing a cached
  prefix hold the same block: ref count 2). A block with ref count 0 is free.
- **the free queue**, in LRU order: a block joins its tail when its ref count drops to 0; ``get_new_blocks``
  takes from its head, so the block freed longest ago is reused first.
- **the prefix-cache index** ``hash -> block``: a full block's content hash. A free block keeps its hash (its
  K/V is still there and a later request with the same prefix may take it back with ``touch``) until it is
  handed out again by ``get_new_blocks``: then its hash is dropped from the index (evicted).

    free queue (head = least recently freed)        index
    [ 7 | 2 (cached h1) | 5 | 0 (cached h2) ]        h1 -> 2, h2 -> 0, h3 -> 4 (block 4 in use, ref 2)

Grade: ``python -m minengine lab grade block_pool labs/block_pool/block_pool.py``. Run the engine on it:
``LLM(labs={"block_pool": "labs/block_pool/block_pool.py"})``.
"""

from __future__ import annotations

from minengine.core.block_pool import KVBlock  # block_id, ref_cnt (0), block_hash (None): use it as it is


class BlockPool:
    """All ``num_blocks`` blocks, the free queue in LRU order and the prefix-cache index ``hash -> block``.

    Attributes (the engine reads them):
        num_blocks: the number of blocks.
        blocks: ``blocks[i]`` is the ``KVBlock`` with ``block_id == i``, for i in 0..num_blocks-1.

    Raises:
        ValueError: ``num_blocks < 1``.
    """

    def __init__(self, num_blocks: int):
        raise NotImplementedError("implement BlockPool.__init__: make num_blocks KVBlocks, all free, queued by id")

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0 (cached or not): what ``get_new_blocks`` may hand out."""
        raise NotImplementedError("implement num_free_blocks: the length of the free queue")

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a hash (reusable by ``touch`` until evicted)."""
        raise NotImplementedError("implement num_cached_free_blocks: free blocks whose block_hash is not None")

    def is_free(self, block: KVBlock) -> bool:
        """Whether ``block`` is in the free queue."""
        raise NotImplementedError("implement is_free: is the block's id in the free queue?")

    def get_cached_block(self, block_hash: bytes) -> KVBlock | None:
        """The block indexed under ``block_hash`` (free or in use), or None."""
        raise NotImplementedError("implement get_cached_block: look the hash up in the index")

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """Take ``n`` blocks from the head of the free queue (least recently freed first), in that order.

        Each comes back with ref count 1 and no hash: a block that still had a hash is evicted (its hash leaves
        the index, so no later request can hit K/V that is about to be overwritten).

        Raises:
            ValueError: fewer than ``n`` blocks are free (and nothing is taken).
        """
        raise NotImplementedError("implement get_new_blocks: pop n ids from the head of the free queue, evict hashes")

    def touch(self, blocks: list[KVBlock]) -> None:
        """One more reference on each block (a prefix-cache hit). A free block (ref count 0, with a hash or
        without) leaves the free queue: it is in use again and must never be handed out by ``get_new_blocks``
        while held."""
        raise NotImplementedError("implement touch: ref_cnt += 1; a block at 0 leaves the free queue")

    def free_blocks(self, blocks: list[KVBlock]) -> None:
        """Drop one reference on each block, in the order given; a block reaching 0 joins the free queue's TAIL
        (it keeps its hash: still a cache hit until evicted).

        Raises:
            RuntimeError: a block freed while its ref count is already 0 (a ref count never goes negative).
        """
        raise NotImplementedError("implement free_blocks: ref_cnt -= 1; at 0 append the id to the free queue")

    def cache_full_block(self, block: KVBlock, block_hash: bytes) -> None:
        """Index a full block under ``block_hash``. Nothing changes when the block already has a hash or another
        block is already indexed under ``block_hash`` (the first copy stays the cached one)."""
        raise NotImplementedError("implement cache_full_block: set block.block_hash and index it, unless taken")

    def ref_counts(self) -> list[int]:
        """``[block.ref_cnt for block in blocks]`` (the dashboard draws them)."""
        raise NotImplementedError("implement ref_counts: every block's ref_cnt, by block id")

    def reset_prefix_cache(self) -> None:
        """Forget every hash: clear the index and every indexed block's ``block_hash``."""
        raise NotImplementedError("implement reset_prefix_cache: clear block_hash of indexed blocks, then the index")
