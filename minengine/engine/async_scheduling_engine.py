"""AsyncSchedulingEngine: ``LLMEngine`` with async scheduling (vLLM's ``async_scheduling``, its batch queue of
two steps), chosen at construction: ``LLMEngine(config)`` builds one when ``config.async_scheduling`` is set.

Each ``step()`` schedules and submits step N+1 to the worker processes (its decodes' tokens of step N are
placeholders, filled in by the workers), then waits for step N and commits it, so the scheduling of N+1 and
the processing of N run while the workers compute. The steps in flight are kept here, with the requests each
one served (a request may finish, and its id be reused, while its step is in flight).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from minengine.core.async_scheduler import has_work
from minengine.core.scheduler_output import SchedulerOutput
from minengine.engine.llm_engine import LLMEngine
from minengine.engine.logprobs_positions import prepare_logprobs
from minengine.metrics.recorder import ScheduledStep
from minengine.outputs import RequestOutput
from minengine.request import Request


@dataclass
class InFlightStep(ScheduledStep):
    """A submitted step and its requests as they were when it was scheduled."""

    requests: dict[str, Request] | None = None


class AsyncSchedulingEngine(LLMEngine):
    """``LLMEngine`` whose ``step()`` keeps one step in flight in the workers (see the module docstring)."""

    schedules_ahead = True

    def __init__(self, *args, **kwargs):
        self._in_flight: deque[InFlightStep] = deque()  # steps submitted, not yet processed
        self._unsubmitted_preemptions: list[str] = []  # made by a schedule that ran nothing (see step())
        super().__init__(*args, **kwargs)

    def shutdown(self) -> None:
        self._in_flight.clear()
        super().shutdown()

    def has_unfinished_requests(self) -> bool:
        """Unfinished requests, or a step still in flight, whose output ``step()`` takes."""
        return super().has_unfinished_requests() or bool(self._in_flight)

    def step(self) -> list[RequestOutput]:
        """Submit the next step, then commit the oldest in flight. The first call of a run only submits
        (returns no tokens); the engine has unfinished work while a step is in flight.

        A schedule may run nothing and only preempt (recompute: the victim's blocks were needed by the step in
        flight): nothing is submitted, and its preemptions go into the trace of the step this call commits.

        A failure while processing a step (the workers, the detokenizer, Ctrl-C) lets the workers finish the
        step still in flight (its tokens dropped), then rolls both back, newest first (``Scheduler.rollback``):
        the engine is as if neither had been scheduled, as in ``LLMEngine.step()``. A worker failure leaves the
        executor stopped: every later step raises ``WorkerFailedError``."""
        start = self._begin_step()
        scheduler_output = self.scheduler.schedule()  # at most one step is in flight here
        submitted = has_work(scheduler_output)  # a step may only swap out or preempt (its blocks held in flight)
        if submitted:
            self._submit(self._scheduled_step(scheduler_output, start))
        else:
            self._count_preemptions(scheduler_output)
        if not self._in_flight:
            return self._idle_step(scheduler_output)
        if submitted and len(self._in_flight) == 1:  # nothing older to wait for: let it run
            self.clock.end_step(SchedulerOutput())
            return self._deliver_timed_out()
        step = self._in_flight.popleft()
        step.preempted_ids += self._unsubmitted_preemptions
        self._unsubmitted_preemptions = []
        try:
            sampled = self.runner.collect()  # the oldest step: it was submitted first
            tokens_to_commit, detoks = self._detokenize(step, sampled)
            logprobs = self._prepare_logprobs(step, tokens_to_commit)
        except BaseException:
            self._abandon_in_flight(step, start)
            self.clock.end_step(SchedulerOutput())
            raise
        return self._commit(step, start, sampled, tokens_to_commit, detoks, logprobs)

    def _submit(self, step: InFlightStep) -> None:
        try:
            self.runner.submit(step.scheduler_output)
        except BaseException:
            self.scheduler.rollback(step.scheduler_output)
            self.clock.end_step(SchedulerOutput())
            self.recorder.on_rolled_back(step, step.scheduled_at, self.request_metrics)
            raise
        self._in_flight.append(step)

    def _count_preemptions(self, scheduler_output: SchedulerOutput) -> None:
        """The preemptions of a schedule that submitted nothing: they stand, and the next committed (or rolled
        back) step's trace counts them, so every count of preemptions agrees."""
        for rid in scheduler_output.preempted_ids:
            self.request_metrics[rid].num_preemptions += 1
        self._unsubmitted_preemptions += scheduler_output.preempted_ids

    def _scheduled_step(self, scheduler_output: SchedulerOutput, start: float) -> InFlightStep:
        step = super()._scheduled_step(scheduler_output, start)
        requests = {s.request_id: self.scheduler.requests[s.request_id] for s in scheduler_output.scheduled}
        super()._mark_first_scheduled(scheduler_output.admitted_ids, start)  # when scheduled, not committed
        return InFlightStep(step.scheduler_output, step.scheduled_at, step.pool, step.preempted_ids, requests)

    def _mark_first_scheduled(self, admitted_ids: list[str], start: float) -> None:
        pass  # done when the step was scheduled (``_scheduled_step``)

    def _is_live(self, step: InFlightStep, request_id: str) -> bool:
        """The request the step served is still unfinished (not finished, nor its id reused, while in flight)."""
        return self.scheduler.requests.get(request_id) is step.requests[request_id]

    def _sampling_ids(self, step: InFlightStep) -> list[str]:
        """Requests that finished since the step was scheduled get nothing."""
        return [rid for rid in super()._sampling_ids(step) if self._is_live(step, rid)]

    def _prepare_logprobs(self, step: InFlightStep, tokens_to_commit: dict) -> dict:
        """As ``LLMEngine._prepare_logprobs``, without requests that finished while the step ran."""
        logprobs = {rid: lps for rid, lps in self.runner.last_logprobs.items() if rid in tokens_to_commit}
        prompt_logprobs = {rid: lps for rid, lps in self.runner.last_prompt_logprobs.items()
                           if self._is_live(step, rid)}
        if not logprobs and not prompt_logprobs:  # nobody in the step asked for logprobs
            return {}
        return prepare_logprobs(self.output_processor, logprobs, prompt_logprobs)

    def _abandon_in_flight(self, failed: InFlightStep, start: float) -> None:
        """Processing ``failed`` raised. Drain the steps submitted after it (so the workers are idle and run
        nothing stale), then roll back every open step, newest first (each recorded as a ``rolled_back`` trace,
        so its preemptions count everywhere, as in ``LLMEngine.step()``)."""
        later = list(self._in_flight)
        self._in_flight.clear()
        if getattr(self.runner, "is_alive", False):
            for _ in later:
                try:
                    self.runner.collect()
                except Exception:  # the executor stopped meanwhile: nothing more to drain
                    break
        for step in reversed([failed] + later):
            self.scheduler.rollback(step.scheduler_output)
        for step in [failed] + later:
            self.recorder.on_rolled_back(step, start, self.request_metrics)

