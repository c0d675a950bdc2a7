"""HybridKVCacheManager: two KV cache groups for a model that mixes full-attention and sliding-window layers.

Idea: vLLM's hybrid allocator (``vllm/v1/core/kv_cache_coordinator.py``, ``HybridKVCacheCoordinator``): the layers
are split into KV cache groups by attention type, and each group keeps its own block table per request. A
Qwen2/Qwen3 config with ``use_sliding_window`` and ``max_window_layers`` (``models/layer_windows.py``) has two:

- the **full** group, the full-attention layers: their queries read every key, so their blocks are kept until
  the request ends (a ``KVCacheManager``, ``self.full``);
- the **windowed** group, the windowed layers: a block wholly behind the window is never read again and goes
  back to the group's pool as the request advances (a ``WindowedKVCacheManager``, ``self.windowed``).

Memory layout: one pool per group, both of ``num_blocks`` blocks, over the per-layer K/V tensors the runner
already allocates (``[num_blocks, block_size, Hkv, D]`` per layer): block id ``b`` of a full-attention layer's
tensor belongs to the full group's pool, block id ``b`` of a windowed layer's tensor to the windowed group's.
Each pool's bytes are its layers' share of the KV memory, so nothing is laid out differently from a model with
one group; a layer simply reads and writes through its own group's block table and slot mapping
(``worker/hybrid_model_runner.py``). This is simpler to read than vLLM's single shared pool, where a block id
means a page of several layers of either group and the groups must be padded to the same number of layers.
What it does not do: the memory the windowed group frees is not lent to the full group, so the full group's
pool is the one that binds (sizing the windowed pool down to what its windows can hold is the next step).

The scheduler sees one manager, this class, with ``KVCacheManager``'s methods: each goes to both groups.
``num_blocks_needed`` is the new blocks a request needs in each group (the same number), ``num_free_blocks`` the
smaller free count, and ``allocate_slots`` allocates in both groups or in neither, so a step is admitted only if
both groups can allocate. The two tables of a request always have the same length (released entries count),
so ``truncate`` (a failed step, a rejected proposal) and ``free`` (a finished or preempted request) cut both at
the same index. ``get_block_ids``, ``req_to_blocks`` and ``pool`` are the full group's;
``windowed_block_ids`` the windowed group's, which the step's ``SchedulerOutput`` carries
(``KVCacheGroupSteps``) so the runner and the step trace see both.

Prefix caching: each group indexes its full blocks under the same chained hashes, and a hit needs the prefix in
both: the full group's blocks from the first, the windowed group's only from the block the window of the hit's end
starts in (vLLM's sliding-window hit; the blocks before it are released at once). A hit may take blocks back from
each group's free queue: the scheduler subtracts the full group's from the free blocks itself
(``StepBuilder.first_chunk``), and ``num_blocks_needed`` adds what the windowed group takes beyond that, so its one
check still covers both groups.
"""

from __future__ import annotations

from minengine.core.block_pool import BlockPool, KVBlock
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.scheduler_output import SchedulerOutput
from minengine.core.windowed_kv_cache_manager import WindowedKVCacheManager
from minengine.request import Request


