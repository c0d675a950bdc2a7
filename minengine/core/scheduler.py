"""Scheduler: continuous batching with chunked prefill under a token budget and a KV block budget.

Each ``schedule()`` builds one step (iteration-level scheduling, Orca, Yu et al., OSDI 2022) under three
limits: the token budget ``max_num_batched_tokens``, the free KV blocks and the sequence slots
``max_num_seqs``. A prompt larger than what is left of the budget is cut into chunks (Sarathi-Serve, Agrawal
et al., OSDI 2024), so prefill chunks and decodes share one step. Which work goes first is the scheduling
policy's choice (``core/policies.py``; the default, decode-first, serves running requests before new ones).
When a running request needs a block and none is free, a running request not yet scheduled this step is
preempted by recompute (the policy picks which; by default the most recently admitted, as vLLM v1).

A step is a transaction: ``schedule()`` changes block tables, queues and progress, ``update_from_output()``
commits the step once its forward and sampling succeeded (only then are its full blocks findable in the prefix
cache), and ``rollback()`` gives back a step that failed in between (an exception, Ctrl-C).

This class is the default scheduler. Optional features open a door at construction (``core/doors.py``
composes the classes): async scheduling, swap preemption, speculative decoding, predicted lengths; structured
outputs open theirs with the first constrained request (``core/structured_commit.py``).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.policies import SchedulingPolicy
from minengine.core.request_set import RequestSet
from minengine.core.scheduler_config import SchedulerConfig
from minengine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from minengine.core.step_builder import StateBeforeStep, StepBuilder
from minengine.request import Request, RequestStatus


@dataclass(frozen=True)
class OpenStep:
    """A step scheduled and not yet committed or rolled back."""

    out: SchedulerOutput
    undo: list[StateBeforeStep]  # the state before the step of each scheduled request, in ``out.scheduled`` order
    waiting_before: list[Request] | None  # None: the step did not change the waiting queue
    requests: list[Request]  # the scheduled requests, in ``out.scheduled`` order


class Scheduler:
    """Decides, step by step, which requests compute how many tokens.

    Args:
        kv_cache_manager: owner of the block tables and the prefix cache.
        config: the limits and switches (``SchedulerConfig``), read by every step.
        policy: the ``SchedulingPolicy`` that orders each step's work.

    Build one with ``core.doors.make_scheduler``, which also opens the doors the config asks for.
    """

    step_builder_class: type[StepBuilder] = StepBuilder  # a door may compose a subclass

    def __init__(self, kv_cache_manager: KVCacheManager, config: SchedulerConfig, policy: SchedulingPolicy):
        self.kv = kv_cache_manager
        self.config = config
        self.policy = policy
        self.requests: dict[str, Request] = {}  # every unfinished request
        self.waiting: deque[Request] = deque()
        self.running = RequestSet()  # in admission order; O(1) append, remove, membership
        # (deadline, arrival number, request) of every request added with a deadline, earliest first; an entry
        # whose request finished otherwise stays until its deadline passes (``past_deadline`` skips it).
        self._deadlines: list[tuple[float, int, Request]] = []
        self._num_added = 0
        self.num_steps = 0
        self.num_preemptions = 0
        self.num_swapped_out_blocks = 0  # moved by the swap door only
        self.num_swapped_in_blocks = 0
        self._open_steps: list[OpenStep] = []  # oldest first; at most one without async scheduling

    # ---- queue management -----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use by an unfinished request")
        if request.structured_output is not None:  # the structured-outputs door opens with its first request
            from minengine.core.structured_commit import open_structured_outputs_door

            open_structured_outputs_door(self)
        request.arrival_step = self.num_steps
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
        """Finish requests in any state (used for aborts, timeouts and stop strings); frees their blocks.
        Unknown or already finished ids are ignored. Returns the requests finished now."""
        done = []
        for rid in request_ids:
            request = self.requests.pop(rid, None)
            if request is None:
                continue
            if request in self.running:  # O(1)
                self.running.remove(request)
            else:
                self.waiting.remove(request)  # from its place: near the front, mostly
            self.free_request(request)
            request.status = status
            done.append(request)
        return done

    def free_request(self, request: Request) -> None:
        """Give back everything a finished request holds: its KV blocks."""
        self.kv.free(request)

    # ---- one step -------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Build the next step with the scheduling policy (see ``StepBuilder`` for the moves it makes).
        The step stays open until ``update_from_output`` commits it or ``rollback`` gives it back."""
        step = self.new_step()
        self.policy.fill(step)
        self.num_steps += 1
        scheduler_output = step.build()
        self.count_moves(step)
        self.open_step(OpenStep(scheduler_output, step.undo, step.waiting_before, step.scheduled_requests))
        return scheduler_output

    def new_step(self, out: SchedulerOutput | None = None) -> StepBuilder:
        """A builder for the next step: what it may use and change, passed down (it never looks back here)."""
        return self.step_builder_class(self.kv, self.policy, self.config, self.waiting, self.running,
                                       self.num_steps, out)

    def open_step(self, open_step: OpenStep) -> None:
        """Keep the step scheduled last until it is committed or rolled back (one at a time)."""
        self._open_steps = [open_step]

    def count_moves(self, step: StepBuilder) -> None:
        self.num_preemptions += step.num_preemptions

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           sampled_token_ids: dict[str, list[int]]) -> tuple[list[Request], list[Request]]:
        """Commit the step: advance ``num_computed_tokens``, append the sampled tokens, stop finished requests.

        Args:
            scheduler_output: the step that just ran.
            sampled_token_ids: request id -> ``[token]`` for every scheduled request with ``sample``.

        Returns:
            (requests that got new tokens, requests that finished this step).
        """
        owners = self.close_step(scheduler_output)
        self.kv.commit_staged()  # the step's K/V is written: its full blocks may now be prefix hits
        got_token, finished = [], []
        for s, owner in zip(scheduler_output.scheduled, owners):
            request = self.requests.get(s.request_id)
            if request is None or request is not owner:  # finished (aborted, timed out) while the step ran
                continue
            if not s.sample:  # an intermediate prefill chunk
                self.commit_chunk(request, s)
                continue
            got_token.append(request)
            status = self.commit_sampled(request, s, sampled_token_ids[s.request_id])
            if status is not None:
                finished.extend(self.finish_requests([request.request_id], status))
        return got_token, finished

    def close_step(self, scheduler_output: SchedulerOutput) -> list[Request | None]:
        """Take ``scheduler_output`` off the open steps; returns the requests it scheduled (Nones for a step
        that was not open here, e.g. one built by hand)."""
        open_step = next((o for o in self._open_steps if o.out is scheduler_output), None)
        if open_step is None:
            return [self.requests.get(s.request_id) for s in scheduler_output.scheduled]
        self._open_steps.remove(open_step)
        return open_step.requests

    def commit_chunk(self, request: Request, s: ScheduledRequest) -> None:
        """The step computed ``s``'s tokens: they count as computed."""
        request.num_computed_tokens += s.num_new_tokens

    def commit_sampled(self, request: Request, s: ScheduledRequest, tokens: list[int]) -> RequestStatus | None:
        """The step computed ``s``'s tokens and sampled one more: append it and check for a stop."""
        self.commit_chunk(request, s)
        return self.append_token(request, tokens[0])

    def append_token(self, request: Request, token: int) -> RequestStatus | None:
        """Append one token; returns the finished status when it stops the request."""
        request.output_token_ids.append(token)
        return self.check_stop(request)

    def check_stop(self, request: Request) -> RequestStatus | None:
        """vLLM's order: length first, then EOS, then stop token ids."""
        params, output = request.sampling_params, request.output_token_ids
        if len(request.prompt_token_ids) + len(output) >= self.config.max_model_len or len(output) >= params.max_tokens:
            return RequestStatus.FINISHED_LENGTH
        last = output[-1]
        if not params.ignore_eos and request.eos_token_id is not None and last == request.eos_token_id:
            return RequestStatus.FINISHED_STOPPED
        if last in params.stop_token_ids:
            request.stop_reason = last
            return RequestStatus.FINISHED_STOPPED
        return None

    def num_tokens_before_stop(self, request: Request, tokens: list[int]) -> int:
        """How many of ``tokens`` ``update_from_output`` would append to ``request`` before it stops (the
        stopping token included): what the detokenizer may see. Pure: changes nothing."""
        if len(tokens) == 1:
            return 1
        params, n_out, n_all = request.sampling_params, request.num_output_tokens, request.num_tokens
        for i, token in enumerate(tokens, start=1):
            if (n_all + i >= self.config.max_model_len or n_out + i >= params.max_tokens
                    or token in params.stop_token_ids
                    or (not params.ignore_eos and request.eos_token_id is not None
                        and token == request.eos_token_id)):
                return i
        return len(tokens)

    # ---- a failed step --------------------------------------------------
    def rollback(self, scheduler_output: SchedulerOutput) -> None:
        """Give back the step scheduled last, whose forward, sampling or detokenization failed: the engine is
        left as if it had not been scheduled, so the next ``schedule()`` serves the same requests again.

        Every request scheduled in it gets back its blocks, progress and status (one admitted in it returns
        to the waiting queue where it was), and none of the blocks it would have filled is indexed in the
        prefix cache. Preemptions made while scheduling stand (the victims' blocks may already hold other K/V).

        Raises:
            ValueError: ``scheduler_output`` is not the open step (already committed, rolled back or older).
        """
        if not self._open_steps or self._open_steps[-1].out is not scheduler_output:
            raise ValueError("rollback: scheduler_output is not the step scheduled last and not yet committed")
        open_step = self._open_steps.pop()
        self.kv.discard_staged()
        for undo, s in reversed(list(zip(open_step.undo, scheduler_output.scheduled))):
            if self.requests.get(undo.request.request_id) is undo.request:
                self.undo_request(undo, s)
        self.restore_waiting(open_step)
        self.num_steps -= 1

    def undo_request(self, undo: StateBeforeStep, s: ScheduledRequest) -> None:
        """Give one scheduled request back its blocks, progress and (if admitted in the step) status."""
        request = undo.request
        self.kv.truncate(request, undo.num_blocks)
        request.num_computed_tokens = undo.num_computed_tokens
        request.last_scheduled_step = undo.last_scheduled_step
        if undo.status is not RequestStatus.RUNNING:  # admitted in this step
            self.running.remove(request)
            request.status = undo.status
            request.num_cached_tokens = undo.num_cached_tokens
            request.num_external_computed_tokens = undo.num_external_computed_tokens

    def restore_waiting(self, open_step: OpenStep) -> None:
        """The waiting queue as before the step, behind the step's preemption victims (their preemption stands);
        requests added since the step was scheduled stay at the back."""
        preempted = set(open_step.out.preempted_ids)
        victims = [r for r in self.waiting if r.request_id in preempted]
        before = open_step.waiting_before
        if before is None:  # the step changed nothing there: the queue as it is, without the victims
            before = [r for r in self.waiting if r.request_id not in preempted]
        before = [r for r in before if r.request_id in self.requests]
        known = {id(r) for r in victims + before}
        later = [r for r in self.waiting if id(r) not in known]
        self.waiting.clear()
        self.waiting.extend(self.order_waiting(victims, before, later))

    def order_waiting(self, victims: list[Request], before: list[Request], later: list[Request]) -> list[Request]:
        return victims + before + later

    # ---- what the engine and the metrics read ---------------------------------------------------------
    @property
    def has_open_step(self) -> bool:
        """A step is scheduled and not yet committed or rolled back."""
        return bool(self._open_steps)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_swapped(self) -> int:
        """Waiting requests whose KV is in the swap space (the swap door counts them; none here)."""
        return 0
