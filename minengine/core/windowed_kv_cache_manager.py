"""WindowedKVCacheManager: the KV cache manager of a model whose every layer attends through a sliding window.

Idea: a layer with a window of ``w`` tokens never reads a key more than ``w - 1`` positions behind its query
(``layers/sliding_window.py``), so once a request has computed ``c`` tokens, its next query (position ``c``) and
every later one read keys from position ``c - w + 1`` on: the blocks wholly before that position are dead for
good and go back to the pool. vLLM's ``SlidingWindowManager`` (``vllm/v1/core/single_type_kv_cache_manager.py``)
frees them the same way, in ``remove_skipped_blocks``, before each allocation.

What a request holds is then bounded by the window, not by its length. With ``n`` new tokens scheduled in a step
the request holds blocks from index ``(c - w + 1) // block_size`` to index ``(c + n - 1) // block_size``, at most
``1 + ceil((w + n - 2) / block_size)`` blocks: for a decode (``n = 1``) ``1 + ceil((w - 1) / block_size)``, reached
whenever the new token opens a block (``max_blocks_held``).

A released block leaves a hole at the front of the request's block table: ``req_to_blocks`` holds ``RELEASED``
there (the request no longer holds that block), while the id lists handed to the runner keep the old id, so
every table stays append-only for the runner's ``BlockTable``; attention masks those keys out
(``layers/sliding_window.py``). A step's trace records ``req_to_blocks``, so it shows -1 there: the old block may
belong to another request by then. A released block keeps its prefix-cache hash until it is evicted, so prefix
caching works as before: a hit still needs every block of the prefix, from the first (vLLM's manager needs only
the blocks the window of the hit's end reads: ``window_hit``, which the hybrid manager's windowed group uses).
Preemption by recompute frees what is held and recomputes from position 0, as for any request. A failed step
(``Scheduler.rollback``) keeps its releases: they depend only on the tokens computed before the step, which the
rollback keeps.
"""

from __future__ import annotations

from minengine.core.block_pool import KVBlock
from minengine.core.kv_cache_manager import KVCacheManager, cdiv
from minengine.request import Request

# The entry of a released block in ``req_to_blocks``: not in the pool, never freed, never indexed.
RELEASED = KVBlock(block_id=-1)


def max_blocks_held(window: int, block_size: int, num_new_tokens: int = 1) -> int:
    """The most blocks a request holds in a step that schedules ``num_new_tokens`` tokens (1: a decode)."""
    return 1 + cdiv(window + num_new_tokens - 2, block_size)


