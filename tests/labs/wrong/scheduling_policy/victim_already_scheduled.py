"""A wrong scheduling policy. The bug: preempts the oldest request running at the start of the step (to protect
newcomers), which decode-first has already scheduled in this step (its chunk would read freed blocks)."""

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
        self.running_at_start = list(step.running)
        step.run_all(step.unscheduled_running())  # decodes and unfinished prompts, in admission order
        step.admit_all()

    def next_waiting(self, waiting: Sequence[Request], step_index: int) -> Request:
        return min(waiting, key=_admission_key)  # ties: queue order

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        return self.running_at_start[0]  # the oldest: newcomers keep their place
