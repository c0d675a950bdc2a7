"""Watch a run's requests move through ``RequestStatus``: every transition of every request, step by step.

``StateRecorder(engine)`` steps the engine for you (``step``, ``abort``, ``run``) and records
``(step, request_id, from_status, to_status)`` events, read from each step's ``StepTrace`` (admitted,
preempted, finished) and from the scheduler's queues before and after the step (a preempted request is
PREEMPTED or SWAPPED; a request that left the scheduler finished with its ``finish_reason``).
``minengine.viz.state_machine.state_machine_figure`` draws the counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from minengine.request import RequestStatus


@dataclass(frozen=True)
class Transition:
    """One request changing status during engine step ``step`` (or between steps, for an abort)."""

    step: int
    request_id: str
    src: RequestStatus
    dst: RequestStatus


class StateRecorder:
    """Drives ``engine`` and records every status change of its requests.

    Attributes:
        events: the ``Transition``s so far, in order.
    """

    def __init__(self, engine):
        self.engine = engine
        self.events: list[Transition] = []

    def _statuses(self) -> dict[str, RequestStatus]:
        return {rid: r.status for rid, r in self.engine.scheduler.requests.items()}

    def _finished_status(self, request_id: str) -> RequestStatus:
        return RequestStatus(self.engine.request_metrics[request_id].finish_reason)

    def step(self) -> list:
        """One ``engine.step()``; returns its outputs."""
        engine = self.engine
        before = self._statuses()
        num_traces = len(engine.traces)
        outputs = engine.step()
        after = self._statuses()
        step = engine.num_steps - 1 if len(engine.traces) > num_traces else engine.num_steps
        done: set[str] = set()
        if len(engine.traces) > num_traces:
            trace = engine.traces[-1]
            for rid in trace.preempted_ids:  # a victim was RUNNING when it was chosen
                self.events.append(Transition(step, rid, RequestStatus.RUNNING, after[rid]))
            for rid in trace.admitted_ids:
                self.events.append(Transition(step, rid, before[rid], RequestStatus.RUNNING))
            for rid in trace.finished_ids:
                if rid in trace.timed_out_ids:  # timed out at the start of the step, in its old state
                    continue
                self.events.append(Transition(step, rid, RequestStatus.RUNNING, self._finished_status(rid)))
                done.add(rid)
        for rid, status in before.items():  # timeouts (also of a step that scheduled nothing)
            if rid not in after and rid not in done:
                self.events.append(Transition(step, rid, status, self._finished_status(rid)))
        return outputs

    def abort(self, request_id: str) -> None:
        """``engine.abort_request(request_id)``, recorded (from whatever state it was in)."""
        before = self._statuses()
        self.engine.abort_request(request_id)
        if request_id in before and request_id not in self._statuses():
            self.events.append(Transition(self.engine.num_steps, request_id, before[request_id],
                                          RequestStatus.FINISHED_ABORTED))

    def run(self, arrivals: Iterable[tuple[int, str, object, object]] = (), aborts: Iterable[tuple[int, str]] = (),
            max_steps: int = 100_000) -> None:
        """Add each ``(step_index, request_id, prompt, params)`` just before that step, abort each
        ``(step_index, request_id)`` just before that step, and step until nothing is unfinished.

        Raises:
            RuntimeError: still unfinished after ``max_steps`` steps.
        """
        pending = sorted(arrivals, key=lambda a: a[0])
        kills = sorted(aborts)
        step = 0
        while pending or kills or self.engine.has_unfinished_requests():
            if step >= max_steps:
                raise RuntimeError(f"requests still unfinished after max_steps={max_steps} steps")
            while pending and pending[0][0] <= step:
                _, rid, prompt, params = pending.pop(0)
                self.engine.add_request(rid, prompt, params)
            while kills and kills[0][0] <= step:
                self.abort(kills.pop(0)[1])
            self.step()
            step += 1

    def pairs(self) -> list[tuple[RequestStatus, RequestStatus]]:
        """``(from, to)`` of every event, for ``state_machine_figure``."""
        return [(e.src, e.dst) for e in self.events]

    def history(self, request_id: str) -> list[RequestStatus]:
        """The statuses one request went through, in order, starting at WAITING."""
        path = [RequestStatus.WAITING]
        for e in self.events:
            if e.request_id == request_id:
                path.append(e.dst)
        return path
