"""HybridKVCacheManager: two KV cache groups for a model that mixes full-attention and sliding-window layers.

Idea: vLLM's hybrid allocator (``vllm/v1/core/kv_cache_coordinator.py``, ``HybridKVCacheCoordinator``): the layers
are split into KV cache groups by attention type, and each group keeps its own block table per request. A
Qwen2/Qwen3 config with ``use_sliding_window`` and ``max_window_layers`` (``models/layer_windows.py``) has two:

- the **full** group, the full-attention layers: their queries read every key, so their blocks are kept until
  the request ends (``KVCacheManager``, which this class is);
- the **windowed** group, the windowed layers: a block wholly behind the window is never read again and goes
  back to the group's pool as the request advances (``WindowedKVCacheManager``'s rule, ``self.windowed``).

Memory layout: one pool per group, both of ``num_blocks`` blocks, over the per-layer K/V tensors the runner
already allocates (``[num_blocks, block_size, Hkv, D]`` per layer): block id ``b`` of a full-attention layer's
tensor belongs to the full group's pool, block id ``b`` of a windowed layer's tensor to the windowed group's.
Each pool's bytes are its layers' share of the KV memory, so nothing is laid out differently from a model with
one group; a layer simply reads and writes through its own group's block table and slot mapping
(``worker/hybrid_model_runner.py``). This is simpler to read than vLLM's single shared pool, where a block id
means a page of several layers of either group and the groups must be padded to the same number of layers.
What it does not do: the memory the windowed group frees is not lent to the full group, so the full group's
pool is the one that binds (sizing the windowed pool down to what its windows can hold is the next step).

The scheduler sees one manager: ``num_blocks_needed`` is the larger need of the two groups, ``num_free_blocks``
the smaller free count, and ``allocate_slots`` allocates in both groups or in neither, so a step is admitted only
if both groups can allocate. The two tables of a request always have the same length (released entries count),
so ``truncate`` (a failed step, a rejected proposal) and ``free`` (a finished or preempted request) cut both at
the same index. ``get_block_ids``, ``req_to_blocks`` and ``pool`` are the full group's;
``windowed_block_ids`` the windowed group's, which the step's ``SchedulerOutput`` carries
(``KVCacheGroupSteps``) so the runner and the step trace see both.

Prefix caching is refused (``ValueError`` naming ``enable_prefix_caching``): a hit needs the prefix in both
groups, and the windowed group's hit blocks must be taken back from its pool too, which the scheduler's single
free-block check does not count.
"""

from __future__ import annotations

from minengine.core.block_pool import KVBlock
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.scheduler_output import SchedulerOutput
from minengine.core.windowed_kv_cache_manager import WindowedKVCacheManager
from minengine.request import Request


class HybridKVCacheManager(KVCacheManager):
    """``KVCacheManager`` of the full-attention group, with the windowed group's manager beside it.

    Args:
        num_blocks: blocks in each group's pool.
        block_size: token slots per block (both groups).
        enable_prefix_caching: must be False.
        sliding_window: the windowed layers' window in tokens (``models/layer_windows.hybrid_window``).

    Attributes:
        windowed: the windowed group's ``WindowedKVCacheManager`` (its own pool, tables and releases).

    Raises:
        ValueError: ``enable_prefix_caching`` True; ``sliding_window`` not a positive integer.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool, sliding_window: int):
        if enable_prefix_caching:
            raise ValueError("enable_prefix_caching=True is not supported with a model that mixes full-attention "
                             "and sliding-window layers (two KV cache groups): use enable_prefix_caching=False")
        self.windowed = WindowedKVCacheManager(num_blocks, block_size, False, sliding_window)
        super().__init__(num_blocks, block_size, False)

    def num_blocks_needed(self, request: Request, num_new_tokens: int, num_new_computed_blocks: int = 0) -> int:
        """The larger of the two groups' needs (equal while the tables have the same length)."""
        return max(super().num_blocks_needed(request, num_new_tokens, num_new_computed_blocks),
                   self.windowed.num_blocks_needed(request, num_new_tokens, num_new_computed_blocks))

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVBlock] | None = None) -> list[KVBlock] | None:
        """Slots for ``num_new_tokens`` more tokens in both groups (the windowed group first releases what its
        window left behind), or None, changing nothing, when either group's pool is short. Returns the full
        group's new blocks. ``new_computed_blocks`` is always empty: without prefix caching nothing is hit."""
        windowed = self.windowed
        windowed.release_outside_window(request, request.num_computed_tokens)
        if windowed.num_blocks_needed(request, num_new_tokens) > windowed.num_free_blocks:
            return None
        new_blocks = super().allocate_slots(request, num_new_tokens)
        if new_blocks is not None and windowed.allocate_slots(request, num_new_tokens) is None:
            raise RuntimeError("windowed group allocation failed after its free-block check")  # a bug guard
        return new_blocks

    def truncate(self, request: Request, num_blocks: int) -> None:
        """Both groups keep the request's first ``num_blocks`` blocks (``num_blocks=0``: free them all)."""
        super().truncate(request, num_blocks)
        self.windowed.truncate(request, num_blocks)

    def take_blocks(self, request: Request, num_blocks: int) -> list[int]:
        raise ValueError("swap preemption is not supported with two KV cache groups: use preemption_mode='recompute'")

    def windowed_block_ids(self, request_id: str) -> list[int]:
        """The windowed group's block table of the request (released blocks keep their old id, as
        ``WindowedKVCacheManager.get_block_ids``)."""
        return self.windowed.get_block_ids(request_id)

    def num_held_blocks(self, request_id: str) -> tuple[int, int]:
        """(full group, windowed group) blocks the request holds now."""
        return len(self.req_to_blocks.get(request_id, ())), self.windowed.num_held_blocks(request_id)

    def block_snapshot(self, request_ids: list[str]) -> dict:
        """As ``KVCacheManager.block_snapshot`` (the full group), plus the windowed group's tables (-1 where a
        block was released) and ref counts."""
        tables = self.windowed.req_to_blocks
        return {**super().block_snapshot(request_ids),
                "windowed_block_tables": {rid: [b.block_id for b in tables.get(rid, ())] for rid in request_ids},
                "windowed_block_ref_counts": self.windowed.pool.ref_counts()}

    @property
    def num_free_blocks(self) -> int:
        """The smaller of the two groups' free blocks: what a step may still allocate in both."""
        return min(self.pool.num_free_blocks, self.windowed.num_free_blocks)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held in the full group and the windowed group together."""
        return self.pool.num_blocks - self.pool.num_free_blocks + self.windowed.num_used_blocks


class KVCacheGroupSteps:
    """Step-builder door of a ``HybridKVCacheManager``: the finished step carries the windowed group's block table
    of every scheduled request (``SchedulerOutput.windowed_block_ids``) beside each ``ScheduledRequest``'s
    ``block_ids`` (the full group's)."""

    def build(self) -> SchedulerOutput:
        out = super().build()
        out.windowed_block_ids = {s.request_id: self.kv.windowed_block_ids(s.request_id) for s in out.scheduled}
        return out
