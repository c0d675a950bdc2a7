"""A wrong preemption. The bug: preempt records the victim itself in ``step.out.preempted_ids``, not its id.
"""

from __future__ import annotations

from minengine.request import Request, RequestStatus


def pick_victim(step) -> Request:
    """The policy's victim among the running requests not yet scheduled in this step."""
    return step.policy.pick_victim(step.unscheduled_running(), step.step_index)


def preempt(step, victim: Request) -> None:
    """Off the running set, every block freed, progress reset, first in the waiting queue, recorded."""
    step.running.remove(victim)
    step.kv.free(victim)
    victim.status = RequestStatus.PREEMPTED
    victim.num_computed_tokens = 0
    victim.prefill_len = victim.num_tokens  # the re-prefill covers prompt + generated tokens
    victim.num_preemptions += 1
    step.waiting.appendleft(victim)  # it goes next
    step.out.preempted_ids.append(victim)  # BUG: the Request, not its request_id


def allocate_or_preempt(step, request: Request, num_new: int) -> bool:
    """Allocate, preempting the policy's victims until the slots fit; False once ``request`` is the victim."""
    while step.kv.allocate_slots(request, num_new) is None:
        victim = pick_victim(step)
        preempt(step, victim)
        if victim is request:
            return False
    return True
