"""Reference solution of lab 5, a scheduling policy of the learner's design (the skeleton:
``labs/scheduling_policy/``): decode-first with shortest-prompt-first admission.

Why it meets more SLOs than decode-first: running requests still go first, so a decode is never stalled by a
newcomer (TPOT as decode-first's). But when prompts queue up, decode-first admits them in arrival order, and a
short chat prompt waits behind every long document that arrived before it; its TTFT then includes their whole
prefills. Admitting the prompt with the least left to prefill first (shortest job first on the prefill) gets
most prompts their first token soon, at the price of the long ones waiting longer: more requests within the
TTFT bound. Preempted requests keep the front of the queue (they hold generated tokens and were admitted
before everybody waiting), so a long request cannot be preempted and then starved.
"""

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
        step.run_all(step.unscheduled_running())  # decodes and unfinished prompts, in admission order
        step.admit_all()

    def next_waiting(self, waiting: Sequence[Request], step_index: int) -> Request:
        return min(waiting, key=_admission_key)  # ties: queue order

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        return candidates[-1]  # the most recently admitted, as vLLM
