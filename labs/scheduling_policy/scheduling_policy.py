"""Lab 5: a scheduling policy of your own design. Write ``MyPolicy.fill`` (and, if your design needs them,
``next_waiting`` and ``pick_victim``); the engine then builds every step with YOUR policy.

Each step has a token budget (``max_num_batched_tokens``), a number of sequence slots (``max_num_seqs``) and
the free KV blocks. A policy decides the ORDER in which the step's work is taken and any CAPS on it: the
running requests' decodes (one token each), the unfinished prompts' next chunks, and the waiting prompts to
admit. The step builder does the mechanics (chunking to the budget, allocating blocks, preempting when blocks
run out, admitting), so a policy is a few calls to these moves of ``step`` (``minengine/core/step_builder.py``):

- ``step.run(request, limit=None)``: schedule the next tokens (at most ``limit``) of ONE request that is
  RUNNING and not yet scheduled in this step, preempting the policy's victims if blocks run out; it returns the
  tokens (0 when the request was its own victim). It skips nothing: a request that an earlier ``run`` of this
  step preempted is no longer running, and running it again is an error (the grader says so);
- ``step.run_all(requests, cap=None)``: ``run`` each in order while the budget (and ``cap`` tokens) lasts,
  skipping the requests preempted meanwhile or already scheduled: what a ``fill`` uses for a list of requests;
- ``step.admit_next(limit=None)`` / ``step.admit_all(cap=None)``: admit waiting requests (``next_waiting``
  picks which) with a first chunk;
- ``step.unscheduled_running()``, ``step.budget`` (tokens left), ``step.waiting``, ``step.peek_waiting()``,
  ``split_running(step)`` (decodes least recently served first, and unfinished prefills).

The grader replays a held trace (short chats and long documents arriving at random) on the modelled clock (an
H100 serving Llama-3-8B) and counts the requests that meet the SLO (TTFT <= 250 ms and TPOT <= 22 ms): your
policy must do at least as well as the default, decode-first (running requests first, then new prompts in
arrival order). It must also never overfill a step, never stall, never preempt a request scheduled in the
step, and the engine on it must give the same greedy tokens as transformers. The default is in
``minengine/core/policies/decode_first.py``; the others in ``minengine/core/policies/others.py``.

Grade it with ``python -m minengine lab grade scheduling_policy labs/scheduling_policy/scheduling_policy.py``; see
your attainment beside decode-first's with ``from minengine.labs.scheduling_policy_lab import attainment;
attainment("labs/scheduling_policy/scheduling_policy.py")``.
"""

from __future__ import annotations

from collections.abc import Sequence

from minengine.core.policies import SchedulingPolicy, split_running  # noqa: F401  (split_running: for your fill)
from minengine.request import Request


class MyPolicy(SchedulingPolicy):
    """Your policy. Say here what it does and why it should meet more SLOs than decode-first."""

    name = "my-policy"

    def fill(self, step) -> None:
        """Schedule this step's work with ``step``'s moves (see the module docstring). Serve the running
        requests' decodes (a request that stops getting tokens misses its TPOT) and unfinished prompts, and
        admit waiting ones (a prompt that waits misses its TTFT)."""
        raise NotImplementedError("implement MyPolicy.fill: e.g. step.run_all(step.unscheduled_running()) for the "
                                  "running requests, then step.admit_all() with what is left; then improve on it")

    def next_waiting(self, waiting: Sequence[Request], step_index: int) -> Request:
        """The waiting request to admit next (default: the first; preempted requests wait at the front)."""
        return super().next_waiting(waiting, step_index)

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        """The request to preempt when blocks run out: one of ``candidates`` (running, not yet scheduled in
        this step). Default: the most recently admitted."""
        return super().pick_victim(candidates, step_index)
