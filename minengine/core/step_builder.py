"""StepBuilder: one step under construction, and the moves a scheduling policy may make on it.

A policy (``core/policies.py``) decides the order; the builder does the mechanics every policy shares:
chunking under the token budget, allocating KV blocks, preempting a victim the policy picks when blocks run
out, admitting waiting requests (with the admission probe and swap-in), and recording the step's
``SchedulerOutput``.

Data flows down: the ``Scheduler`` hands the builder what a step needs (the KV cache manager, its queues, the
swap space, the proposer, this step's ``StepLimits``) and the policy's queue order (``QueueOrder``); the
builder never looks back at the scheduler, and it records every move in the ``SchedulerOutput`` and in its
``Undo`` list, which the scheduler keeps to commit or roll back the step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from minengine.core.kv_cache_manager import KVCacheManager, cdiv
from minengine.core.request_set import RequestSet
from minengine.core.scheduler_output import PLACEHOLDER_TOKEN_ID, ScheduledRequest, SchedulerOutput
from minengine.core.spec_decode import NgramProposer
from minengine.core.swap_space import SwapSpace
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


@dataclass(frozen=True, slots=True)
class StepLimits:
    """The scheduler's limits and switches for one step (``Scheduler`` documents each; read from its
    attributes at every ``schedule()``)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    preemption_mode: str = "recompute"
    shrink_prefill_chunks: bool = False
    reserve_predicted_kv: bool = False

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


def reset_for_recompute(request: Request) -> None:
    """A recompute preemption: nothing computed any more; the re-prefill covers prompt + outputs (with async
    scheduling, also the token its step in flight samples)."""
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.prefill_len = request.num_tokens + request.num_output_placeholders


@dataclass(slots=True)
class Undo:
    """One scheduled request's state before the step, so that a failed step can give it back
    (``Scheduler.rollback``): its first ``num_blocks`` blocks, status, progress, swap blocks and received KV.
    Read-only by convention (not ``frozen``: one is made per scheduled request per step, and a frozen dataclass
    costs ~3x more to build)."""

    request: Request
    num_blocks: int
    status: RequestStatus
    num_computed_tokens: int
    swapped_block_ids: tuple[int, ...]
    num_cached_tokens: int
    last_scheduled_step: int | None
    num_external_computed_tokens: int = 0

    @classmethod
    def of(cls, request: Request, num_blocks: int) -> Undo:
        return cls(request, num_blocks, request.status, request.num_computed_tokens,
                   tuple(request.swapped_block_ids), request.num_cached_tokens, request.last_scheduled_step,
                   request.num_external_computed_tokens)


