"""A wrong scheduling policy. The bug: runs one request at a time (admits only when nothing runs): no batching at
all."""

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
        running = step.unscheduled_running()
        if running:
            step.run(running[0])
        elif step.waiting:
            step.admit_next()

    def next_waiting(self, waiting: Sequence[Request], step_index: int) -> Request:
        return min(waiting, key=_admission_key)  # ties: queue order

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        return candidates[-1]  # the most recently admitted, as vLLM
