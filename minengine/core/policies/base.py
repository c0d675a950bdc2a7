"""The interface every scheduling policy implements (``SchedulingPolicy``), its knobs (``PolicySettings``), and
``split_running``, the decode / prefill split several policies start from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from minengine.core.step_builder import StepBuilder
from minengine.request import Request


@dataclass(frozen=True)
class PolicySettings:
    """The knobs some policies read (see ``EngineConfig`` for their meaning and validation).

    Attributes:
        prefill_decode_ratio: balanced: prefill tokens : decode tokens of the budget.
        splitfuse_target_tokens: dynamic-splitfuse: target tokens per forward; None = the whole budget.
        priority_aging_steps: priority: steps per one unit of priority gained while in the system; 0 = off.
        predicted_length_aging_steps: shortest-predicted-first: steps per one token of predicted remaining work
            a request is forgiven while in the system; 0 = off (pure shortest-predicted-first, which can starve).
    """

    prefill_decode_ratio: float = 1.0
    splitfuse_target_tokens: int | None = None
    priority_aging_steps: int = 64
    predicted_length_aging_steps: int = 4


class SchedulingPolicy:
    """One way to fill a step. Subclasses implement ``fill`` and may override the queue order and victim.

    Args:
        settings: the policy knobs (``PolicySettings``); defaults when None.
    """

    name: ClassVar[str] = ""
    needs_predictor: ClassVar[bool] = False  # orders by ``Request.predicted_output_len``

    def __init__(self, settings: PolicySettings | None = None):
        self.settings = settings or PolicySettings()

    def fill(self, step: StepBuilder) -> None:
        """Schedule this step's work through ``step.run_all`` / ``step.admit_all`` (and friends)."""
        raise NotImplementedError

    def next_waiting(self, waiting: Sequence[Request], step_index: int) -> Request:
        """The waiting request to admit next (first come, first served; preempted requests sit in front)."""
        return waiting[0]

    def pick_victim(self, candidates: Sequence[Request], step_index: int) -> Request:
        """The request to preempt, among running requests not yet scheduled this step (in running order,
        the one asking for blocks included). Default: the most recently admitted (vLLM v1)."""
        return candidates[-1]


def _last_scheduled(request: Request) -> int:
    return -1 if request.last_scheduled_step is None else request.last_scheduled_step


def split_running(step: StepBuilder) -> tuple[list[Request], list[Request]]:
    """Unscheduled running requests as (decodes, unfinished prefills). Prefills in running order; decodes
    least recently scheduled first (ties: running order), so a policy that serves only some of the decodes
    in a step (a capped share, or a budget smaller than the decodes) serves them in turn: round-robin over
    the decodes, each of which costs one token (without proposals). When every decode was served in the
    previous step they all tie, and this is running order."""
    decodes, prefills = [], []
    for r in step.unscheduled_running():
        (decodes if r.is_decode else prefills).append(r)
    decodes.sort(key=_last_scheduled)  # stable
    return decodes, prefills
