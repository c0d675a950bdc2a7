"""Preemption between steps: outside ``schedule()``, the caller preempts running requests itself.

Inside a step the ``StepBuilder`` preempts when blocks run out (``StepBuilder.preempt``). Between steps the engine
preempts in one case of its own: vLLM's ``reset_prefix_cache(reset_running_requests=True)`` first preempts every
running request by recompute, so no block is held and the cache can be emptied. ``preempt_request`` is the same
move for one request (what a test or a fleet component preempts by hand).
"""

from __future__ import annotations

import dataclasses

from minengine.core.scheduler import Scheduler
from minengine.core.scheduler_output import SchedulerOutput
from minengine.request import Request


def preempt_request(scheduler: Scheduler, request: Request, out: SchedulerOutput) -> None:
    """Preempt a running request between steps, recording the move in ``out``."""
    step = scheduler.new_step(out)
    step.preempt(request)
    scheduler.count_moves(step)


def preempt_running_by_recompute(scheduler: Scheduler) -> int:
    """Preempt every running request by recompute, between steps (what vLLM's
    ``reset_prefix_cache(reset_running_requests=True)`` does first): their blocks are freed and
    ``num_computed_tokens`` goes back to 0, their generated tokens stay, and they wait at the front of the queue in
    their running order. Recompute whatever ``preemption_mode`` says: the point is to hold no block. Returns how
    many were preempted.

    Raises:
        RuntimeError: while a scheduled step is open (between ``schedule()`` and ``update_from_output``).
    """
    if scheduler.has_open_step:
        raise RuntimeError("cannot preempt between schedule() and update_from_output(): a step is open")
    step = scheduler.new_step(SchedulerOutput())
    step.config = dataclasses.replace(scheduler.config, preemption_mode="recompute")
    victims = list(scheduler.running)
    for request in reversed(victims):  # each goes to the front: the first running ends up first
        step.preempt(request)
    scheduler.count_moves(step)
    return len(victims)
