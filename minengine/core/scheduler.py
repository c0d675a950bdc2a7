"""Scheduler: continuous batching with chunked prefill under a token budget and a KV block budget.

Each ``schedule()`` builds one step (iteration-level scheduling, Orca, Yu et al., OSDI 2022): first the
running requests (decode-first, which protects TPOT), then waiting ones, all under three limits: the token
budget ``max_num_batched_tokens``, the free KV blocks and the sequence slots ``max_num_seqs``. A prompt
larger than what is left of the budget is cut into chunks (Sarathi-Serve, Agrawal et al., OSDI 2024), so
prefill chunks and decodes share one step. When a running request needs a block and none is free, the most
recently admitted running request not yet scheduled this step is preempted by recompute (vLLM v1).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from minengine.request import Request, RequestStatus


class Scheduler:
    """Decides, step by step, which requests compute how many tokens.

    Args:
        kv_cache_manager: owner of the block tables and the prefix cache.
        max_num_batched_tokens: token budget per step (prefill + decode tokens).
        max_num_seqs: sequence slots (most running requests).
        max_model_len: most tokens per request; reaching it finishes the request with "length".
        enable_chunked_prefill: allow prompts to be split over steps; otherwise a prompt runs in one step.
        long_prefill_token_threshold: cap on one request's prefill chunk per step (0 = no cap).
    """

    def __init__(self, kv_cache_manager: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int,
                 max_model_len: int, enable_chunked_prefill: bool = True, long_prefill_token_threshold: int = 0):
        self.kv = kv_cache_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the tail is the preemption victim
        self.num_preemptions = 0

    # ---- queue management -----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use by an unfinished request")
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def finish_requests(self, request_ids: Iterable[str], status: RequestStatus) -> list[Request]:
        """Finish requests in any state (used for aborts and stop strings); frees their blocks.
        Unknown or already finished ids are ignored. Returns the requests that were finished now."""
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
            request.status = status
            done.append(request)
        return done

    # ---- one step -------------------------------------------------------------------------------------
    def _chunk(self, num_uncomputed: int, token_budget: int) -> int:
        """How many of a request's uncomputed tokens it may compute this step."""
        if num_uncomputed > 1 and self.long_prefill_token_threshold > 0:
            num_uncomputed = min(num_uncomputed, self.long_prefill_token_threshold)
        return min(num_uncomputed, token_budget)

    def _allocate_or_preempt(self, request: Request, num_new: int, out: SchedulerOutput) -> bool:
        """Allocate slots for a running request, preempting from the tail of ``running`` until it fits.
        Returns False when the request itself had to be preempted."""
        while self.kv.allocate_slots(request, num_new) is None:
            victim = self.running.pop()  # most recently admitted, not yet scheduled this step
            self._preempt(victim, out)
            if victim is request:
                return False
        return True

    def _preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Recompute-mode preemption: free every block, forget the computed K/V, keep the generated
        tokens, and put the request at the FRONT of the waiting queue."""
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        out.preempted_ids.append(request.request_id)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        scheduled: list[tuple[Request, int]] = []

        # 1) Running requests first: decodes and unfinished prefill chunks.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_new = self._chunk(request.num_tokens - request.num_computed_tokens, budget)
            if not self._allocate_or_preempt(request, num_new, out):
                break  # it was the last running request left to schedule
            scheduled.append((request, num_new))
            budget -= num_new
            i += 1

        # 2) Waiting requests, in order, while the budgets last (none if anyone was just preempted:
        #    memory is short, admitting more would only preempt again).
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted_ids:
            request = self.waiting[0]
            hit_blocks, num_hit = self.kv.get_computed_blocks(request)
            num_uncomputed = request.num_tokens - num_hit
            if not self.enable_chunked_prefill and num_uncomputed > budget:
                break
            num_new = self._chunk(num_uncomputed, budget)
            if self.kv.allocate_slots(request, num_new, hit_blocks) is None:
                break
            request.num_computed_tokens = num_hit  # the prefix hit counts as computed
            self.waiting.popleft()
            if request.status is RequestStatus.WAITING:  # first admission, not a re-admission after preemption
                request.num_cached_tokens = num_hit
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.admitted_ids.append(request.request_id)
            out.prefix_queried_tokens += request.num_tokens
            out.prefix_hit_tokens += num_hit
            scheduled.append((request, num_new))
            budget -= num_new

        for request, num_new in scheduled:
            start = request.num_computed_tokens
            end = start + num_new
            out.scheduled.append(ScheduledRequest(
                request_id=request.request_id,
                token_ids=request.token_ids_slice(start, end),
                start_pos=start,
                block_ids=self.kv.get_block_ids(request.request_id),
                sample=end == request.num_tokens,
                is_prefill=not (num_new == 1 and start >= request.num_prompt_tokens and end == request.num_tokens),
                sampling_params=request.sampling_params,
                output_index=request.num_output_tokens,
            ))
        return out

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
