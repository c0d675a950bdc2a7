"""SchedulerConfig: the scheduler's limits and switches, frozen, built once from ``EngineConfig``.

The scheduler and every ``StepBuilder`` read the same object (vLLM's ``SchedulerConfig``): nothing is copied field by
field per step. Which optional doors the scheduler opens (async scheduling, swap, speculative decoding, predicted
admission) is read from here once, at construction (``core/doors.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from minengine.request import Request

PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits of one step and the scheduler's switches.

    Attributes:
        max_num_batched_tokens: the token budget of a step (prefill + decode tokens).
        max_num_seqs: sequence slots (most running requests).
        max_model_len: most tokens per request; reaching it finishes the request with "length".
        enable_chunked_prefill: allow prompts to be split over steps; otherwise a prompt runs in one step.
        long_prefill_token_threshold: cap on one request's prefill chunk per step (0 = no cap).
        preemption_mode: "recompute" or "swap" (the swap door, ``core/swap_preemption.py``).
        swap_space_blocks: CPU swap blocks for "swap" mode (0: every preemption recomputes).
        shrink_prefill_chunks: the admission probe: shrink a new prefill chunk that does not fit to what fits
            (down to one block) instead of leaving the request waiting.
        reserve_predicted_kv: predicted-length-aware admission (``core/predicted_admission.py``).
        async_scheduling: schedule step N+1 before step N is committed (``core/async_scheduler.py``).

    Raises:
        ValueError: an unknown ``preemption_mode`` or a negative ``swap_space_blocks``.
    """

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    preemption_mode: str = "recompute"
    swap_space_blocks: int = 0
    shrink_prefill_chunks: bool = False
    reserve_predicted_kv: bool = False
    async_scheduling: bool = False

    def __post_init__(self):
        if self.preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {self.preemption_mode!r}")
        if self.swap_space_blocks < 0:
            raise ValueError(f"swap_space_blocks must be >= 0, got {self.swap_space_blocks}")

    def chunk(self, num_uncomputed: int, token_budget: int) -> int:
        """How many of a request's uncomputed tokens it may compute this step (the prefill-chunk cap applies
        only with chunked prefill: without it a prompt runs in one step)."""
        if num_uncomputed > 1 and self.long_prefill_token_threshold > 0 and self.enable_chunked_prefill:
            num_uncomputed = min(num_uncomputed, self.long_prefill_token_threshold)
        return min(num_uncomputed, token_budget)

    def reaches_length_limit(self, request: Request, num_more: int) -> bool:
        """Whether ``num_more`` more tokens finish ``request`` by length (``max_model_len`` or ``max_tokens``)."""
        return (request.num_tokens + num_more >= self.max_model_len
                or request.num_output_tokens + num_more >= request.sampling_params.max_tokens)
