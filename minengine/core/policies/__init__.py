"""Scheduling policies: how one step spends the token budget across decodes, unfinished prefill chunks and
new prompts, which waiting request goes next and which running request is the preemption victim.

Every policy is a small class behind one interface (``SchedulingPolicy``); the mechanics (chunking,
allocation, preemption, admission, the admission probe, swapping) stay in ``StepBuilder``, so a policy only
decides an ORDER and CAPS. ``POLICIES`` maps the names of ``EngineConfig.scheduling_policy`` to classes.

Imports go one way: the scheduler imports the policies, the policies the step builder (the moves they call),
and the builder sees a policy only through ``step_builder.QueueOrder`` (its ``next_waiting`` and
``pick_victim``), so it imports neither.

The default, ``DecodeFirst``, is in ``decode_first.py``; the interface in ``base.py``; every other policy in
``others.py``.
"""

from __future__ import annotations

from minengine.core.policies.base import PolicySettings, SchedulingPolicy, split_running
from minengine.core.policies.decode_first import DecodeFirst
from minengine.core.policies.others import (
    Balanced,
    DynamicSplitFuse,
    PrefillFirst,
    Priority,
    RoundRobin,
    ShortestPredictedFirst,
)

__all__ = ["POLICIES", "Balanced", "DecodeFirst", "DynamicSplitFuse", "PolicySettings", "PrefillFirst", "Priority",
           "RoundRobin", "SchedulingPolicy", "ShortestPredictedFirst", "make_policy", "split_running"]

POLICIES: dict[str, type[SchedulingPolicy]] = {
    cls.name: cls for cls in (DecodeFirst, PrefillFirst, Balanced, DynamicSplitFuse, Priority, RoundRobin,
                              ShortestPredictedFirst)
}


def make_policy(name: str, settings: PolicySettings | None = None) -> SchedulingPolicy:
    """The policy called ``name`` (a key of ``POLICIES``). Raises ``ValueError`` for an unknown name."""
    if name not in POLICIES:
        raise ValueError(f"scheduling_policy must be one of {tuple(POLICIES)}, got {name!r}")
    return POLICIES[name](settings)
