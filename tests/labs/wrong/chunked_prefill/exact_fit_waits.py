"""A wrong chunked prefill. The bug: without chunked prefill, a prompt of exactly the budget left waits (``<`` where
``<=`` belongs): a step that could be full is not, and a prompt as long as max_num_batched_tokens never runs.
"""

from __future__ import annotations

from minengine.request import RequestStatus


def prefill_chunk(num_uncomputed: int, token_budget: int, long_prefill_token_threshold: int,
                  enable_chunked_prefill: bool) -> int:
    """Tokens a request with ``num_uncomputed`` tokens left computes this step, with ``token_budget`` left."""
    if not enable_chunked_prefill:
        return num_uncomputed if num_uncomputed < token_budget else 0  # BUG: a prompt of exactly the budget waits
    if num_uncomputed > 1 and long_prefill_token_threshold > 0:
        num_uncomputed = min(num_uncomputed, long_prefill_token_threshold)
    return min(num_uncomputed, token_budget)


def blocks_needed(num_computed: int, num_new: int, num_held_blocks: int, block_size: int) -> int:
    """New KV blocks for ``num_new`` more tokens after ``num_computed``, holding ``num_held_blocks`` already."""
    return max(0, -(-(num_computed + num_new) // block_size) - num_held_blocks)


def admission_chunk(num_uncomputed: int, num_computed: int, num_held_blocks: int, token_budget: int,
                    free_blocks: int, block_size: int, long_prefill_token_threshold: int,
                    enable_chunked_prefill: bool) -> int:
    """The first chunk of a waiting request, or 0 when its new blocks do not fit in ``free_blocks``."""
    num_new = prefill_chunk(num_uncomputed, token_budget, long_prefill_token_threshold, enable_chunked_prefill)
    if blocks_needed(num_computed, num_new, num_held_blocks, block_size) > free_blocks:
        return 0  # it waits for blocks: admitting it would take blocks the running requests need
    return num_new


def fill_step(step) -> None:
    """Decodes first, then the running requests' prefill chunks, then new prompts, while the budget lasts."""
    running = step.unscheduled_running()
    for request in [r for r in running if r.is_decode] + [r for r in running if not r.is_decode]:
        if step.budget == 0:
            break
        if request.status is RequestStatus.RUNNING:  # not preempted earlier in this step to make room
            step.run(request)
    while step.budget > 0 and step.admit_next() > 0:
        pass
