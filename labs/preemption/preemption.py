"""Lab 4: preemption by recompute. Implement the three functions below; the engine's step builder then makes
room for a request with YOUR ``allocate_or_preempt``, and preempts with YOUR ``pick_victim`` and ``preempt``.

When a running request needs a new KV block for its next tokens and none is free, somebody must give blocks
back. vLLM (and minengine) preempt by recompute: a running request that has not been scheduled in this step yet
is taken off, ALL its blocks are freed, and it goes back to the FRONT of the waiting queue. Its generated tokens
stay; when it is admitted again, its prompt and those tokens are prefilled again (often partly from the prefix
cache) and it continues where it was. Which request is the victim is the scheduling policy's choice.

``step`` below is the ``StepBuilder`` of the step being built (``minengine/core/step_builder.py``); you may
use: ``step.kv`` (the KV cache manager: ``allocate_slots(request, num_new)`` returns None when the blocks do not
fit, ``free(request)`` gives back all of a request's blocks), ``step.running`` (running requests in admission
order: ``remove(request)``), ``step.waiting`` (a deque: ``appendleft``), ``step.unscheduled_running()``,
``step.policy`` and ``step.step_index``, ``step.out.preempted_ids`` (the step's record of its preemptions).

Grade it with ``python -m minengine lab grade preemption labs/preemption/preemption.py``.
"""

from __future__ import annotations

from minengine.request import Request


def pick_victim(step) -> Request:
    """The running request to preempt, as the scheduling policy chooses.

    The candidates are the running requests NOT yet scheduled in this step (a request scheduled in this step
    has its chunk in the step already: freeing its blocks would leave the step reading freed blocks), in
    running (admission) order; the one asking for blocks is one of them. The policy picks:
    ``step.policy.pick_victim(candidates, step.step_index)``.

    Returns:
        the victim (possibly the request that asked for blocks itself).
    """
    raise NotImplementedError("implement pick_victim: ask step.policy.pick_victim among the running requests "
                              "not yet scheduled this step (step.unscheduled_running())")


def preempt(step, victim: Request) -> None:
    """Preempt ``victim`` by recompute.

    Afterwards: ``victim`` is no longer running and is the FIRST waiting request (it goes next); it holds no
    block (all of them free, or back in the prefix cache's free queue); nothing of it counts as computed
    (``num_computed_tokens`` 0, status ``RequestStatus.PREEMPTED``, ``prefill_len`` = its tokens so far: prompt
    + generated, which the re-prefill covers); ``victim.num_preemptions`` has grown by one; and the step
    records it (``step.out.preempted_ids``).
    """
    raise NotImplementedError("implement preempt: remove from running, free its blocks, reset its progress for "
                              "recompute, put it at the front of waiting, record it in step.out.preempted_ids")


def allocate_or_preempt(step, request: Request, num_new: int) -> bool:
    """Get the KV slots for ``num_new`` more tokens of the running ``request``, preempting as needed.

    Try ``step.kv.allocate_slots(request, num_new)``; while it returns None, pick a victim and preempt it,
    then try again. If the victim is ``request`` itself, stop: it is no longer running and gets nothing.

    Returns:
        True when the slots are allocated, False when ``request`` was preempted itself.
    """
    raise NotImplementedError("implement allocate_or_preempt: allocate; while that fails, preempt the victim; "
                              "give up (False) once the victim is the request itself")