class StepBuilder:
    """The step being built.

    Args:
        kv: the KV cache manager (block tables, prefix cache).
        policy: the scheduling policy's queue order (``QueueOrder``).
        limits: this step's ``StepLimits``.
        waiting: the scheduler's waiting queue; admissions take from it, preemptions put back at its front.
        running: the scheduler's running requests in admission order (a ``RequestSet``); admissions append,
            preemptions remove.
        swap_space: the CPU swap space (``preemption_mode="swap"``; size 0 otherwise).
        step_index: the scheduler's step count (for priority aging and round-robin turns).
        proposer: speculative decoding's proposer (``core/spec_decode.py``); None = off.
        out: where the moves are recorded (default: a new ``SchedulerOutput``).

    Attributes:
        budget: tokens left of ``max_num_batched_tokens``.
        out: the ``SchedulerOutput`` filled as requests are scheduled, preempted and admitted.
        undo: the state before the step of every request scheduled in it (see ``Undo``).
        waiting_before: the waiting queue as it was before this step's first admission or preemption changed
            it (what a rollback restores), None while unchanged: copied once, and only by a step that changes it.
        num_preemptions, num_swapped_out_blocks, num_swapped_in_blocks: this builder's moves, which the
            scheduler adds to its totals.
    """

    def __init__(self, kv: KVCacheManager, policy: QueueOrder, limits: StepLimits, waiting: deque[Request],
                 running: RequestSet, swap_space: SwapSpace, step_index: int,
                 proposer: NgramProposer | None = None, out: SchedulerOutput | None = None):
        self.kv = kv
        self.policy = policy
        self.limits = limits
        self.waiting = waiting
        self.running = running
        self.swap_space = swap_space
        self.proposer = proposer
        self.budget = limits.max_num_batched_tokens
        self.step_index = step_index
        self.out = SchedulerOutput() if out is None else out
        self._scheduled: list[tuple[Request, int]] = []
        self._num_new: dict[str, int] = {}  # request id -> tokens scheduled for it in this step
        self._spec: dict[str, list[int]] = {}  # request id -> its proposals in this step (speculative decoding)
        self.undo: list[Undo] = []
        self.waiting_before: list[Request] | None = None
        self._reserved: int | None = None  # reserve_predicted_kv: blocks the running requests still need
        # ``blocks_for_next_token(running)``, computed at the first admission that reserves them and kept up to
        # date by the admissions after it (a run or a preemption drops it: it is computed again if needed).
        self._next_token_blocks: int | None = None
        self.num_preemptions = 0
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0

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
        in_flight = request.num_output_placeholders  # async scheduling: tokens its step in flight samples
        if in_flight and (request.structured_output is not None
                          or self.limits.reaches_length_limit(request, in_flight)):
            # That step's token finishes it ("length"), or its grammar state, which the next token's mask needs,
            # moves only when that token is committed: nothing to schedule until then.
            return 0
        num_uncomputed = request.num_tokens + in_flight - request.num_computed_tokens
        # a decode (or a prefill's last token) needs no chunking: skip the call
        num_new = min(1, limit) if num_uncomputed == 1 else self.limits.chunk(num_uncomputed, limit)
        if num_new <= 0:
            return 0
        self._next_token_blocks = None  # this request's need changes
        undo = Undo(request, len(self.kv.req_to_blocks.get(request.request_id, ())), RequestStatus.RUNNING,
                    request.num_computed_tokens, (), request.num_cached_tokens, request.last_scheduled_step,
                    request.num_external_computed_tokens)  # a running request holds no swap blocks
        if self.proposer is not None and num_new == 1 and request.is_decode:
            spec = self._speculate(request, limit)
            if spec:
                self._spec[request.request_id] = spec
                self._add(request, 1 + len(spec), undo)
                return 1 + len(spec)
        while self.kv.allocate_slots(request, num_new) is None:
            victim = self.policy.pick_victim(self.unscheduled_running(), self.step_index)
            self.preempt(victim)
            if victim is request:
                return 0
        self._add(request, num_new, undo)
        return num_new

    def preempt(self, request: Request) -> None:
        """Take a running request off the GPU and put it at the FRONT of the waiting queue.

        Swap (when ``preemption_mode="swap"`` and the swap space has room for all its blocks): its blocks'
        KV is copied to CPU blocks (``out.blocks_to_swap_out``, done by the runner before the forward) and
        ``num_computed_tokens`` is kept. Otherwise recompute: the blocks are freed and ``num_computed_tokens``
        goes back to 0; the generated tokens stay, so the re-prefill continues where it was.
        """
        self._waiting_changes()
        self.running.remove(request)
        self._next_token_blocks = None
        gpu_ids = self.kv.get_block_ids(request.request_id)
        if (self.limits.preemption_mode == "swap" and gpu_ids
                and len(gpu_ids) <= self.swap_space.num_free_blocks):
            cpu_ids = self.swap_space.allocate(len(gpu_ids))
            self.out.blocks_to_swap_out.extend(zip(gpu_ids, cpu_ids))
            request.swapped_block_ids = cpu_ids
            request.status = RequestStatus.SWAPPED
            self.num_swapped_out_blocks += len(gpu_ids)
        else:
            reset_for_recompute(request)
        self.kv.free(request)  # freed blocks may be reused this step: the runner swaps out before the forward
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        self.out.preempted_ids.append(request.request_id)

    def _speculate(self, request: Request, limit: int) -> list[int]:
        """Proposals for a decode (``core/spec_decode.py``) and their KV slots, or [] (then it decodes plainly).

        At most what the step's ``limit`` leaves beside the decode's own token, and never more than the request
        may still generate (``max_tokens``, ``max_model_len``: the verified step appends up to 1 + proposals).
        Speculation uses only FREE blocks that nobody else in the step may need: the proposals are cut to the
        slots of the request's own blocks plus the free blocks beyond one for every other running request not
        yet scheduled in this step (what its next decode token may need), so proposals never preempt anybody,
        directly or by leaving a later decode of the same step without a block (vLLM v1 would preempt for
        them). Under memory pressure a request therefore speculates only within the blocks it holds."""
        bs = self.kv.block_size
        room = min(limit, self.limits.max_model_len - request.num_tokens,
                   request.sampling_params.max_tokens - request.num_output_tokens) - 1
        if room <= 0:
            return []
        held = len(self.kv.req_to_blocks.get(request.request_id, ()))
        others = len(self.running) - len(self._num_new) - 1  # running, not scheduled yet, not this request
        free = max(0, self.kv.num_free_blocks - max(0, others))
        room = min(room, (held + free) * bs - request.num_computed_tokens - 1)
        spec = self.proposer.propose(request, room) if room > 0 else []
        if spec and self.kv.allocate_slots(request, 1 + len(spec)) is None:
            raise RuntimeError("speculative allocation failed after the free-block check")  # a bug guard
        return spec

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
        if (not self.waiting or limit <= 0 or len(self.running) >= self.limits.max_num_seqs
                or self.out.preempted_ids):
            return 0
        request = self.policy.next_waiting(self.waiting, self.step_index)
        free = self.kv.num_free_blocks
        if reserve_running:
            if self._next_token_blocks is None:  # once per step, not once per admission
                self._next_token_blocks = self.blocks_for_next_token(self.running)
            free -= self._next_token_blocks
        if self.limits.reserve_predicted_kv and not self._fits_predicted(request, free):
            return 0
        undo = Undo.of(request, 0)
        if request.swapped_block_ids:
            num_new = self._swap_in(request, limit, free)
        else:
            num_new = self._allocate_new(request, limit, free)
        if num_new == 0:
            return 0
        self._waiting_changes()
        self.waiting.remove(request)
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self.out.admitted_ids.append(request.request_id)
        self._add(request, num_new, undo)
        if self._next_token_blocks is not None:  # the newcomer's own need joins the others'
            self._next_token_blocks += self.blocks_for_next_token((request,))
        if self._reserved is not None:
            self._reserved += self._predicted_need(request)
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
    def _allocate_new(self, request: Request, limit: int, free: int) -> int:
        """Blocks for a (re)started prompt out of ``free`` blocks: the prefix-cache hit, the tokens whose KV
        arrives from elsewhere (``num_external_computed_tokens``, all or nothing), then a first chunk."""
        if request.num_output_placeholders:  # async: its last token is still in flight (next step: known)
            return 0
        hit_blocks, num_hit = self.kv.get_computed_blocks(request)
        num_external = max(0, min(request.num_external_computed_tokens, request.num_tokens - 1) - num_hit)
        num_uncomputed = request.num_tokens - num_hit - num_external
        if not self.limits.enable_chunked_prefill and num_uncomputed > limit:
            return 0
        num_new = self.limits.chunk(num_uncomputed, limit)
        free -= sum(1 for b in hit_blocks if b.ref_cnt == 0)  # hit blocks in the free queue are taken back
        if self.kv.num_blocks_needed(request, num_external + num_new, len(hit_blocks)) > free:
            if num_external:
                return 0  # the received KV needs all its blocks at once
            num_new = self._probe(num_new, free, already_computed=num_hit)
            if num_new == 0:
                return 0
        if self.kv.allocate_slots(request, num_external + num_new, hit_blocks) is None:
            raise RuntimeError("admission allocation failed after the free-block check")  # a bug guard
        request.num_computed_tokens = num_hit + num_external  # the prefix hit and the received KV are computed
        request.num_external_computed_tokens = 0  # received once: after a recompute preemption it is recomputed
        if request.status is RequestStatus.WAITING:  # first admission: what the prefix cache statistics count
            request.num_cached_tokens = num_hit
            self.out.prefix_queried_tokens += request.num_tokens
            self.out.prefix_hit_tokens += num_hit
        else:  # re-admission after a recompute preemption: its own freed blocks, counted apart (vLLM #25787)
            self.out.readmission_hit_tokens += num_hit
        return num_new

    def _swap_in(self, request: Request, limit: int, free: int) -> int:
        """Blocks for a swapped-out request out of ``free`` blocks: fresh GPU blocks for its saved ones
        (copied in by the runner before the forward) plus those its next chunk needs."""
        if request.num_output_placeholders:  # async: its last token is still in flight (next step: known)
            return 0
        num_saved = len(request.swapped_block_ids)
        num_uncomputed = request.num_tokens - request.num_computed_tokens
        if not self.limits.enable_chunked_prefill and num_uncomputed > limit:
            return 0
        num_new = self.limits.chunk(num_uncomputed, limit)
        if self.kv.num_blocks_needed(request, num_new) > free:  # its table is empty: this counts every block
            if free < num_saved:
                return 0
            num_new = self._probe(num_new, free - num_saved, request.num_computed_tokens)
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

    # ---- predicted-length-aware admission -------------------------------------------------------------
    def predicted_blocks(self, request: Request) -> int:
        """KV blocks ``request`` will hold at its predicted end: prompt + predicted output (at least one more
        token than it has, at most ``max_model_len``)."""
        predicted = request.predicted_output_len
        if predicted is None:
            predicted = request.sampling_params.max_tokens
        final = request.num_prompt_tokens + max(predicted, request.num_output_tokens + 1)
        return cdiv(min(final, self.limits.max_model_len), self.kv.block_size)

    def _predicted_need(self, request: Request) -> int:
        """Blocks ``request`` is predicted to take beyond those it holds."""
        return max(0, self.predicted_blocks(request) - len(self.kv.req_to_blocks.get(request.request_id, ())))

    def _fits_predicted(self, request: Request, free: int) -> bool:
        """``reserve_predicted_kv``: admit ``request`` only when ``free`` blocks cover its predicted blocks
        beyond what the running requests are predicted to need still ("predict the output length, allocate
        for it": S3, Jin et al., NeurIPS 2023), so that fewer running requests are preempted later. A request
        predicted too short is admitted too early and may be preempted (or make others be) when it outgrows
        its prediction. With nothing running, a request is always admitted (else one predicted longer than the
        pool would wait forever)."""
        if not self.running:
            return True
        if self._reserved is None:  # once per step; admissions then add their own need
            self._reserved = sum(self._predicted_need(r) for r in self.running)
        return free - self._reserved >= self.predicted_blocks(request)

    def blocks_for_next_token(self, requests: Iterable[Request]) -> int:
        """New blocks these running requests need to compute one more token each beyond what this step
        already gives them: a decode's need for one not yet scheduled, and for one scheduled in this step, the
        block its next step starts with (so an admission cannot take it and leave it to preempt itself)."""
        return sum(self.kv.num_blocks_needed(r, self._num_new.get(r.request_id, 0) + 1) for r in requests
                   if r.status is RequestStatus.RUNNING)

    def _probe(self, num_new: int, free_blocks: int, already_computed: int) -> int:
        """Admission probe: the largest chunk <= ``num_new`` whose new blocks fit in ``free_blocks`` (down
        to one block), or 0 when shrinking is off, prefill cannot be chunked, or not one block is free.

        ``already_computed`` is the request's ``num_computed_tokens`` once its held (or hit) blocks are in
        place; the empty slots of its last held block take chunk tokens without a new block.
        """
        limits = self.limits
        if not limits.shrink_prefill_chunks or not limits.enable_chunked_prefill or free_blocks < 1:
            return 0
        slack = (-already_computed) % self.kv.block_size
        return min(num_new, free_blocks * self.kv.block_size + slack)

    def _waiting_changes(self) -> None:
        if self.waiting_before is None:
            self.waiting_before = list(self.waiting)

    # ---- output ---------------------------------------------------------------------------------------
    def _add(self, request: Request, num_new: int, undo: Undo) -> None:
        self._scheduled.append((request, num_new))
        self._num_new[request.request_id] = num_new
        self.undo.append(undo)
        self.budget -= num_new
        request.last_scheduled_step = self.step_index
        # The blocks this chunk completes: indexed in the prefix cache only once the step has really run. Only
        # known tokens count: a block holding a proposal is never staged (it may be rejected).
        num_spec = len(self._spec.get(request.request_id, ())) if self._spec else 0
        end = request.num_computed_tokens + num_new - num_spec
        if request.num_output_placeholders:  # async: a block holding a placeholder is staged in a later step
            end = min(end, request.num_tokens)
        self.kv.stage_full_blocks(request, end)

    @property
    def scheduled_requests(self) -> list[Request]:
        """The requests scheduled so far, in scheduling order (``build``'s order)."""
        return [request for request, _ in self._scheduled]

    def build(self) -> SchedulerOutput:
        """The finished step: every scheduled request as a ``ScheduledRequest``, in scheduling order.

        Async scheduling: a decode of a request whose previous step is still in flight computes the token that
        step samples, not known yet: ``PLACEHOLDER_TOKEN_ID`` in ``token_ids`` (the worker fills it in), and
        ``output_index`` counts it."""
        specs = self._spec
        block_ids = self.kv.get_block_ids
        scheduled = self.out.scheduled
        for request, num_new in self._scheduled:
            start = request.num_computed_tokens
            end = start + num_new
            prompt, output = request.prompt_token_ids, request.output_token_ids
            in_flight = request.num_output_placeholders
            num_tokens = len(prompt) + len(output) + in_flight
            spec = specs.get(request.request_id) if specs else None
            if spec:  # a decode verifying proposals: its latest token, then the proposals
                end -= len(spec)
                self.out.num_spec_tokens += len(spec)
                token_ids = request.token_ids_slice(start, end) + spec
            elif end == num_tokens and start == num_tokens - 1 and output and not in_flight:  # a decode
                token_ids = [output[-1]]
            else:
                token_ids = request.token_ids_slice(start, end)
                if in_flight and len(token_ids) < num_new:
                    token_ids += [PLACEHOLDER_TOKEN_ID] * (num_new - len(token_ids))
            scheduled.append(ScheduledRequest(
                request.request_id,
                token_ids,
                start,
                block_ids(request.request_id),
                end == num_tokens,  # sample
                # ``Request.is_decode`` (num_computed_tokens is still ``start`` here): a prefill otherwise
                not (num_tokens - start == 1 and start >= request.prefill_len),
                request.sampling_params,
                len(output) + in_flight,  # output_index
                prompt,
                output,
                spec or (),
                request.structured_output,
            ))
        return self.out
