"""The clock protocol ``LLMEngine`` reads time through, the wall clock it runs on by default, and ``as_clock``.

The modelled and measured clocks (``minengine.timing.clocks``) implement the same protocol; this module
imports none of the cost model, so the engine stands without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """What ``LLMEngine`` needs from a clock. Times in seconds; ``label`` names the clock in figure titles."""

    label: str

    def __call__(self) -> float: ...

    def begin_step(self) -> None: ...

    def end_step(self, scheduler_output) -> None: ...

    def advance_to(self, t: float) -> None: ...


class WallClock:
    """Real time from ``timer`` (default ``time.perf_counter``). ``advance_to(t)`` sleeps until ``t``.

    Virtual drivers check ``is_virtual`` (False here) to know that idle gaps take real time.
    """

    is_virtual = False

    def __init__(self, timer: Callable[[], float] = time.perf_counter, label: str = "wall"):
        self._timer = timer
        self.label = label

    def __call__(self) -> float:
        return self._timer()

    def begin_step(self) -> None:
        pass

    def end_step(self, scheduler_output=None) -> None:
        pass

    def advance_to(self, t: float) -> None:
        delay = float(t) - self()
        if delay > 0:
            time.sleep(delay)


class CallableClock(WallClock):
    """A plain callable used as a clock (``LLMEngine(config, clock=time.perf_counter)``): no step hooks."""

    def __init__(self, fn: Callable[[], float]):
        name = "wall" if fn in (time.perf_counter, time.time, time.monotonic) else getattr(fn, "__name__", "clock")
        super().__init__(fn, label=getattr(fn, "label", name))
        self.fn = fn


def as_clock(clock) -> Clock:
    """``clock`` itself when it has the step hooks, else a plain callable wrapped in ``CallableClock``.

    Raises:
        ValueError: ``clock`` is not callable.
    """
    if all(hasattr(clock, name) for name in ("begin_step", "end_step", "advance_to")) and callable(clock):
        if not hasattr(clock, "label"):
            clock.label = type(clock).__name__
        return clock
    if not callable(clock):
        raise ValueError(f"clock must be callable (seconds), got {clock!r}")
    return CallableClock(clock)
