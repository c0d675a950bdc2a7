"""The default policy: running requests first, then new prompts."""

from __future__ import annotations

from minengine.core.policies.base import SchedulingPolicy
from minengine.core.step_builder import StepBuilder


class DecodeFirst(SchedulingPolicy):
    """Running requests first, in admission order (their decodes and unfinished prefill chunks), then new
    prompts with what is left. Protects TPOT: a running request is never stalled by a newcomer (vLLM v1,
    Sarathi-Serve's stall-free batching, Agrawal et al., OSDI 2024)."""

    name = "decode-first"

    def fill(self, step: StepBuilder) -> None:
        step.run_all(step.unscheduled_running())
        step.admit_all()
