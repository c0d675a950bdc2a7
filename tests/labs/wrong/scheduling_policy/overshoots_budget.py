"""A wrong scheduling policy. The bug: raises the step's token budget so a long prompt fits in one step: the step
holds more than max_num_batched_tokens."""

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
        step.run_all(step.unscheduled_running())
        waiting = step.peek_waiting()
        if waiting is not None:
            step.budget = max(step.budget, waiting.num_tokens)  # the whole prompt at once
        step.admit_all()

    def next_waiting(self, waiting: Sequence[Request], step_index: int) -> Request:
        return min(waiting, key=_admission_key)  # ties: queue order

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        return candidates[-1]  # the most recently admitted, as vLLM
