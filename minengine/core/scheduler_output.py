"""SchedulerOutput and ScheduledRequest: the plain data the scheduler hands to the model runner."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from minengine.sampling_params import SamplingParams

# Async scheduling: the id in ``ScheduledRequest.token_ids`` of a token that the step still in flight samples
# (not yet known when the next step is scheduled); the worker puts the token it sampled there.
PLACEHOLDER_TOKEN_ID = -1


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step (read-only by convention; not ``frozen`` because one is built per
    scheduled request per step and a frozen dataclass costs ~3x more to build).

    Attributes:
        request_id: the request.
        token_ids: the ``num_new_tokens`` token ids to compute this step (a prefill chunk, or 1 for decode);
            with async scheduling a decode's token may be ``PLACEHOLDER_TOKEN_ID`` (sampled by the step in flight).
        start_pos: ``num_computed_tokens`` before the step: the position of ``token_ids[0]``.
        block_ids: the request's whole block table after allocation (physical block ids, logical order).
        sample: True when the step reaches the end of the request's known tokens, so the last position's
            logits are sampled; intermediate prefill chunks skip the LM head and the sampler.
        is_prefill: False only for a decode (one new token that is the request's latest generated token).
        sampling_params: the request's sampling settings.
        output_index: how many tokens the request has generated so far (the index of the token to sample),
            with async scheduling the tokens of the step in flight included.
        prompt_token_ids, output_token_ids: the request's tokens so far, read-only, for the sampler's
            penalties and prompt logprobs (the request's own lists: no copy per step).
        spec_token_ids: speculative decoding: the proposed tokens, the last ``len(spec_token_ids)`` of
            ``token_ids`` (a decode's ``token_ids`` is then ``[latest token] + spec_token_ids``); the sampler
            verifies all of them in this step (``core/spec_decode.py``). Empty for every other request.
        structured_output: the request's grammar state (``Request.structured_output``), read by the sampler to
            mask its rows; None for an unconstrained request.
    """

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_ids: list[int]
    sample: bool
    is_prefill: bool
    sampling_params: SamplingParams
    output_index: int
    prompt_token_ids: Sequence[int] = field(default=(), repr=False, compare=False)
    output_token_ids: Sequence[int] = field(default=(), repr=False, compare=False)
    spec_token_ids: Sequence[int] = ()
    structured_output: object | None = field(default=None, repr=False, compare=False)

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_spec_tokens(self) -> int:
        """Speculative (proposed) tokens among ``token_ids``."""
        return len(self.spec_token_ids)

    @property
    def num_sampled(self) -> int:
        """Positions whose logits go through the LM head and the sampler: 0 for an intermediate prefill chunk,
        1 for a normal step, 1 + k for a decode verifying k proposals (what ``minengine.timing`` costs)."""
        return 1 + len(self.spec_token_ids) if self.sample else 0

    @property
    def seq_len(self) -> int:
        """Tokens with K/V in the cache once this step has written its new ones."""
        return self.start_pos + len(self.token_ids)


@dataclass
class SchedulerOutput:
    """Everything one step computes, plus what the scheduler decided on the way (for metrics and traces).

    Attributes:
        scheduled: requests in the order the scheduling policy scheduled them.
        preempted_ids: requests preempted (by recompute or swap) during this ``schedule()``.
        admitted_ids: requests moved from waiting to running this step.
        prefix_queried_tokens / prefix_hit_tokens: prompt tokens looked up in / served by the prefix cache
            for the requests admitted for the first time this step (vLLM's counting since PR #25787).
        readmission_hit_tokens: tokens the prefix cache gave back to recompute-preempted requests re-admitted
            this step (their own freed blocks, mostly): work a recompute preemption did not have to redo.
        blocks_to_swap_out: (GPU block id, CPU swap block id) pairs whose KV the runner copies to the swap
            space BEFORE the forward (the GPU blocks may be reused by this very step).
        blocks_to_swap_in: (CPU swap block id, GPU block id) pairs the runner copies back, after the
            swap-outs and before the forward (vLLM v0's ``blocks_to_swap_in`` / ``blocks_to_swap_out``).
        num_spec_tokens: speculative tokens in the step (the sum of the requests' ``num_spec_tokens``), so the
            runner knows at once whether any position beyond each request's last one is sampled.
        windowed_block_ids: a model with two KV cache groups (``core/hybrid_kv_cache_manager.py``): each
            scheduled request's block table in the windowed layers' group (``block_ids`` is then the
            full-attention group's); empty for a model with one group.
    """

    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted_ids: list[str] = field(default_factory=list)
    admitted_ids: list[str] = field(default_factory=list)
    prefix_queried_tokens: int = 0
    prefix_hit_tokens: int = 0
    readmission_hit_tokens: int = 0
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    num_spec_tokens: int = 0
    windowed_block_ids: dict[str, list[int]] = field(default_factory=dict)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled
