"""StepBuilder: one step under construction, and the moves a scheduling policy may make on it.

A policy (``core/policies.py``) decides the order; the builder does the mechanics every policy shares:
chunking under the token budget, allocating KV blocks, preempting a victim the policy picks when blocks run
out, admitting waiting requests (a prefix-cache hit, then a first chunk), and recording the step's
``SchedulerOutput``.

Data flows down: the ``Scheduler`` hands the builder what a step needs (the KV cache manager, its queues, the
``SchedulerConfig``) and the policy's queue order (``QueueOrder``); the builder never looks back at the
scheduler, and it records every move in the ``SchedulerOutput`` and in its ``StateBeforeStep`` list, which the scheduler
keeps to commit or roll back the step.

This class is the default step only. Optional features are mixins that override one named method each
(``core/doors.py`` composes them at construction): async scheduling (``core/async_scheduler.py``), swap
preemption (``core/swap_preemption.py``), speculative decoding (``core/spec_scheduling.py``) and
predicted-length admission (``core/predicted_admission.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.request_set import RequestSet
from minengine.core.scheduler_config import SchedulerConfig
from minengine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from minengine.request import Request, RequestStatus


class QueueOrder(Protocol):
    """The two choices of the scheduling policy that the builder asks for while it makes its moves (every
    ``SchedulingPolicy`` is one; see ``core/policies.py`` for their meaning)."""

    def next_waiting(self, waiting: Sequence[Request], step_index: int) -> Request:
        """The waiting request to admit next."""
        ...

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        """The running request to preempt, among ``candidates``."""
        ...


def reset_for_recompute(request: Request) -> None:
    """A recompute preemption: nothing computed any more; the re-prefill covers prompt + outputs (with async
    scheduling, also the token its step in flight samples)."""
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.prefill_len = request.num_tokens + request.num_output_placeholders


@dataclass(slots=True)
class StateBeforeStep:
    """One scheduled request's state before the step, so that a failed step can give it back
    (``Scheduler.rollback``): its first ``num_blocks`` blocks, status, progress, swap blocks and received KV.
    Read-only by convention (not ``frozen``: one is made per scheduled request per step, and a frozen dataclass
    costs more to build)."""

    request: Request
    num_blocks: int
    status: RequestStatus
    num_computed_tokens: int
    swapped_block_ids: tuple[int, ...]
    num_cached_tokens: int
    last_scheduled_step: int | None
    num_external_computed_tokens: int = 0

    @classmethod
    def of(cls, request: Request, num_blocks: int) -> StateBeforeStep:
        return cls(request, num_blocks, request.status, request.num_computed_tokens,
                   tuple(request.swapped_block_ids), request.num_cached_tokens, request.last_scheduled_step,
                   request.num_external_computed_tokens)


class StepBuilder:
    """The step being built.

    Args:
        kv: the KV cache manager (block tables, prefix cache).
        policy: the scheduling policy's queue order (``QueueOrder``).
        config: the scheduler's ``SchedulerConfig`` (the budget, the slots, the chunking rules).
        waiting: the scheduler's waiting queue; admissions take from it, preemptions put back at its front.
        running: the scheduler's running requests in admission order (a ``RequestSet``); admissions append,
            preemptions remove.
        step_index: the scheduler's step count (for priority aging and round-robin turns).
        out: where the moves are recorded (default: a new ``SchedulerOutput``).

    Attributes:
        budget: tokens left of ``max_num_batched_tokens``.
        out: the ``SchedulerOutput`` filled as requests are scheduled, preempted and admitted.
        undo: the state before the step of every request scheduled in it (see ``StateBeforeStep``).
        waiting_before: the waiting queue as it was before this step's first admission or preemption changed
            it (what a rollback restores), None while unchanged: copied once, and only by a step that changes it.
        num_preemptions: this builder's preemptions, which the scheduler adds to its total.
    """

    def __init__(self, kv: KVCacheManager, policy: QueueOrder, config: SchedulerConfig, waiting: deque[Request],
                 running: RequestSet, step_index: int, out: SchedulerOutput | None = None):
        self.kv = kv
        self.policy = policy
        self.config = config
        self.waiting = waiting
        self.running = running
        self.budget = config.max_num_batched_tokens
        self.step_index = step_index
        self.out = SchedulerOutput() if out is None else out
        self._scheduled: list[tuple[Request, int]] = []  # (request, tokens scheduled for it), in order
        self._num_new: dict[str, int] = {}  # request id -> tokens scheduled for it in this step
        self.undo: list[StateBeforeStep] = []
        self.waiting_before: list[Request] | None = None
        # ``blocks_for_next_token(running)``, computed at the first admission that reserves them and kept up to
        # date by the admissions after it (a run or a preemption drops it: it is computed again if needed).
        self._next_token_blocks: int | None = None
        self.num_preemptions = 0

    # ---- what the policy can look at ------------------------------------------------------------------
    def is_scheduled(self, request: Request) -> bool:
        return request.request_id in self._num_new

    @property
    def is_empty(self) -> bool:
        """Nothing scheduled yet this step."""
        return not self._scheduled

    def unscheduled_running(self) -> list[Request]:
        """Running requests with nothing scheduled yet this step, in running (admission) order."""
        if not self._num_new:  # at the start of a step: all of them, copied at C speed
            return list(self.running)
        return [r for r in self.running if r.request_id not in self._num_new]

    def peek_waiting(self) -> Request | None:
        """The waiting request the policy would admit next, or None when nobody waits."""
        return self.policy.next_waiting(self.waiting, self.step_index) if self.waiting else None

    # ---- moves ----------------------------------------------------------------------------------------
    def run(self, request: Request, limit: int | None = None) -> int:
        """Schedule a running request's next chunk (at most ``limit`` tokens and what is left of the budget),
        preempting victims the policy picks until its blocks fit.

        Returns:
            tokens scheduled; 0 when the request itself was the victim (or nothing fits the limit).
        """
        limit = self.budget if limit is None else min(limit, self.budget)
        num_uncomputed = self.num_uncomputed(request)
        # a decode (or a prefill's last token) needs no chunking: skip the call
        num_new = min(1, limit) if num_uncomputed == 1 else self.config.chunk(num_uncomputed, limit)
        if num_new <= 0:
            return 0
        undo = self._undo_running(request)
        while self.kv.allocate_slots(request, num_new) is None:
            victim = self.policy.pick_victim(self.unscheduled_running(), self.step_index)
            self.preempt(victim)
            if victim is request:
                return 0
        self.schedule_chunk(request, num_new, undo)
        return num_new

    def num_uncomputed(self, request: Request) -> int:
        """Tokens of ``request`` without K/V in the cache yet."""
        return request.num_tokens - request.num_computed_tokens

    def preempt(self, request: Request) -> None:
        """Take a running request off the GPU and put it at the FRONT of the waiting queue (``evict`` says how:
        by default recompute, its blocks freed and ``num_computed_tokens`` back to 0; the generated tokens stay,
        so the re-prefill continues where it was)."""
        self._waiting_changes()
        self.running.remove(request)
        self._next_token_blocks = None
        self.evict(request)
        self.kv.free(request)
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        self.out.preempted_ids.append(request.request_id)

    def evict(self, request: Request) -> None:
        """What a preemption does with the victim's K/V: recompute (drop it; the swap door keeps it)."""
        reset_for_recompute(request)

    def run_all(self, requests: Iterable[Request], cap: int | None = None) -> int:
        """``run`` each request in order while the budget (and ``cap`` tokens in all) lasts; requests
        preempted meanwhile or already scheduled are skipped. Returns the tokens scheduled."""
        used, scheduled, running = 0, self._num_new, RequestStatus.RUNNING
        for request in requests:
            left = self.budget if cap is None else min(self.budget, cap - used)
            if left <= 0:
                break
            if request.status is not running or request.request_id in scheduled:  # ``is_scheduled``
                continue
            used += self.run(request, left)
        return used

    def admit_next(self, limit: int | None = None, reserve_running: bool = False) -> int:
        """Admit the waiting request the policy picks with a first chunk of at most ``limit`` tokens.

        Nothing is admitted when nobody waits, the budget or the sequence slots are used up, somebody was
        preempted in this step (memory is short: admitting would only preempt again), or its blocks do not
        fit in the free blocks (after the admission probe, when enabled). With ``reserve_running`` (a policy
        that admits before some running requests) the free blocks exclude what every running request needs
        for its next token (``blocks_for_next_token``): an admission must never make a running request preempt
        itself, or two requests could take turns preempting each other forever. Returns the tokens scheduled
        (0 = nothing admitted).
        """
        limit = self.budget if limit is None else min(limit, self.budget)
        if (not self.waiting or limit <= 0 or len(self.running) >= self.config.max_num_seqs
                or self.out.preempted_ids):
            return 0
        request = self.policy.next_waiting(self.waiting, self.step_index)
        free = self.kv.num_free_blocks
        if reserve_running:
            if self._next_token_blocks is None:  # once per step, not once per admission
                self._next_token_blocks = self.blocks_for_next_token(self.running)
            free -= self._next_token_blocks
        undo = StateBeforeStep.of(request, 0)
        num_new = self.first_chunk(request, limit, free)
        if num_new == 0:
            return 0
        self._waiting_changes()
        self.waiting.remove(request)
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self.out.admitted_ids.append(request.request_id)
        self.schedule_chunk(request, num_new, undo)
        if self._next_token_blocks is not None:  # the newcomer's own need joins the others'
            self._next_token_blocks += self.blocks_for_next_token((request,))
        return num_new

    def admit_all(self, cap: int | None = None, reserve_running: bool = False) -> int:
        """``admit_next`` until it admits nothing (or ``cap`` tokens are used). Returns the tokens scheduled."""
        used = 0
        while (left := self.budget if cap is None else min(self.budget, cap - used)) > 0:
            num_new = self.admit_next(left, reserve_running)
            if num_new == 0:
                break
            used += num_new
        return used

    # ---- admission mechanics --------------------------------------------------------------------------
    def first_chunk(self, request: Request, limit: int, free: int) -> int:
        """Blocks for a (re)started prompt out of ``free`` blocks: the prefix-cache hit, the tokens whose KV
        arrives from elsewhere (``num_external_computed_tokens``, all or nothing), then a first chunk.
        Returns the chunk's tokens (0: it does not fit, nothing allocated)."""
        hit_blocks, num_hit = self.kv.get_computed_blocks(request)
        num_external = max(0, min(request.num_external_computed_tokens, request.num_tokens - 1) - num_hit)
        num_uncomputed = request.num_tokens - num_hit - num_external
        if not self.config.enable_chunked_prefill and num_uncomputed > limit:
            return 0
        num_new = self.config.chunk(num_uncomputed, limit)
        free -= sum(1 for b in hit_blocks if b.ref_cnt == 0)  # hit blocks in the free queue are taken back
        if self.kv.num_blocks_needed(request, num_external + num_new, len(hit_blocks)) > free:
            if num_external:
                return 0  # the received KV needs all its blocks at once
            num_new = self.shrink_to_fit(num_new, free, already_computed=num_hit)
            if num_new == 0:
                return 0
        if self.kv.allocate_slots(request, num_external + num_new, hit_blocks) is None:
            raise RuntimeError("admission allocation failed after the free-block check")  # a bug guard
        request.num_computed_tokens = num_hit + num_external  # the prefix hit and the received KV are computed
        request.num_external_computed_tokens = 0  # received once: after a recompute preemption it is recomputed
        self._count_prefix_hit(request, num_hit)
        return num_new

    def _count_prefix_hit(self, request: Request, num_hit: int) -> None:
        if request.status is RequestStatus.WAITING:  # first admission: what the prefix cache statistics count
            request.num_cached_tokens = num_hit
            self.out.prefix_queried_tokens += request.num_tokens
            self.out.prefix_hit_tokens += num_hit
        else:  # re-admission after a recompute preemption: its own freed blocks, counted apart (vLLM #25787)
            self.out.readmission_hit_tokens += num_hit

    def blocks_for_next_token(self, requests: Iterable[Request]) -> int:
        """New blocks these running requests need to compute one more token each beyond what this step
        already gives them: a decode's need for one not yet scheduled, and for one scheduled in this step, the
        block its next step starts with (so an admission cannot take it and leave it to preempt itself)."""
        return sum(self.kv.num_blocks_needed(r, self._num_new.get(r.request_id, 0) + 1) for r in requests
                   if r.status is RequestStatus.RUNNING)

    def shrink_to_fit(self, num_new: int, free_blocks: int, already_computed: int) -> int:
        """The admission probe: the largest chunk <= ``num_new`` whose new blocks fit in ``free_blocks`` (down
        to one block), or 0 when shrinking is off (``shrink_prefill_chunks``), prefill cannot be chunked, or not
        one block is free.

        ``already_computed`` is the request's ``num_computed_tokens`` once its held (or hit) blocks are in
        place; the empty slots of its last held block take chunk tokens without a new block.
        """
        config = self.config
        if not config.shrink_prefill_chunks or not config.enable_chunked_prefill or free_blocks < 1:
            return 0
        slack = (-already_computed) % self.kv.block_size
        return min(num_new, free_blocks * self.kv.block_size + slack)

    def _waiting_changes(self) -> None:
        if self.waiting_before is None:
            self.waiting_before = list(self.waiting)

    # ---- output ---------------------------------------------------------------------------------------
    def _undo_running(self, request: Request) -> StateBeforeStep:
        """A running request's state before this step (it holds no swap blocks)."""
        self._next_token_blocks = None  # this request's need changes
        return StateBeforeStep(request, len(self.kv.req_to_blocks.get(request.request_id, ())), RequestStatus.RUNNING,
                    request.num_computed_tokens, (), request.num_cached_tokens, request.last_scheduled_step,
                    request.num_external_computed_tokens)

    def schedule_chunk(self, request: Request, num_new: int, undo: StateBeforeStep) -> None:
        """Schedule ``num_new`` tokens of ``request``: spend the budget, remember how to undo it, and stage the
        blocks the chunk completes (indexed in the prefix cache only once the step has really run)."""
        self._scheduled.append((request, num_new))
        self._num_new[request.request_id] = num_new
        self.undo.append(undo)
        self.budget -= num_new
        request.last_scheduled_step = self.step_index
        self.kv.stage_full_blocks(request, self.known_end(request, num_new))

    def known_end(self, request: Request, num_new: int) -> int:
        """The end of the request's known tokens once this step's ``num_new`` are computed: the blocks before
        it may be staged for the prefix cache."""
        return request.num_computed_tokens + num_new

    @property
    def scheduled_requests(self) -> list[Request]:
        """The requests scheduled so far, in scheduling order (``build``'s order)."""
        return [request for request, _ in self._scheduled]

    def build(self) -> SchedulerOutput:
        """The finished step: every scheduled request as a ``ScheduledRequest``, in scheduling order."""
        self.out.scheduled.extend(self.scheduled_request(request, num_new) for request, num_new in self._scheduled)
        return self.out

    def scheduled_request(self, request: Request, num_new: int) -> ScheduledRequest:
        """``request``'s share of this step: ``num_new`` token ids from ``num_computed_tokens`` on."""
        start = request.num_computed_tokens
        end = start + num_new
        prompt, output = request.prompt_token_ids, request.output_token_ids
        num_tokens = len(prompt) + len(output)
        if end == num_tokens and start == num_tokens - 1 and output:  # a decode: its latest token
            token_ids = [output[-1]]
        else:
            token_ids = request.token_ids_slice(start, end)
        return ScheduledRequest(
            request_id=request.request_id,
            token_ids=token_ids,
            start_pos=start,
            block_ids=self.kv.get_block_ids(request.request_id),
            sample=end == num_tokens,
            is_prefill=not (num_tokens - start == 1 and start >= request.prefill_len),  # ``Request.is_decode``
            sampling_params=request.sampling_params,
            output_index=len(output),
            prompt_token_ids=prompt,
            output_token_ids=output,
            structured_output=request.structured_output,
        )
