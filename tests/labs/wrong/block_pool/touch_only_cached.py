"""A wrong block pool. The bug: touch takes a free block out of the free queue only when it has a hash: a free block
without one, touched back into use, stays queued and get_new_blocks hands it out while it is held.
"""

from __future__ import annotations

from collections import OrderedDict

from minengine.core.block_pool import KVBlock


class BlockPool:
    """``num_blocks`` KV blocks, a free queue (least recently freed first) and the index of cached blocks."""

    def __init__(self, num_blocks: int):
        if num_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # an ordered set of ids
        self._cached: dict[bytes, KVBlock] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_cached_free_blocks(self) -> int:
        return sum(1 for i in self._free if self.blocks[i].block_hash is not None)

    def is_free(self, block: KVBlock) -> bool:
        return block.block_id in self._free

    def get_cached_block(self, block_hash: bytes) -> KVBlock | None:
        return self._cached.get(block_hash)

    def get_new_blocks(self, n: int) -> list[KVBlock]:
        if n > len(self._free):
            raise ValueError(f"cannot allocate {n} blocks: only {len(self._free)} free")
        out = []
        for _ in range(n):
            block = self.blocks[self._free.popitem(last=False)[0]]  # the least recently freed
            if block.block_hash is not None:  # its cached prefix is evicted: nobody may hit it any more
                del self._cached[block.block_hash]
                block.block_hash = None
            block.ref_cnt = 1
            out.append(block)
        return out

    def touch(self, blocks: list[KVBlock]) -> None:
        for block in blocks:
            if block.ref_cnt == 0 and block.block_hash is not None:  # BUG: a free block without a hash stays queued
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free_blocks(self, blocks: list[KVBlock]) -> None:
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"block {block.block_id} freed more often than taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = None  # the tail: evicted last

    def cache_full_block(self, block: KVBlock, block_hash: bytes) -> None:
        if block.block_hash is None and block_hash not in self._cached:
            block.block_hash = block_hash
            self._cached[block_hash] = block

    def ref_counts(self) -> list[int]:
        return [b.ref_cnt for b in self.blocks]

    def reset_prefix_cache(self) -> None:
        for block in self._cached.values():
            block.block_hash = None
        self._cached.clear()
