"""Watching a run while it runs: a stream of ``StepTrace``s, played at a chosen speed, with pause and resume.

The live view's only input is a ``TraceStream``: something that hands over the steps that happened since it
was last asked. ``minengine.viz.runner.WorkloadRun`` is one (it steps a local engine when polled); a client of
a server's step feed (``minengine.viz.server_feed.ServerFeed``: each ``StepTrace`` as JSON, ``trace_from_dict``)
is another. ``LivePlayer`` paces it:
each ``tick`` takes as many new steps as the speed allows for the real time that passed (or as many as fit a
time budget at full speed), nothing while paused, and keeps every trace so far for the figures, which are the
same ``minengine.viz`` builders as for a finished run. One lock serialises ``tick`` and ``finish``: Streamlit can
run a page's ``run_every`` fragment and a full rerun (e.g. "Finish now") at the same time, and two threads must
never step one engine.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from minengine.metrics.trace import ScheduledChunk, StepTrace

SPEEDS = (1, 2, 5, 10, 20, 50, 0)  # steps per second; 0 = as fast as the engine runs
DEFAULT_SPEED = 10
TICK_S = 0.4  # seconds between two redraws of a live view (each redraws three figures: gentle on 2 cores)
MEASURE_MIN_S = 1.0  # the played speed is reported once this much real time of ticks backs it
MEASURE_WINDOW_S = 5.0  # ... over the ticks of about the last 5 s (a machine can get busy mid-run)
SHORT_FRACTION = 0.9  # more than 10 % of the asked steps dropped: the view says it plays slower


@runtime_checkable
class TraceStream(Protocol):
    """A source of steps: ``poll`` returns the steps that happened since the last call, oldest first, at
    most ``max_steps`` of them and, when the source has to compute them, spending about ``budget_s`` real
    seconds at most (at least one step if any is left); ``done`` is True once no step will come."""

    done: bool

    def poll(self, max_steps: int, budget_s: float = math.inf) -> list[StepTrace]: ...


class LivePlayer:
    """Plays a ``TraceStream`` at ``speed`` steps per second (0 = as fast as it comes), with pause/resume.

    Args:
        stream: the source of steps.
        speed: steps per second, >= 0 (0 = full speed).
        budget_s: real seconds one ``tick`` may spend waiting for the stream (keeps the page responsive when
            steps are slow to compute).
        timer: real time in seconds (a test may pass its own).
        keep: keep only the latest ``keep`` steps in ``traces`` (a stream without end, such as a server's
            feed); None keeps them all.

    Raises:
        ValueError: a negative speed, a non-positive budget or ``keep`` < 1.
    """

    def __init__(self, stream: TraceStream, speed: float = DEFAULT_SPEED, budget_s: float = 0.5,
                 timer: Callable[[], float] = time.perf_counter, keep: int | None = None):
        if not budget_s > 0:
            raise ValueError(f"budget_s must be > 0 seconds, got {budget_s!r}")
        if keep is not None and not (isinstance(keep, int) and keep >= 1):
            raise ValueError(f"keep must be an integer >= 1 (steps) or None, got {keep!r}")
        self.keep = keep
        self.stream = stream
        self.traces: list[StepTrace] = []
        self.paused = False
        self.budget_s = budget_s
        self._timer = timer
        self._credit = 1.0  # steps owed: the first tick shows a step at once
        self._last: float | None = None
        self._lock = threading.Lock()  # one caller at a time polls the stream (see the module docstring)
        self._speed = math.nan
        self.speed = speed

    @property
    def speed(self) -> float:
        return self._speed

    @speed.setter
    def speed(self, value: float) -> None:
        if not value >= 0:
            raise ValueError(f"speed must be >= 0 steps/s (0 = full speed), got {value!r}")
        if float(value) != self._speed:
            self._reset_measure()  # the played speed is measured at one asked speed
        self._speed = float(value)

    def _reset_measure(self) -> None:
        # (seconds since the previous tick, steps taken, steps owed but dropped) per tick, the latest last
        self._measured: deque[tuple[float, int, float]] = deque()

    def _measure(self, seconds: float, steps: int, dropped: float) -> None:
        self._measured.append((seconds, steps, dropped))
        while sum(s for s, _, _ in self._measured) - self._measured[0][0] >= MEASURE_WINDOW_S:
            self._measured.popleft()

    @property
    def played_speed(self) -> float | None:
        """Steps per second this player really took at the current ``speed``, from its own ticks of about the last
        ``MEASURE_WINDOW_S`` seconds: their steps over the real time between them (each tick's steps over the time
        since the tick before; pauses and the first tick after one are not counted). None until ticks spanning
        ``MEASURE_MIN_S`` seconds back it."""
        seconds = sum(s for s, _, _ in self._measured)
        if seconds < MEASURE_MIN_S:
            return None
        return sum(n for _, n, _ in self._measured) / seconds

    @property
    def falls_short(self) -> bool:
        """True when the player dropped more than ``1 - SHORT_FRACTION`` of the steps asked of it over the measured
        ticks: steps owed that a tick's time budget could not take, or real time a late tick could not turn into
        owed steps (more than ``4 * TICK_S`` since the previous one). Never at full speed (0) or once the stream
        has ended. Counting drops, not comparing ``played_speed``, keeps a slow speed's rounding (one step every
        few ticks) from reading as a shortfall."""
        if self.played_speed is None or self._speed == 0 or self.done:
            return False
        asked = self._speed * sum(s for s, _, _ in self._measured)
        return sum(d for _, _, d in self._measured) > (1 - SHORT_FRACTION) * asked

    @property
    def done(self) -> bool:
        """True once the stream has ended."""
        return self.stream.done

    def pause(self) -> None:
        """Stop taking steps (the stream is not polled, so a local engine does not run)."""
        self.paused = True

    def resume(self) -> None:
        """Take steps again, from now on (the paused time does not count as owed steps)."""
        self.paused = False
        self._last = None
        self._credit = max(self._credit, 1.0)  # show the next step at once

    def tick(self) -> list[StepTrace]:
        """Take the steps due since the last tick (none while paused or done) and return them; they are also
        appended to ``traces``.

        Raises:
            whatever the stream raises (e.g. ``RuntimeError`` from the engine's guards).
        """
        with self._lock:
            return self._tick()

    def _tick(self) -> list[StepTrace]:
        now = self._timer()
        if self.paused or self.done:
            self._last = None
            return []
        dropped = 0.0  # steps owed at the asked speed that this tick lets go
        if self._speed == 0:
            due = math.inf
        else:
            if self._last is not None:
                # owed steps grow with real time, but never by more than one tick's worth after a slow tick
                self._credit += min(now - self._last, 4 * TICK_S) * self._speed
                dropped = max(0.0, now - self._last - 4 * TICK_S) * self._speed
            due = math.floor(self._credit)
        previous, self._last = self._last, now
        new = [] if due < 1 else self.stream.poll(due if math.isfinite(due) else 1 << 30, self.budget_s)
        if due >= 1 and math.isfinite(due):
            self._credit -= due  # steps a budget-limited tick could not take are dropped, not owed
            if not self.stream.done:
                dropped += due - len(new)
        if previous is not None:  # this tick's steps, over the real time since the previous tick began
            self._measure(now - previous, len(new), dropped)
        self._append(new)
        return new

    def _append(self, new: list[StepTrace]) -> None:
        self.traces.extend(new)
        if self.keep is not None and len(self.traces) > self.keep:
            del self.traces[:len(self.traces) - self.keep]

    def finish(self) -> list[StepTrace]:
        """Take every remaining step now, at full speed (after a ``tick`` in flight in another thread); returns
        them."""
        with self._lock:
            new = []
            while not self.done:
                new += self.stream.poll(1 << 30)
            self._append(new)
            return new


def trace_from_dict(d: dict) -> StepTrace:
    """A ``StepTrace`` from its ``to_dict()`` form (e.g. one event of a server's step feed decoded from JSON).

    Raises:
        ValueError: a missing field.
    """
    try:
        fields = dict(d)
        fields["chunks"] = [ScheduledChunk(**c) for c in d["chunks"]]
        return StepTrace(**fields)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a StepTrace dict: {exc}") from exc