class HybridKVCacheManager:
    """The KV cache manager of a model with a full-attention and a windowed KV cache group (``KVCacheManager``'s
    interface, each call made in both groups).

    Args:
        num_blocks: blocks in each group's pool.
        block_size: token slots per block (both groups).
        enable_prefix_caching: index full blocks by hash in both groups; a hit needs the prefix in both.
        sliding_window: the windowed layers' window in tokens (``models/layer_windows.hybrid_window``).

    Attributes:
        full: the full-attention group's ``KVCacheManager``; ``pool`` and ``req_to_blocks`` are its own.
        windowed: the windowed group's ``WindowedKVCacheManager`` (its own pool, tables, releases and index).

    Raises:
        ValueError: ``sliding_window`` not a positive integer; ``num_blocks`` < 1.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, sliding_window: int):
        self.full = KVCacheManager(num_blocks, block_size, enable_prefix_caching)
        self.windowed = WindowedKVCacheManager(num_blocks, block_size, enable_prefix_caching, sliding_window)
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching

    @property
    def pool(self) -> BlockPool:
        return self.full.pool

    @property
    def req_to_blocks(self) -> dict[str, list[KVBlock]]:
        return self.full.req_to_blocks

    # ---- prefix cache: a hit needs the prefix in both groups ------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """The longest prefix both groups hold: the full group's hit (``KVCacheManager.get_computed_blocks``) cut
        back until the windowed group holds the blocks the window of its end reads
        (``WindowedKVCacheManager.window_hit``). Returns the full group's blocks. Pure."""
        hits, _ = self.full.get_computed_blocks(request)
        num_hit = len(hits)
        while num_hit and self.windowed.window_hit(request, num_hit) is None:
            num_hit -= 1
        return hits[:num_hit], num_hit * self.block_size

    def num_blocks_needed(self, request: Request, num_new_tokens: int, num_new_computed_blocks: int = 0) -> int:
        """The new blocks each group needs (the same number: the tables have the same length), plus, after a
        prefix hit of ``num_new_computed_blocks`` blocks, the windowed group's hit blocks it takes back from its
        free queue beyond the full group's (which the scheduler subtracts from the free blocks itself)."""
        num_new = self.full.num_blocks_needed(request, num_new_tokens, num_new_computed_blocks)
        if not num_new_computed_blocks:
            return num_new
        full_hits = self.full.get_computed_blocks(request)[0][:num_new_computed_blocks]
        windowed_hits = self.windowed.window_hit(request, num_new_computed_blocks) or []
        revived = [sum(1 for b in hits if b.ref_cnt == 0) for hits in (full_hits, windowed_hits)]
        return num_new + max(0, revived[1] - revived[0])

    # ---- allocation ------------------------------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVBlock] | None = None) -> list[KVBlock] | None:
        """Slots for ``num_new_tokens`` more tokens (after a prefix hit of the full group's
        ``new_computed_blocks``, from ``get_computed_blocks``) in both groups, or None, changing nothing, when
        either group's pool is short. Returns the full group's new blocks."""
        if new_computed_blocks:
            return self._allocate_after_hit(request, num_new_tokens, new_computed_blocks)
        windowed = self.windowed
        windowed.release_outside_window(request, request.num_computed_tokens)  # freed blocks count as free
        if windowed.num_blocks_needed(request, num_new_tokens) > windowed.num_free_blocks:
            return None
        new_blocks = self.full.allocate_slots(request, num_new_tokens)
        if new_blocks is not None:
            _checked(windowed.allocate_slots(request, num_new_tokens))
        return new_blocks

    def _allocate_after_hit(self, request: Request, num_new_tokens: int,
                            full_hits: list[KVBlock]) -> list[KVBlock] | None:
        """A (re)admitted request's first allocation after a prefix hit: the windowed group takes only the hit
        blocks its window reads (``WindowedKVCacheManager.allocate_after_window_hit``)."""
        windowed, num_hit = self.windowed, len(full_hits)
        hits = windowed.window_hit(request, num_hit)
        if hits is None:
            return None
        num_revived = sum(1 for b in hits if b.ref_cnt == 0)
        if windowed.num_blocks_needed(request, num_new_tokens, num_hit) + num_revived > windowed.num_free_blocks:
            return None
        new_blocks = self.full.allocate_slots(request, num_new_tokens, full_hits)
        if new_blocks is not None:
            _checked(windowed.allocate_after_window_hit(request, num_new_tokens, num_hit, hits))
        return new_blocks

    def take_blocks(self, request: Request, num_blocks: int) -> list[int]:
        raise ValueError("swap preemption is not supported with two KV cache groups: use preemption_mode='recompute'")

    def free(self, request: Request) -> None:
        """Release all of a request's blocks in both groups."""
        self.truncate(request, 0)

    def truncate(self, request: Request, num_blocks: int) -> None:
        """Both groups keep the request's first ``num_blocks`` blocks (``num_blocks=0``: free them all)."""
        self.full.truncate(request, num_blocks)
        self.windowed.truncate(request, num_blocks)

    # ---- the step's prefix-cache transaction, in both groups ----------------------------------------------
    def stage_full_blocks(self, request: Request, num_tokens: int) -> None:
        self.full.stage_full_blocks(request, num_tokens)
        self.windowed.stage_full_blocks(request, num_tokens)

    def commit_staged(self) -> None:
        self.full.commit_staged()
        self.windowed.commit_staged()

    def discard_staged(self) -> None:
        self.full.discard_staged()
        self.windowed.discard_staged()

    def reset_prefix_cache(self) -> None:
        self.full.reset_prefix_cache()
        self.windowed.reset_prefix_cache()

    # ---- what the runner, the trace and the tests read ----------------------------------------------------
    def get_block_ids(self, request_id: str) -> list[int]:
        """The full group's block table of the request (``KVCacheManager.get_block_ids``)."""
        return self.full.get_block_ids(request_id)

    def windowed_block_ids(self, request_id: str) -> list[int]:
        """The windowed group's block table of the request (released blocks keep their old id, as
        ``WindowedKVCacheManager.get_block_ids``)."""
        return self.windowed.get_block_ids(request_id)

    def num_held_blocks(self, request_id: str) -> tuple[int, int]:
        """(full group, windowed group) blocks the request holds now."""
        return len(self.full.req_to_blocks.get(request_id, ())), self.windowed.num_held_blocks(request_id)

    def block_snapshot(self, request_ids: list[str]) -> dict:
        """As ``KVCacheManager.block_snapshot`` (the full group), plus the windowed group's tables (-1 where a
        block was released) and ref counts."""
        tables = self.windowed.req_to_blocks
        return {**self.full.block_snapshot(request_ids),
                "windowed_block_tables": {rid: [b.block_id for b in tables.get(rid, ())] for rid in request_ids},
                "windowed_block_ref_counts": self.windowed.pool.ref_counts()}

    @property
    def num_free_blocks(self) -> int:
        """The smaller of the two groups' free blocks: what a step may still allocate in both."""
        return min(self.full.num_free_blocks, self.windowed.num_free_blocks)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held in the full group and the windowed group together."""
        return self.full.num_used_blocks + self.windowed.num_used_blocks


def _checked(windowed_blocks: list[KVBlock] | None) -> None:
    if windowed_blocks is None:  # a bug guard: its free blocks were checked first
        raise RuntimeError("windowed group allocation failed after its free-block check")


class KVCacheGroupSteps:
    """Step-builder door of a ``HybridKVCacheManager``: the finished step carries the windowed group's block table
    of every scheduled request (``SchedulerOutput.windowed_block_ids``) beside each ``ScheduledRequest``'s
    ``block_ids`` (the full group's)."""

    def build(self) -> SchedulerOutput:
        out = super().build()
        out.windowed_block_ids = {s.request_id: self.kv.windowed_block_ids(s.request_id) for s in out.scheduled}
        return out
