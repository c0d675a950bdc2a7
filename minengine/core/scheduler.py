"""Scheduler: continuous batching with chunked prefill under a token budget and a KV block budget.

Each ``schedule()`` builds one step (iteration-level scheduling, Orca, Yu et al., OSDI 2022) under three
limits: the token budget ``max_num_batched_tokens``, the free KV blocks and the sequence slots
``max_num_seqs``. A prompt larger than what is left of the budget is cut into chunks (Sarathi-Serve, Agrawal
et al., OSDI 2024), so prefill chunks and decodes share one step. Which work goes first is the scheduling
policy's choice (``core/policies.py``; the default, decode-first, serves running requests before new ones).
When a running request needs a block and none is free, a running request not yet scheduled this step is
preempted (the policy picks which; by default the most recently admitted, as vLLM v1): by recompute, or by
swapping its KV blocks to a CPU swap space (vLLM v0) when ``preemption_mode="swap"`` and the space has room.

A step is a transaction: ``schedule()`` changes block tables, queues and progress, ``update_from_output()``
commits the step once its forward and sampling succeeded (only then are its full blocks findable in the prefix
cache), and ``rollback()`` gives back a step that failed in between (an exception, Ctrl-C).

Async scheduling (vLLM's ``async_scheduling``): step N+1 is scheduled while step N runs, before its sampled
tokens are known. ``schedule()`` then advances ``num_computed_tokens`` by each scheduled chunk at once (the
device runs steps in order, so every later step sees their K/V: it stays the one number of progress) and gives
each sampling request a placeholder (``num_output_placeholders``) for the token it will get; a decode of that
token is scheduled with ``PLACEHOLDER_TOKEN_ID``, which the worker fills in. ``update_from_output(N)`` turns
the placeholders into tokens and checks the stops; a request that stopped (or was aborted) meanwhile ignores
its results of N+1. Two steps are open at once: update the oldest, roll back the newest. The prefix cache
indexes at N's commit the blocks staged so far, N+1's included: they are written before any step after N+1
runs, unless N+1 fails, and a failed worker leaves no later step.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from minengine.core.kv_cache_manager import KVCacheManager, cdiv
from minengine.core.policies import PolicySettings, SchedulingPolicy, make_policy
from minengine.core.predictors import OraclePredictor
from minengine.core.request_set import RequestSet
from minengine.core.scheduler_output import SchedulerOutput
from minengine.core.spec_decode import NgramProposer, SpeculativeConfig
from minengine.core.step_builder import StepBuilder, StepLimits, Undo, reset_for_recompute
from minengine.core.swap_space import SwapSpace
from minengine.request import Request, RequestStatus

PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True)
class _OpenStep:
    """The step scheduled last, until it is committed or rolled back."""

    out: SchedulerOutput
    undo: list[Undo]
    waiting_before: list[Request] | None  # None: the step did not change the waiting queue
    requests: list[Request]  # the scheduled requests, in ``out.scheduled`` order


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
        speculative_config: prompt-lookup speculative decoding (``core/spec_decode.py``; a
            ``SpeculativeConfig``, a dict with vLLM's keys, or None = off): running decodes are scheduled with
            up to k proposed tokens, and ``update_from_output`` takes the verified tokens.
        predictor: an ``OutputLengthPredictor`` (``core/predictors.py``) that sets each added request's
            ``predicted_output_len``; ``shortest-predicted-first`` without one predicts ``max_tokens``.
        reserve_predicted_kv: predicted-length-aware admission (``StepBuilder.admit_next``): admit a request
            only when the free blocks cover its prompt and predicted output beyond what the running requests'
            predicted outputs still need.
        async_scheduling: ``schedule()`` may be called again before ``update_from_output`` of the step before
            (see the module docstring); not with speculative decoding.

    Raises:
        ValueError: unknown policy or preemption mode, negative swap space, a bad ``speculative_config``,
            ``async_scheduling`` with speculative decoding.
    """

    def __init__(self, kv_cache_manager: KVCacheManager, max_num_batched_tokens: int, max_num_seqs: int,
                 max_model_len: int, enable_chunked_prefill: bool = True, long_prefill_token_threshold: int = 0,
                 *, policy: SchedulingPolicy | str = "decode-first", policy_settings: PolicySettings | None = None,
                 preemption_mode: str = "recompute", swap_space_blocks: int = 0,
                 shrink_prefill_chunks: bool = False, speculative_config=None, predictor=None,
                 reserve_predicted_kv: bool = False, async_scheduling: bool = False):
        if preemption_mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption_mode must be one of {PREEMPTION_MODES}, got {preemption_mode!r}")
        if async_scheduling and speculative_config is not None:
            raise ValueError("async_scheduling does not support speculative decoding")
        self.async_scheduling = async_scheduling
        self.kv = kv_cache_manager
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.enable_chunked_prefill = enable_chunked_prefill
        self.long_prefill_token_threshold = long_prefill_token_threshold
        self.policy = make_policy(policy, policy_settings) if isinstance(policy, str) else policy
        self.preemption_mode = preemption_mode
        self.swap_space = SwapSpace(swap_space_blocks if preemption_mode == "swap" else 0,
                                    hold_steps=2 if async_scheduling else 1)
        self.shrink_prefill_chunks = shrink_prefill_chunks
        self.speculative_config = SpeculativeConfig.from_any(speculative_config)
        self.proposer = NgramProposer(self.speculative_config) if self.speculative_config else None
        if predictor is None and (self.policy.needs_predictor or reserve_predicted_kv):
            predictor = OraclePredictor()  # max_tokens: exact when requests run to max_tokens (ignore_eos)
        self.predictor = predictor
        self.reserve_predicted_kv = reserve_predicted_kv
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: deque[Request] = deque()
        self.running = RequestSet()  # in admission order; O(1) append, remove, membership
        # (deadline, arrival number, request) of every request added with a deadline, earliest first; an entry
        # whose request finished otherwise stays until its deadline passes (``past_deadline`` skips it).
        self._deadlines: list[tuple[float, int, Request]] = []
        self._num_added = 0
        self.num_steps = 0
        self.num_preemptions = 0
        self.num_swapped_out_blocks = 0
        self.num_swapped_in_blocks = 0
        self._open_steps: list[_OpenStep] = []  # oldest first; at most one without async scheduling

    # ---- queue management -----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use by an unfinished request")
        request.arrival_step = self.num_steps
        if self.predictor is not None:
            request.predicted_output_len = self.predictor.predict(request)
        self.requests[request.request_id] = request
        self.waiting.append(request)
        if request.deadline is not None:
            heapq.heappush(self._deadlines, (request.deadline, self._num_added, request))
        self._num_added += 1

    def past_deadline(self, now: float) -> list[str]:
        """Ids of the unfinished requests whose deadline is ``<= now`` (engine-clock seconds), in the order they
        were added; the caller finishes them (``finish_requests``: they are not returned again). Costs what
        has expired (a heap by deadline), not a scan of every request."""
        expired = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, number, request = heapq.heappop(self._deadlines)
            if self.requests.get(request.request_id) is request:
                expired.append((number, request.request_id))
        return [rid for _, rid in sorted(expired)]

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
            if request in self.running:  # O(1)
                self.running.remove(request)
            else:
                self.waiting.remove(request)  # from its place: near the front, mostly
            self.kv.free(request)
            self.swap_space.release(request.swapped_block_ids)
            request.swapped_block_ids = []
            request.status = status
            done.append(request)
        return done

    # ---- one step -------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Build the next step with the scheduling policy (see ``StepBuilder`` for the moves it makes).
        The step stays open until ``update_from_output`` commits it or ``rollback`` gives it back."""
        self.swap_space.begin_step()
        step = self._new_step()
        self.policy.fill(step)
        self.num_steps += 1
        out = step.build()
        self._count_moves(step)
        requests = step.scheduled_requests
        if not self.async_scheduling:
            self._open_steps = [_OpenStep(out, step.undo, step.waiting_before, requests)]
        elif out.has_work:  # a step with nothing to run has nothing to commit (its preemptions stand)
            for request, s in zip(requests, out.scheduled):  # the step's positions count for every later step
                request.num_computed_tokens += s.num_new_tokens
                request.num_output_placeholders += s.sample
            self._open_steps.append(_OpenStep(out, step.undo, step.waiting_before, requests))
        return out

    def preempt(self, request: Request, out: SchedulerOutput) -> None:
        """Preempt a running request between steps, recording the move in ``out`` (``StepBuilder.preempt``
        makes it; inside ``schedule()`` the builder preempts by itself)."""
        step = self._new_step(out)
        step.preempt(request)
        self._count_moves(step)

    def preempt_running_by_recompute(self) -> int:
        """Preempt every running request by recompute, between steps (what vLLM's
        ``reset_prefix_cache(reset_running_requests=True)`` does first): their blocks are freed and
        ``num_computed_tokens`` goes back to 0, their generated tokens stay, and they wait at the front of the
        queue in their running order. Recompute whatever ``preemption_mode`` says: the point is to hold no
        block. Returns how many were preempted.

        Raises:
            RuntimeError: while a scheduled step is open (between ``schedule()`` and ``update_from_output``).
        """
        if self._open_steps:
            raise RuntimeError("cannot preempt between schedule() and update_from_output(): a step is open")
        step = self._new_step(SchedulerOutput())
        step.limits = dataclasses.replace(step.limits, preemption_mode="recompute")
        victims = list(self.running)
        for request in reversed(victims):  # each goes to the front: the first running ends up first
            step.preempt(request)
        self._count_moves(step)
        return len(victims)

    def _new_step(self, out: SchedulerOutput | None = None) -> StepBuilder:
        """A builder for the next step: what it may use and change, passed down (it never looks back here)."""
        limits = StepLimits(self.max_num_batched_tokens, self.max_num_seqs, self.max_model_len,
                            self.enable_chunked_prefill, self.long_prefill_token_threshold, self.preemption_mode,
                            self.shrink_prefill_chunks, self.reserve_predicted_kv)
        return StepBuilder(self.kv, self.policy, limits, self.waiting, self.running, self.swap_space,
                           self.num_steps, self.proposer, out)

    def _count_moves(self, step: StepBuilder) -> None:
        self.num_preemptions += step.num_preemptions
        self.num_swapped_out_blocks += step.num_swapped_out_blocks
        self.num_swapped_in_blocks += step.num_swapped_in_blocks

    def rollback(self, scheduler_output: SchedulerOutput) -> None:
        """Give back the step scheduled last, whose forward, sampling or detokenization failed: the engine is
        left as if it had not been scheduled, so the next ``schedule()`` serves the same requests again.

        Every request scheduled in it gets back its blocks, progress and status (one admitted in it returns
        to the waiting queue where it was, a swapped-in one gets its CPU swap blocks back), and none of the
        blocks it would have filled is indexed in the prefix cache. Preemptions made while scheduling stand
        (the victims' blocks may already hold other K/V); a victim swapped out becomes a recompute victim, as
        the failed step may not have copied its blocks.

        Raises:
            ValueError: ``scheduler_output`` is not the open step (already committed, rolled back or older).
        """
        if not self._open_steps or self._open_steps[-1].out is not scheduler_output:
            raise ValueError("rollback: scheduler_output is not the step scheduled last and not yet committed")
        open_step = self._open_steps.pop()
        self.kv.discard_staged()
        sampled = {s.request_id for s in scheduler_output.scheduled if s.sample} if self.async_scheduling else ()
        for undo in reversed(open_step.undo):
            request = undo.request
            if self.requests.get(request.request_id) is not request:
                continue
            if request.request_id in sampled:  # async: the token this step would have sampled
                request.num_output_placeholders -= 1
            if request.status is not RequestStatus.RUNNING:
                # async: preempted by the step after this one (rolled back first; its preemptions stand), which
                # reset it already; its re-prefill no longer covers this step's token.
                request.prefill_len = min(request.prefill_len, request.num_tokens + request.num_output_placeholders)
                if undo.status is RequestStatus.WAITING:  # first admitted in this step: waiting as it was
                    request.status = RequestStatus.WAITING
                    request.num_cached_tokens = undo.num_cached_tokens
                    request.num_external_computed_tokens = undo.num_external_computed_tokens
                continue
            self.kv.truncate(request, undo.num_blocks)
            request.num_computed_tokens = undo.num_computed_tokens
            request.last_scheduled_step = undo.last_scheduled_step
            if undo.status is not RequestStatus.RUNNING:  # admitted in this step
                self.running.remove(request)
                request.status = undo.status
                request.num_cached_tokens = undo.num_cached_tokens
                request.num_external_computed_tokens = undo.num_external_computed_tokens
                if undo.swapped_block_ids:
                    request.swapped_block_ids = list(undo.swapped_block_ids)
                    self.swap_space.reclaim(request.swapped_block_ids)
                    self.num_swapped_in_blocks -= len(request.swapped_block_ids)
        preempted = set(scheduler_output.preempted_ids)
        for request in self.waiting:
            if request.request_id in preempted and request.status is RequestStatus.SWAPPED:
                self.swap_space.release(request.swapped_block_ids)
                self.num_swapped_out_blocks -= len(request.swapped_block_ids)
                request.swapped_block_ids = []
                reset_for_recompute(request)
        victims = [r for r in self.waiting if r.request_id in preempted]
        before = open_step.waiting_before
        if before is None:  # the step changed nothing there: the queue as it is, without the victims
            before = [r for r in self.waiting if r.request_id not in preempted]
        before = [r for r in before if r.request_id in self.requests]
        # Async: waiting requests this step did not see (preempted by a later step, or added since) stay too.
        known = {id(r) for r in victims + before}
        later = [r for r in self.waiting if id(r) not in known]
        self.waiting.clear()
        self.waiting.extend([r for r in later if r.status is not RequestStatus.WAITING] + victims + before
                            + [r for r in later if r.status is RequestStatus.WAITING])
        self.num_steps -= 1

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           sampled_token_ids: dict[str, list[int]]) -> tuple[list[Request], list[Request]]:
        """Commit the step: advance ``num_computed_tokens``, append the sampled tokens, stop finished requests.

        A request that verified proposals gets its accepted proposals and one token of the sampler's own
        (1 + accepted tokens in all); its ``num_computed_tokens`` advances by that count (the K/V of the
        accepted proposals was written by this step), the K/V slots of the rejected ones are left to be
        overwritten later, and a block that only rejected proposals used is freed now. Tokens are appended one
        at a time, each checked for a stop (length, EOS, stop token ids): the rest of the list is dropped.

        Args:
            scheduler_output: the step that just ran.
            sampled_token_ids: request id -> the tokens to append, for every scheduled request with ``sample``
                (``[token]``, or with proposals ``accepted proposals + [token]``; a caller may cut the list
                after a stop string, which finishes the request).

        Returns:
            (requests that got new tokens, requests that finished this step).
        """
        open_step = next((o for o in self._open_steps if o.out is scheduler_output), None)
        if open_step is not None:
            self._open_steps.remove(open_step)
        self.kv.commit_staged()  # the step's K/V is written: its full blocks may now be prefix hits
        got_token, finished = [], []
        advanced = self.async_scheduling  # progress was counted when the step was scheduled
        owners = open_step.requests if open_step is not None else [None] * len(scheduler_output.scheduled)
        for s, owner in zip(scheduler_output.scheduled, owners):
            request = self.requests.get(s.request_id)
            if request is None or (owner is not None and request is not owner):  # finished while the step ran
                continue
            if not s.sample:
                if not advanced:
                    request.num_computed_tokens += s.num_new_tokens
                continue
            tokens = sampled_token_ids[s.request_id]
            got_token.append(request)
            if advanced:
                request.num_output_placeholders -= 1
            if not s.spec_token_ids and request.structured_output is None:  # one token (the common case, lean)
                if not advanced:
                    request.num_computed_tokens += s.num_new_tokens
                request.output_token_ids.append(tokens[0])
                status = self._check_stop(request)
                if status is not None:
                    finished.extend(self.finish_requests([request.request_id], status))
                continue
            # Verified proposals: computed are the decode's own token and the accepted proposals; the blocks
            # past them held only rejected proposals.
            if s.spec_token_ids:
                request.num_computed_tokens += len(tokens)
                self.kv.truncate(request, cdiv(request.num_computed_tokens, self.kv.block_size))
            elif not advanced:  # a structured-output request's one token
                request.num_computed_tokens += s.num_new_tokens
            for token in tokens:
                status = self._append(request, token)
                if status is not None:
                    finished.extend(self.finish_requests([request.request_id], status))
                    break
        return got_token, finished

    def _append(self, request: Request, token: int) -> RequestStatus | None:
        """Append one token (advancing the request's grammar state with it, if it has one) and check for a stop.

        Structured outputs: the grammar state moves only here, with committed tokens, in order. The request
        stops ("stop") once the grammar has accepted its stop token, as vLLM's requests stop at the EOS a
        complete grammar leaves as the only choice, also with ``ignore_eos``. A token the grammar rejects (the
        sampler's answer to a grammar with no allowed token left in this vocabulary) is not appended: the
        request finishes with "abort"."""
        so = request.structured_output
        if so is not None and not so.accept_token(token):
            return RequestStatus.FINISHED_ABORTED
        request.output_token_ids.append(token)
        status = self._check_stop(request)
        if status is None and so is not None and so.is_terminated():
            return RequestStatus.FINISHED_STOPPED
        return status

    def num_tokens_before_stop(self, request: Request, tokens: list[int]) -> int:
        """How many of ``tokens`` ``update_from_output`` would append to ``request`` before it stops (the
        stopping token included): what the detokenizer may see. Pure: changes nothing."""
        if len(tokens) == 1:
            return 1
        params, n_out, n_all = request.sampling_params, request.num_output_tokens, request.num_tokens
        for i, token in enumerate(tokens, start=1):
            if (n_all + i >= self.max_model_len or n_out + i >= params.max_tokens or token in params.stop_token_ids
                    or (not params.ignore_eos and request.eos_token_id is not None
                        and token == request.eos_token_id)):
                return i
        return len(tokens)

    def _check_stop(self, request: Request) -> RequestStatus | None:
        """vLLM's order: length first, then EOS, then stop token ids."""
        params, output = request.sampling_params, request.output_token_ids
        if len(request.prompt_token_ids) + len(output) >= self.max_model_len or len(output) >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        last = output[-1]
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

    @property
    def num_swapped(self) -> int:
        """Waiting requests whose KV is in the swap space (none, without looking, when it has no blocks)."""
        if not self.swap_space.num_blocks:
            return 0
        return sum(r.status is RequestStatus.SWAPPED for r in self.waiting)