class WindowedKVCacheManager(KVCacheManager):
    """``KVCacheManager`` that frees the blocks behind the window as each request advances.

    Args:
        num_blocks, block_size, enable_prefix_caching: as ``KVCacheManager``'s.
        sliding_window: the window in tokens of every layer (the largest, if they differ: ``kv_window``).

    Raises:
        ValueError: ``sliding_window`` not a positive integer.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, sliding_window: int):
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive integer, got {sliding_window!r}")
        super().__init__(num_blocks, block_size, enable_prefix_caching)
        self.sliding_window = sliding_window
        self._num_released: dict[str, int] = {}  # request id -> leading entries of its table released

    def release_outside_window(self, request: Request, num_computed_tokens: int) -> None:
        """Free the request's blocks that lie wholly before position ``num_computed_tokens - window + 1``, the
        oldest key its next query reads (the oldest block last, so it is evicted last)."""
        rid = request.request_id
        blocks = self.req_to_blocks.get(rid)
        if not blocks:
            return
        first_needed = min(max(0, (num_computed_tokens - self.sliding_window + 1) // self.block_size), len(blocks))
        start = self._num_released.get(rid, 0)
        if first_needed <= start:
            return
        dead = blocks[start:first_needed]
        blocks[start:first_needed] = [RELEASED] * len(dead)
        self._num_released[rid] = first_needed
        # Every released block is indexed already (it was full before the step that computed past it) or never
        # will be (no prefix caching, or a prefix hit another block indexes): no staged entry may point at a hole.
        self._num_indexed[rid] = max(self._num_indexed.get(rid, 0), first_needed)
        self.pool.free_blocks(list(reversed(dead)))

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVBlock] | None = None) -> list[KVBlock] | None:
        """As ``KVCacheManager.allocate_slots``, after releasing what the window has left behind (so the freed
        blocks count as free), and releasing again past any prefix-hit blocks."""
        self.release_outside_window(request, request.num_computed_tokens)
        new_blocks = super().allocate_slots(request, num_new_tokens, new_computed_blocks)
        if new_blocks is not None and new_computed_blocks:
            hit_tokens = len(new_computed_blocks) * self.block_size
            self.release_outside_window(request, request.num_computed_tokens + hit_tokens)
        return new_blocks

    def first_needed_block(self, num_computed_tokens: int) -> int:
        """The index of the block holding the oldest key the query at position ``num_computed_tokens`` reads."""
        return max(0, num_computed_tokens - self.sliding_window + 1) // self.block_size

    def window_hit(self, request: Request, num_hit_blocks: int) -> list[KVBlock] | None:
        """The cached blocks a prefix hit of the request's first ``num_hit_blocks`` blocks needs under the window
        (vLLM's sliding-window hit): those from ``first_needed_block`` of the hit's end on; None when one of them
        is not cached (blocks staged in this step count, as in ``get_computed_blocks``). Pure."""
        self._update_block_hashes(request)
        hits = []
        for block_hash in request.block_hashes[self.first_needed_block(num_hit_blocks * self.block_size):
                                               num_hit_blocks]:
            block = self.pool.get_cached_block(block_hash) or self._staged_by_hash.get(block_hash)
            if block is None:
                return None
            hits.append(block)
        return hits

    def allocate_after_window_hit(self, request: Request, num_new_tokens: int, num_hit_blocks: int,
                                  hit_blocks: list[KVBlock]) -> list[KVBlock] | None:
        """Give a request that holds no blocks a table of ``num_hit_blocks`` hit blocks (``window_hit``: the
        ones before them are released at once, and read 0 in the runner's table, masked) and slots for
        ``num_new_tokens`` more tokens. Returns the new blocks, or None (changing nothing) when the pool is
        short."""
        rid = request.request_id
        num_new = cdiv(num_hit_blocks * self.block_size + num_new_tokens, self.block_size) - num_hit_blocks
        num_revived = sum(1 for b in hit_blocks if b.ref_cnt == 0)
        if num_new + num_revived > self.pool.num_free_blocks:
            return None
        num_released = num_hit_blocks - len(hit_blocks)
        self.pool.touch(hit_blocks)
        new_blocks = self.pool.get_new_blocks(num_new)
        self.req_to_blocks[rid] = [RELEASED] * num_released + hit_blocks + new_blocks
        self._block_ids[rid] = [0] * num_released + [b.block_id for b in hit_blocks + new_blocks]
        self._num_released[rid] = num_released
        self._num_indexed[rid] = num_hit_blocks  # every hit block is indexed already
        return new_blocks

    def truncate(self, request: Request, num_blocks: int) -> None:
        """As ``KVCacheManager.truncate``: the held blocks after the first ``num_blocks`` are freed; released
        entries in the cut are dropped without touching the pool."""
        rid = request.request_id
        released = self._num_released.get(rid, 0)
        super().truncate(request, max(num_blocks, released))
        if num_blocks >= released:
            return
        blocks = self.req_to_blocks.get(rid, [])
        del blocks[num_blocks:]
        if not blocks:
            for table in (self.req_to_blocks, self._block_ids, self._num_indexed, self._num_released):
                table.pop(rid, None)
            return
        self._block_ids[rid] = self._block_ids[rid][:num_blocks]
        self._num_indexed[rid] = min(self._num_indexed.get(rid, 0), num_blocks)
        self._num_released[rid] = num_blocks

    def num_held_blocks(self, request_id: str) -> int:
        """Blocks the request holds now (its table's length less the released entries)."""
        return len(self.req_to_blocks.get(request_id, ())) - self._num_released.get(request_id, 0)
