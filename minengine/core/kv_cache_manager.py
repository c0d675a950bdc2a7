"""KVCacheManager: per-request block tables on top of the BlockPool, prefix lookup, allocate_slots, free.

Ideas: block tables and on-demand allocation from PagedAttention (Kwon et al., SOSP 2023, section 4.2);
prefix caching by a chained hash of each full block from vLLM's automatic prefix caching (and SGLang's
RadixAttention, Zheng et al. 2024, for the tree view of the same idea).
"""

from __future__ import annotations

import hashlib
import struct

from minengine.core.block_pool import BlockPool, KVBlock
from minengine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hash_block(parent_hash: bytes | None, token_ids: list[int]) -> bytes:
    """Chained hash of one full block: sha256(parent hash || token ids). Two blocks get the same hash only
    when they and every block before them hold the same tokens, so equal hash == equal K/V."""
    h = hashlib.sha256(parent_hash or b"")
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return h.digest()


class KVCacheManager:
    """Maps each request to its block table (list of physical blocks) and keeps the prefix cache.

    Args:
        num_blocks: blocks in the pool (the KV block budget).
        block_size: token slots per block.
        enable_prefix_caching: index full blocks by hash and reuse them on admission.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool):
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.req_to_blocks: dict[str, list[KVBlock]] = {}
        self._num_indexed: dict[str, int] = {}  # how many of a request's leading blocks are hashed/indexed

    # ---- prefix cache -------------------------------------------------------------------------------
    def _update_block_hashes(self, request: Request) -> None:
        """Extend ``request.block_hashes`` to cover every full block of its known tokens."""
        bs = self.block_size
        hashes = request.block_hashes
        while (len(hashes) + 1) * bs <= request.num_tokens:
            i = len(hashes)
            hashes.append(hash_block(hashes[-1] if hashes else None, request.token_ids_slice(i * bs, (i + 1) * bs)))

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Longest cached prefix of a waiting request: (blocks, number of tokens they cover).

        At most ``(num_tokens - 1) // block_size`` blocks are taken, so at least the last known token is
        recomputed and the step has logits to sample from. Pure: takes no references. A request asking for
        ``prompt_logprobs`` gets no hit (as in vLLM): cached positions would compute no logits.
        """
        if not self.enable_prefix_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        self._update_block_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    # ---- allocation ---------------------------------------------------------------------------------
    def num_blocks_needed(self, request: Request, num_new_tokens: int, num_new_computed_blocks: int = 0) -> int:
        """New blocks that ``allocate_slots`` would take from the free queue for this many new tokens."""
        held = len(self.req_to_blocks.get(request.request_id, ())) + num_new_computed_blocks
        total = request.num_computed_tokens + num_new_computed_blocks * self.block_size + num_new_tokens
        return max(0, cdiv(total, self.block_size) - held)

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVBlock] | None = None) -> list[KVBlock] | None:
        """Give ``request`` slots for ``num_new_tokens`` more tokens (plus any prefix-hit blocks).

        Allocation is incremental: only the blocks the request will fill this step, never its maximum
        length. Prefix-hit blocks with ref count 0 leave the free queue, so they count against the free
        blocks too. Returns the newly taken blocks, or ``None`` (and changes nothing) when the pool is short.
        """
        new_computed_blocks = new_computed_blocks or []
        num_new = self.num_blocks_needed(request, num_new_tokens, len(new_computed_blocks))
        num_revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new + num_revived > self.pool.num_free_blocks:
            return None
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        self.pool.touch(new_computed_blocks)
        blocks.extend(new_computed_blocks)
        new_blocks = self.pool.get_new_blocks(num_new)
        blocks.extend(new_blocks)
        if self.enable_prefix_caching:
            # Index the blocks this step fills completely. K/V is written before attention reads it in the
            # same layer, so a request admitted later in the same step may already hit these blocks.
            num_full = (request.num_computed_tokens + len(new_computed_blocks) * self.block_size
                        + num_new_tokens) // self.block_size
            self._update_block_hashes(request)
            start = self._num_indexed.get(request.request_id, 0)
            for i in range(start, num_full):
                self.pool.cache_full_block(blocks[i], request.block_hashes[i])
            self._num_indexed[request.request_id] = max(start, num_full)
        return new_blocks

    def take_blocks(self, request: Request, num_blocks: int) -> list[int]:
        """Give a request that holds no blocks ``num_blocks`` fresh ones as its block table (a swap-in: the
        runner copies the saved KV into them). Their prefix-cache hashes are indexed by the request's next
        ``allocate_slots``. Returns their ids. Raises ``ValueError`` when too few are free."""
        if self.req_to_blocks.get(request.request_id):
            raise ValueError(f"request {request.request_id!r} already holds blocks")
        blocks = self.pool.get_new_blocks(num_blocks)
        self.req_to_blocks[request.request_id] = blocks
        return [b.block_id for b in blocks]

    def free(self, request: Request) -> None:
        """Release all of a request's blocks (tail first, so prefix heads are evicted last)."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self._num_indexed.pop(request.request_id, None)
        self.pool.free_blocks(list(reversed(blocks)))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free_blocks
