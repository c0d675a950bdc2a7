"""The swap door (``preemption_mode="swap"``): a preempted request's KV blocks go to a CPU swap space.

Idea: vLLM v0's swap preemption (Kwon et al., SOSP 2023, section 4.5): instead of dropping a preempted request's
KV and recomputing it, copy its blocks to CPU memory (``SchedulerOutput.blocks_to_swap_out``, copied by the
runner before the forward) and copy them back when it resumes (``blocks_to_swap_in``); ``num_computed_tokens``
is kept. A victim whose blocks do not fit in the free swap blocks is recomputed, as by default.

``SwapScheduling`` is the scheduler's half (the swap space, its bookkeeping at finish and rollback) and
``SwapPreemption`` the step builder's (swap out at preemption, swap in at admission).
"""

from __future__ import annotations

from minengine.core.scheduler import OpenStep
from minengine.core.scheduler_output import ScheduledRequest
from minengine.core.step_builder import StateBeforeStep, reset_for_recompute
from minengine.core.swap_space import SwapSpace
from minengine.request import Request, RequestStatus


class SwapScheduling:
    """Scheduler mixin: owns the ``SwapSpace`` (CPU block ids) and keeps it right when requests finish and
    steps roll back."""

    @staticmethod
    def open_door(scheduler, **_) -> None:
        # With async scheduling the step after a step is scheduled before that one commits or rolls back: a
        # released swap block stays unused one step longer, so a rollback still finds its KV.
        hold_steps = 2 if scheduler.config.async_scheduling else 1
        scheduler.swap_space = SwapSpace(scheduler.config.swap_space_blocks, hold_steps=hold_steps)

    def schedule(self):
        self.swap_space.begin_step()
        return super().schedule()

    def new_step(self, out=None):
        step = super().new_step(out)
        step.swap_space = self.swap_space
        return step

    def count_moves(self, step) -> None:
        super().count_moves(step)
        self.num_swapped_out_blocks += step.num_swapped_out_blocks
        self.num_swapped_in_blocks += step.num_swapped_in_blocks

    def free_request(self, request: Request) -> None:
        super().free_request(request)
        self.swap_space.release(request.swapped_block_ids)
        request.swapped_block_ids = []

    def undo_request(self, undo: StateBeforeStep, s: ScheduledRequest) -> None:
        """A request swapped in by the failed step gets its CPU swap blocks back (their copies were only read)."""
        super().undo_request(undo, s)
        if undo.status is not RequestStatus.RUNNING and undo.swapped_block_ids:
            request = undo.request
            request.swapped_block_ids = list(undo.swapped_block_ids)
            self.swap_space.reclaim(request.swapped_block_ids)
            self.num_swapped_in_blocks -= len(request.swapped_block_ids)

    def restore_waiting(self, open_step: OpenStep) -> None:
        """A victim swapped out by the failed step becomes a recompute victim: the step may not have copied
        its blocks."""
        preempted = set(open_step.out.preempted_ids)
        for request in self.waiting:
            if request.request_id in preempted and request.status is RequestStatus.SWAPPED:
                self.swap_space.release(request.swapped_block_ids)
                self.num_swapped_out_blocks -= len(request.swapped_block_ids)
                request.swapped_block_ids = []
                reset_for_recompute(request)
        super().restore_waiting(open_step)

    @property
    def num_swapped(self) -> int:
        """Waiting requests whose KV is in the swap space (none, without looking, when it has no blocks)."""
        if not self.swap_space.num_blocks:
            return 0
        return sum(r.status is RequestStatus.SWAPPED for r in self.waiting)


class SwapPreemption:
    """Step-builder mixin: preemption swaps out when the swap space has room; admission swaps back in."""

    swap_space: SwapSpace  # set by ``SwapScheduling.new_step``

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0

    def evict(self, request: Request) -> None:
        """Swap when the swap space has room for all its blocks; otherwise recompute. Its GPU blocks are freed
        by the caller and may be reused in this step: the runner swaps out before the forward."""
        gpu_ids = self.kv.get_block_ids(request.request_id)
        if (self.config.preemption_mode != "swap" or not gpu_ids
                or len(gpu_ids) > self.swap_space.num_free_blocks):
            super().evict(request)
            return
        cpu_ids = self.swap_space.allocate(len(gpu_ids))
        self.out.blocks_to_swap_out.extend(zip(gpu_ids, cpu_ids))
        request.swapped_block_ids = cpu_ids
        request.status = RequestStatus.SWAPPED
        self.num_swapped_out_blocks += len(gpu_ids)

    def first_chunk(self, request: Request, limit: int, free: int) -> int:
        if request.swapped_block_ids:
            return self._swap_in(request, limit, free)
        return super().first_chunk(request, limit, free)

    def _swap_in(self, request: Request, limit: int, free: int) -> int:
        """Blocks for a swapped-out request out of ``free`` blocks: fresh GPU blocks for its saved ones
        (copied in by the runner before the forward) plus those its next chunk needs."""
        num_saved = len(request.swapped_block_ids)
        num_uncomputed = request.num_tokens - request.num_computed_tokens
        if not self.config.enable_chunked_prefill and num_uncomputed > limit:
            return 0
        num_new = self.config.chunk(num_uncomputed, limit)
        if self.kv.num_blocks_needed(request, num_new) > free:  # its table is empty: this counts every block
            if free < num_saved:
                return 0
            num_new = self.shrink_to_fit(num_new, free - num_saved, request.num_computed_tokens)
            if num_new == 0:
                return 0
        gpu_ids = self.kv.take_blocks(request, num_saved)
        self.out.blocks_to_swap_in.extend(zip(request.swapped_block_ids, gpu_ids))
        self.swap_space.release(request.swapped_block_ids)
        self.num_swapped_in_blocks += num_saved
        request.swapped_block_ids = []
        if self.kv.allocate_slots(request, num_new) is None:
            raise RuntimeError("swap-in allocation failed after the free-block check")  # a bug guard
        return num_new
