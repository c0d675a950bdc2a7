"""A wrong scheduling policy. The bug: runs each request of the list unscheduled_running() gave at the start of the
step with step.run, where step.run_all belongs: a request preempted meanwhile (another request's run made room) is
run anyway, scheduled while it waits."""

from __future__ import annotations

from collections.abc import Sequence

from minengine.core.policies import SchedulingPolicy
from minengine.request import Request, RequestStatus


def _admission_key(request: Request) -> tuple[bool, int]:
    """Preempted requests first, then the fewest tokens left to prefill."""
    return request.status is not RequestStatus.PREEMPTED, request.num_tokens - request.num_computed_tokens


class MyPolicy(SchedulingPolicy):
    """Decode-first, admitting the shortest waiting prompt first (preempted requests before all)."""

    name = "shortest-prompt-first"

    def fill(self, step) -> None:
        for request in step.unscheduled_running():  # BUG: a request preempted by an earlier run is run anyway
            step.run(request)
        step.admit_all()

    def next_waiting(self, waiting: Sequence[Request], step_index: int) -> Request:
        return min(waiting, key=_admission_key)  # ties: queue order

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        return candidates[-1]  # the most recently admitted, as vLLM
