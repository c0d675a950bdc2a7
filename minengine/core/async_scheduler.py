"""The async-scheduling door (vLLM's ``async_scheduling``): step N+1 is scheduled while step N runs.

Step N+1 is built before N's sampled tokens are known. ``schedule()`` then advances ``num_computed_tokens`` by
each scheduled chunk at once (the device runs steps in order, so every later step sees their K/V: it stays the
one number of progress) and gives each sampling request a placeholder (``num_output_placeholders``) for the
token it will get; a decode of that token is scheduled with ``PLACEHOLDER_TOKEN_ID``, which the worker fills
in. ``update_from_output(N)`` turns the placeholders into tokens and checks the stops; a request that stopped
(or was aborted) meanwhile ignores its results of N+1. Two steps are open at once: update the oldest, roll back
the newest. The prefix cache indexes at N's commit the blocks staged so far, N+1's included: they are written
before any step after N+1 runs, unless N+1 fails, and a failed worker leaves no later step.

``AsyncScheduling`` is the scheduler's half and ``AsyncSteps`` the step builder's (``core/doors.py`` composes
them in front of the default classes).
"""

from __future__ import annotations

import dataclasses

from minengine.core.scheduler import OpenStep
from minengine.core.scheduler_output import PLACEHOLDER_TOKEN_ID, ScheduledRequest, SchedulerOutput
from minengine.core.step_builder import StateBeforeStep
from minengine.request import Request, RequestStatus


def has_work(scheduler_output: SchedulerOutput) -> bool:
    """Something for the runner: scheduled requests, or KV blocks to swap (a step may schedule nothing and only
    swap out a request that preempted itself, its blocks held by a step in flight)."""
    return bool(scheduler_output.scheduled or scheduler_output.blocks_to_swap_out
                or scheduler_output.blocks_to_swap_in)


class AsyncScheduling:
    """Scheduler mixin: progress counted when a step is scheduled, two steps open at once."""

    @staticmethod
    def open_door(scheduler, **_) -> None:
        """Nothing to set up: the mixin's methods are the whole door."""

    def open_step(self, open_step: OpenStep) -> None:
        if not has_work(open_step.out):  # a step with nothing to run has nothing to commit (its preemptions stand)
            return
        for request, s in zip(open_step.requests, open_step.out.scheduled):  # they count for every later step
            request.num_computed_tokens += s.num_new_tokens
            request.num_output_placeholders += s.sample
        self._open_steps.append(open_step)

    def commit_chunk(self, request: Request, s: ScheduledRequest) -> None:
        """Counted when the step was scheduled."""

    def commit_sampled(self, request: Request, s: ScheduledRequest, tokens: list[int]):
        request.num_output_placeholders -= 1  # the placeholder becomes the token
        return super().commit_sampled(request, s, tokens)

    def undo_request(self, undo: StateBeforeStep, s: ScheduledRequest) -> None:
        request = undo.request
        request.num_output_placeholders -= s.sample  # the token this step would have sampled
        if request.status is RequestStatus.RUNNING:
            super().undo_request(undo, s)
            return
        # Preempted by the step after this one (rolled back first; its preemptions stand), which reset it
        # already; its re-prefill no longer covers this step's token.
        request.prefill_len = min(request.prefill_len, request.num_tokens + request.num_output_placeholders)
        if undo.status is RequestStatus.WAITING:  # first admitted in this step: waiting as it was
            request.status = RequestStatus.WAITING
            request.num_cached_tokens = undo.num_cached_tokens
            request.num_external_computed_tokens = undo.num_external_computed_tokens

    def order_waiting(self, victims: list[Request], before: list[Request], later: list[Request]) -> list[Request]:
        """Requests this step did not see stay: those preempted by a later step in front, those added since
        at the back."""
        return ([r for r in later if r.status is not RequestStatus.WAITING] + victims + before
                + [r for r in later if r.status is RequestStatus.WAITING])


class AsyncSteps:
    """Step-builder mixin: a request's token in flight counts as known but not yet computable."""

    def run(self, request: Request, limit: int | None = None) -> int:
        in_flight = request.num_output_placeholders
        if in_flight and (request.structured_output is not None
                          or self.config.reaches_length_limit(request, in_flight)):
            # That step's token finishes it ("length"), or its grammar state, which the next token's mask needs,
            # moves only when that token is committed: nothing to schedule until then.
            return 0
        return super().run(request, limit)

    def num_uncomputed(self, request: Request) -> int:
        return super().num_uncomputed(request) + request.num_output_placeholders

    def first_chunk(self, request: Request, limit: int, free: int) -> int:
        if request.num_output_placeholders:  # its last token is still in flight (next step: known)
            return 0
        return super().first_chunk(request, limit, free)

    def known_end(self, request: Request, num_new: int) -> int:
        """A block holding a placeholder is staged in a later step."""
        return min(super().known_end(request, num_new), request.num_tokens)

    def scheduled_request(self, request: Request, num_new: int) -> ScheduledRequest:
        """A decode of the token the step in flight samples: ``PLACEHOLDER_TOKEN_ID`` in ``token_ids`` (the
        worker fills it in), and ``output_index`` counts it."""
        in_flight = request.num_output_placeholders
        if not in_flight:
            return super().scheduled_request(request, num_new)
        scheduled = super().scheduled_request(request, num_new)  # the known tokens' share, then what differs
        start, end = scheduled.start_pos, scheduled.start_pos + num_new
        num_tokens = request.num_tokens + in_flight
        token_ids = request.token_ids_slice(start, end)
        token_ids += [PLACEHOLDER_TOKEN_ID] * (num_new - len(token_ids))
        return dataclasses.replace(
            scheduled, token_ids=token_ids, sample=end == num_tokens,
            is_prefill=not (num_tokens - start == 1 and start >= request.prefill_len),
            output_index=len(request.output_token_ids) + in_flight)
