"""KVBlock and BlockPool: the physical KV blocks, their ref counts, the LRU free queue and the hash index.

Idea: PagedAttention (Kwon et al., SOSP 2023, section 4.2) splits the KV cache into fixed-size blocks so a
request holds only the blocks it has filled; automatic prefix caching (vLLM) keeps freed blocks with their
content hash so a later request with the same prefix can take them back instead of recomputing.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass
class KVBlock:
    """One physical block of ``block_size`` token slots in every layer's K and V cache.

    ``ref_cnt`` counts the block tables that hold the block. ``block_hash`` is set while the block is full and
    indexed in the prefix cache; it survives ``ref_cnt == 0`` until the block is handed out again.
    """

    block_id: int
    ref_cnt: int = 0
    block_hash: bytes | None = None


class BlockPool:
    """All ``num_blocks`` blocks, a free queue in LRU order and the prefix-cache index ``hash -> block``.

    Free blocks (``ref_cnt == 0``) sit in the free queue, least recently freed first; a free block may still
    hold a cached prefix. ``get_new_blocks`` takes from the front, so the least recently used cached block is
    evicted first, and drops its hash from the index at that moment.
    """

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = list(map(KVBlock, range(num_blocks)))
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, KVBlock] = {}
        self._num_cached_free = 0  # free blocks with a hash, kept up to date so reading it costs O(1)

    @property
    def num_free_blocks(self) -> int:
        """Blocks no request holds (cached or not): what new allocations may take."""
        return len(self._free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still hold a cached prefix (reusable until evicted)."""
        return self._num_cached_free

    def is_free(self, block: KVBlock) -> bool:
        return block.block_id in self._free

    def get_cached_block(self, block_hash: bytes) -> KVBlock | None:
        return self._cached.get(block_hash)

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        """Take ``n`` blocks from the front of the free queue (LRU first), evicting their cached hash.

        Raises:
            ValueError: when fewer than ``n`` blocks are free (callers check first).
        """
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks: only {len(self._free)} free")
        out = []
        for _ in range(n):
            block_id, _ = self._free.popitem(last=False)
            block = self.blocks[block_id]
            if block.block_hash is not None:  # eviction: the cached prefix is gone
                del self._cached[block.block_hash]
                block.block_hash = None
                self._num_cached_free -= 1
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        """Take one more reference on each block (a prefix-cache hit); a free one leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
                if block.block_hash is not None:
                    self._num_cached_free -= 1
            block.ref_cnt += 1

    def free_blocks(self, blocks: list[KVBlock]) -> None:
        """Drop one reference on each block, in the given order; a block reaching 0 joins the queue's tail.

        Callers pass a request's blocks tail first, so when they are evicted later the end of a prefix goes
        before its beginning (the beginning is the part other requests are most likely to share).
        """
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"block {block.block_id} freed more often than taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = None
                if block.block_hash is not None:
                    self._num_cached_free += 1

    def cache_full_block(self, block: KVBlock, block_hash: bytes) -> None:
        """Index a full block under its chained hash. If another block already holds the same content, the
        first one stays the cached copy and this one stays un-indexed (it is freed normally)."""
        if block.block_hash is not None or block_hash in self._cached:
            return
        block.block_hash = block_hash
        self._cached[block_hash] = block
        if block.block_id in self._free:
            self._num_cached_free += 1

    def ref_counts(self) -> list[int]:
        return [b.ref_cnt for b in self.blocks]

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (blocks in use keep their contents)."""
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()
        self._num_cached_free = 0
