"""Lab 3: chunked prefill. Write how one engine step spends its token budget.

Each step computes at most ``max_num_batched_tokens`` tokens (the budget). Running requests come first: a decode
needs 1 token, and it must never wait behind a long prompt (that would stall every stream's next token). Then
the running requests' unfinished prompts get chunks, each at most ``long_prefill_token_threshold`` tokens (when
that is > 0). What is left admits new prompts, but only with chunks whose new KV blocks fit in the free blocks:

    budget 16, threshold 6        step:  [d1][d2][d3] [p1 p1 p1 p1 p1 p1] [w1 w1 w1 w1 w1 w1] [w2]
                                          decodes     a running prefill    a new prompt        budget ends
    without chunked prefill a prompt runs whole in one step, or waits for a step with room for all of it.

Grade: ``python -m minengine lab grade chunked_prefill labs/chunked_prefill/chunked_prefill.py``.
"""

from __future__ import annotations

from minengine.request import RequestStatus  # noqa: F401 (request.status is RequestStatus.RUNNING until preempted)


def prefill_chunk(num_uncomputed: int, token_budget: int, long_prefill_token_threshold: int,
                  enable_chunked_prefill: bool) -> int:
    """How many tokens a request computes this step.

    Args:
        num_uncomputed: its tokens without K/V yet (1 for a decode).
        token_budget: tokens left in this step's budget.
        long_prefill_token_threshold: the largest prefill chunk (0 = no cap); a decode is never capped below 1.
        enable_chunked_prefill: False: a prompt runs whole in one step (all of ``num_uncomputed`` if it fits in
            ``token_budget``) or not at all (0); the threshold then does not apply.

    Returns:
        tokens, 0 <= tokens <= min(num_uncomputed, token_budget).
    """
    raise NotImplementedError("implement prefill_chunk: min of what is left, the budget and the threshold")


def blocks_needed(num_computed: int, num_new: int, num_held_blocks: int, block_size: int) -> int:
    """New KV blocks a request needs to hold ``num_computed + num_new`` tokens when it holds ``num_held_blocks``
    blocks of ``block_size`` slots (never negative)."""
    raise NotImplementedError("implement blocks_needed: ceil((num_computed + num_new) / block_size) - held, >= 0")


def admission_chunk(num_uncomputed: int, num_computed: int, num_held_blocks: int, token_budget: int,
                    free_blocks: int, block_size: int, long_prefill_token_threshold: int,
                    enable_chunked_prefill: bool) -> int:
    """The first chunk of a waiting request (``prefill_chunk``), or 0 when the KV blocks that chunk needs
    (``blocks_needed``) are more than ``free_blocks``: it waits rather than take blocks from running requests.

    ``num_computed`` tokens are already in ``num_held_blocks`` blocks (a prefix-cache hit), ``num_uncomputed``
    remain.
    """
    raise NotImplementedError("implement admission_chunk: prefill_chunk, then 0 if its blocks exceed free_blocks")


def fill_step(step) -> None:
    """Spend ``step``'s budget: every running decode first, then the running requests' prefill chunks (both in
    ``step.unscheduled_running()`` order), then admit waiting requests until nothing more fits.

    The moves (``minengine/core/step_builder.py``): ``step.budget`` (tokens left), ``step.unscheduled_running()``
    (running requests not yet scheduled, a list), ``request.is_decode``, ``step.run(request)`` (schedules its next
    chunk, sized by your ``prefill_chunk``; it may preempt a later running request to free blocks: skip requests
    whose ``status`` is no longer ``RequestStatus.RUNNING``), ``step.admit_next()`` (admits the next waiting request
    with your ``admission_chunk``; returns its tokens, 0 when nothing was admitted).
    """
    raise NotImplementedError("implement fill_step: run decodes, then prefills, then admit_next until it returns 0")
