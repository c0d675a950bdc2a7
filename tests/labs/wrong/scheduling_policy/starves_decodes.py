"""A wrong scheduling policy. The bug: admits every waiting prompt before serving the running requests: each
newcomer's prefill delays every decode (prefill-first without a reservation)."""

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
        step.admit_all()
        step.run_all(step.unscheduled_running())

    def next_waiting(self, waiting: Sequence[Request], step_index: int) -> Request:
        return min(waiting, key=_admission_key)  # ties: queue order

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        return candidates[-1]  # the most recently admitted, as vLLM
