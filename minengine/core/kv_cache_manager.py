"""KVCacheManager: per-request block tables on top of the BlockPool, prefix lookup, allocate_slots, free.

Ideas: block tables and on-demand allocation from PagedAttention (Kwon et al., SOSP 2023, section 4.2);
prefix caching by a chained hash of each full block from vLLM's automatic prefix caching (and SGLang's
RadixAttention, Zheng et al. 2024, for the tree view of the same idea).

One block table, several forms, one owner: this manager's ``req_to_blocks`` (``KVBlock`` objects, the truth);
the id lists each ``ScheduledRequest`` carries to the runner (``get_block_ids``, a copy per step); and the
worker's ``BlockTable`` (``worker/block_table.py``), the running requests' ids as rows of one array, kept between
steps. Full blocks a step completes wait in a staging list until the step commits (``stage_full_blocks``,
``commit_staged``), so a failed step never leaves a prefix-cache entry for K/V it did not write.
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

    A block becomes findable in the prefix cache only once its K/V has really been written: the scheduler
    stages the full blocks each scheduled request will complete (``stage_full_blocks``), and
    ``commit_staged`` indexes them after the step's forward and sampling succeeded; a failed step's staged
    blocks are dropped (``discard_staged``). vLLM (PR #43569) and SGLang (PR #28374) fixed the same class of
    bug: blocks indexed at allocation served unwritten K/V after an interrupted step. Within the step itself a
    request admitted later may already hit a staged block, as the forward writes a layer's K/V before that
    layer's attention reads it; both requests then belong to the same step, which commits or rolls back whole.

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
        # The same tables as lists of block ids, copy-on-write: a list handed out by ``get_block_ids`` is never
        # changed afterwards (a new block makes a new list), so every step can hand every scheduled request
        # its whole table without copying it (at 1,024 requests x 8,192 tokens a copy per step took ~10 ms).
        self._block_ids: dict[str, list[int]] = {}
        self._num_indexed: dict[str, int] = {}  # how many of a request's leading blocks are hashed/indexed
        # This step's full blocks, indexed at commit: request id -> ([(block, hash)], number of full blocks).
        self._staged: dict[str, tuple[list[tuple[KVBlock, bytes]], int]] = {}
        self._staged_by_hash: dict[bytes, KVBlock] = {}  # the same blocks, for hits later in the same step

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
        recomputed and the step has logits to sample from. Blocks staged in the current step count as hits
        (see the class docstring). Pure: takes no references. A request asking for ``prompt_logprobs`` gets
        no hit (as in vLLM): cached positions would compute no logits.
        """
        if not self.enable_prefix_caching or request.sampling_params.prompt_logprobs is not None:
            return [], 0
        self._update_block_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in request.block_hashes[:max_blocks]:
            block = self.pool.get_cached_block(block_hash) or self._staged_by_hash.get(block_hash)
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
        if not new_computed_blocks:
            held = self.req_to_blocks.get(request.request_id)
            if held and request.num_computed_tokens + num_new_tokens <= len(held) * self.block_size:
                return []  # the common decode step: the token fits in the last block
        new_computed_blocks = new_computed_blocks or []
        num_new = self.num_blocks_needed(request, num_new_tokens, len(new_computed_blocks))
        if num_new == 0 and not new_computed_blocks and request.request_id in self.req_to_blocks:
            return []
        num_revived = sum(1 for b in new_computed_blocks if b.ref_cnt == 0)
        if num_new + num_revived > self.pool.num_free_blocks:
            return None
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        self.pool.touch(new_computed_blocks)
        new_blocks = self.pool.get_new_blocks(num_new)
        blocks.extend(new_computed_blocks)
        blocks.extend(new_blocks)
        self._block_ids[request.request_id] = (self._block_ids.get(request.request_id, [])
                                               + [b.block_id for b in new_computed_blocks]
                                               + [b.block_id for b in new_blocks])
        return new_blocks

    # ---- the step's prefix-cache transaction -----------------------------------------------------------
    def stage_full_blocks(self, request: Request, num_tokens: int) -> None:
        """Record the full blocks ``request`` will hold once this step has computed its tokens up to
        ``num_tokens``, to be indexed by ``commit_staged``. Call once per scheduled request per step."""
        if not self.enable_prefix_caching:
            return
        num_full = num_tokens // self.block_size
        start = self._num_indexed.get(request.request_id, 0)
        if num_full <= start:  # completes no block (most decode steps): nothing to stage
            return
        self._update_block_hashes(request)
        blocks = self.req_to_blocks[request.request_id]
        pairs = [(blocks[i], request.block_hashes[i]) for i in range(start, num_full)]
        self._staged[request.request_id] = (pairs, num_full)
        for block, block_hash in pairs:
            self._staged_by_hash.setdefault(block_hash, block)

    def commit_staged(self) -> None:
        """The step's K/V is written: index every staged block in the prefix cache."""
        for request_id, (pairs, num_full) in self._staged.items():
            for block, block_hash in pairs:
                self.pool.cache_full_block(block, block_hash)
            self._num_indexed[request_id] = max(self._num_indexed.get(request_id, 0), num_full)
        self.discard_staged()

    def discard_staged(self) -> None:
        """The step failed (or indexed its blocks): forget what it staged."""
        self._staged.clear()
        self._staged_by_hash.clear()

    def take_blocks(self, request: Request, num_blocks: int) -> list[int]:
        """Give a request that holds no blocks ``num_blocks`` fresh ones as its block table (a swap-in: the
        runner copies the saved KV into them). Their full blocks are staged with the request's chunk of the
        step and indexed when it commits. Returns their ids. Raises ``ValueError`` when too few are free."""
        if self.req_to_blocks.get(request.request_id):
            raise ValueError(f"request {request.request_id!r} already holds blocks")
        blocks = self.pool.get_new_blocks(num_blocks)
        self.req_to_blocks[request.request_id] = blocks
        self._block_ids[request.request_id] = [b.block_id for b in blocks]
        return self._block_ids[request.request_id]

    def free(self, request: Request) -> None:
        """Release all of a request's blocks (tail first, so prefix heads are evicted last)."""
        self.truncate(request, 0)

    def truncate(self, request: Request, num_blocks: int) -> None:
        """Release the request's blocks after its first ``num_blocks`` (tail first, so prefix heads are
        evicted last); ``num_blocks=0`` frees them all. Undoes a step's allocations when the step fails."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        tail = blocks[num_blocks:]
        del blocks[num_blocks:]
        if request.request_id in self._block_ids:
            self._block_ids[request.request_id] = self._block_ids[request.request_id][:num_blocks]
        if not blocks:
            self.req_to_blocks.pop(request.request_id, None)
            self._block_ids.pop(request.request_id, None)
            self._num_indexed.pop(request.request_id, None)
        else:
            self._num_indexed[request.request_id] = min(self._num_indexed.get(request.request_id, 0), num_blocks)
        pairs, _ = self._staged.pop(request.request_id, ([], 0))
        for block, block_hash in pairs:
            if self._staged_by_hash.get(block_hash) is block:
                del self._staged_by_hash[block_hash]
        self.pool.free_blocks(list(reversed(tail)))

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table as physical block ids, logical order. Read-only: the manager never
        changes a list it has handed out (the next allocation makes a new one), so callers may keep it."""
        return self._block_ids.get(request_id, [])

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks in use keep their contents)."""
        self.pool.reset_prefix_cache()

    def block_snapshot(self, request_ids: list[str]) -> dict:
        """The block state a step trace records (``StepTrace``): the tables of ``request_ids`` (a block a sliding
        window gave back reads -1: another request may hold it), every block's ref count, the cached blocks."""
        tables = self.req_to_blocks
        return {"block_tables": {rid: [b.block_id for b in tables.get(rid, ())] for rid in request_ids},
                "block_ref_counts": self.pool.ref_counts(),
                "cached_block_ids": [b.block_id for b in self.pool.blocks if b.block_hash is not None]}

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free_blocks
