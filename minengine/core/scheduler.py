"""Scheduler: continuous batching with chunked prefill under a token budget and a KV block budget.

Each ``schedule()`` builds one step (iteration-level scheduling, Orca, Yu et al., OSDI 2022) under three
limits: the token budget ``max_num_batched_tokens``, the free KV blocks and the sequence slots
``max_num_seqs``. A prompt larger than what is left of the budget is cut into chunks (Sarathi-Serve, Agrawal
et al., OSDI 2024), so prefill chunks and decodes share one step. Which work goes first is the scheduling
policy's choice (``core/policies.py``; the default, decode-first, serves running requests before new ones).
When a running request needs a block and none is free, a running request not yet scheduled this step is
preempted (the policy picks which; by default the most recently admitted, as vLLM v1): by recompute, or by
swapping its KV blocks to a CPU swap space (vLLM v0) when ``preemption_mode="swap"`` and the space has room.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.policies import PolicySettings, SchedulingPolicy, make_policy
from minengine.core.scheduler_output import SchedulerOutput
from minengine.core.step_builder import StepBuilder
from minengine.core.swap_space import SwapSpace
from minengine.request import Request, RequestStatus

PREEMPTION_MODES = ("recompute", "swap")


class Scheduler:
    """Decides, step by step, which requests compute how many tokens.

    Args:
        kv_cache_manager: owner of the block tables and the prefix cache.
        max_num_batched_tokens: token budget per step (prefill + decode tokens).
        max_num_seqs: sequence slots (most running requests).
        max_model_len: most tokens per request; reaching it finishes the request with "length".
        enable_chunked_prefill: allow prompts to be split over steps; otherwise a prompt runs in one step.
        long_prefill_token_threshold: cap on one request's prefill chunk per step (0 = no cap).
        policy: a ``SchedulingPolicy`` or a name in ``POLICIES`` (built with ``policy_settings``).
        policy_settings: knobs for a policy given by name.
        preemption_mode: "recompute" or "swap".
        swap_space_blocks: CPU swap blocks for "swap" mode (0: every preemption recomputes).
        shrink_prefill_chunks: the admission probe: shrink a new prefill chunk that does not fit to what
            fits (down to one block) instead of leaving the request waiting.

    Raises:
        ValueError: unknown policy or preemption mode, negative swap space.
    """

    def __init__(self, kv_cache_manager: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int,
                 max_model_len: int, enable_chunked_prefill: bool = True, long_prefill_token_threshold: int = 0,
                 *, policy: SchedulingPolicy | str = "decode-first", policy_settings: PolicySettings | None = None,
                 preemption_mode: str = "recompute", swap_space_blocks: int = 0,
                 shrink_prefill_chunks: bool = False):
        if preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {preemption_mode!r}")
        self.kv = kv_cache_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.policy = make_policy(policy, policy_settings) if isinstance(policy, str) else policy
        self.preemption_mode = preemption_mode
        self.swap_space = SwapSpace(swap_space_blocks if preemption_mode == "swap" else 0)
        self.shrink_prefill_chunks = shrink_prefill_chunks
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order
        self.num_steps = 0
        self.num_preemptions = 0
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0

    # ---- queue management -----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use by an unfinished request")
        request.arrival_step = self.num_steps
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """Finish requests in any state (used for aborts, timeouts and stop strings); frees their blocks
        (and swap blocks). Unknown or already finished ids are ignored. Returns the requests finished now."""
        done = []
        for rid in request_ids:
            request = self.requests.pop(rid, None)
            if request is None:
                continue
            if request in self.running:
                self.running.remove(request)
            else:
                self.waiting.remove(request)
            self.kv.free(request)
            self.swap_space.release(request.swapped_block_ids)
            request.swapped_block_ids = []
            request.status = status
            done.append(request)
        return done

    # ---- one step -------------------------------------------------------------------------------------
    def chunk(self, num_uncomputed: int, token_budget: int) -> int:
        """How many of a request's uncomputed tokens it may compute this step."""
        if num_uncomputed > 1 and self.long_prefill_token_threshold > 0:
            num_uncomputed = min(num_uncomputed, self.long_prefill_token_threshold)
        return min(num_uncomputed, token_budget)

    def preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Take a running request off the GPU and put it at the FRONT of the waiting queue.

        Swap (when ``preemption_mode="swap"`` and the swap space has room for all its blocks): its blocks'
        KV is copied to CPU blocks (``out.blocks_to_swap_out``, done by the runner before the forward) and
        ``num_computed_tokens`` is kept. Otherwise recompute: the blocks are freed and ``num_computed_tokens``
        goes back to 0; the generated tokens stay, so the re-prefill continues where it was.
        """
        self.running.remove(request)
        gpu_ids = self.kv.get_block_ids(request.request_id)
        if self.preemption_mode == "swap" and gpu_ids and len(gpu_ids) <= self.swap_space.num_free_blocks:
            cpu_ids = self.swap_space.allocate(len(gpu_ids))
            out.blocks_to_swap_out.extend(zip(gpu_ids, cpu_ids))
            request.swapped_block_ids = cpu_ids
            request.status = RequestStatus.SWAPPED
            self.num_swapped_out_blocks += len(gpu_ids)
        else:
            request.status = RequestStatus.PREEMPTED
            request.num_computed_tokens = 0
        self.kv.free(request)  # freed blocks may be reused this step: the runner swaps out before the forward
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        out.preempted_ids.append(request.request_id)

    def schedule(self) -> SchedulerOutput:
        """Build the next step with the scheduling policy (see ``StepBuilder`` for the moves it makes)."""
        self.swap_space.begin_step()
        step = StepBuilder(self)
        self.policy.fill(step)
        self.num_steps += 1
        return step.build()

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           sampled_token_ids: dict[str, int]) -> tuple[list[Request], list[Request]]:
        """Advance ``num_computed_tokens``, append sampled tokens and stop finished requests.

        Args:
            scheduler_output: the step that just ran.
            sampled_token_ids: request id -> sampled token, for every scheduled request with ``sample``.

        Returns:
            (requests that got a new token, requests that finished this step).
        """
        got_token, finished = [], []
        for s in scheduler_output.scheduled:
            request = self.requests.get(s.request_id)
            if request is None:  # aborted while the step ran
                continue
            request.num_computed_tokens += s.num_new_tokens
            if not s.sample:
                continue
            request.output_token_ids.append(sampled_token_ids[s.request_id])
            got_token.append(request)
            status = self._check_stop(request)
            if status is not None:
                finished.extend(self.finish_requests([request.request_id], status))
        return got_token, finished

    def _check_stop(self, request: Request) -> RequestStatus | None:
        """vLLM's order: length first, then EOS, then stop token ids."""
        params = request.sampling_params
        if request.num_tokens >= self.max_model_len or request.num_output_tokens >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        last = request.output_token_ids[-1]
        if not params.ignore_eos and request.eos_token_id is not None and last == request.eos_token_id:
            return RequestStatus.FINISHED_STOPPED
        if last in params.stop_token_ids:
            request.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
        return None

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)
