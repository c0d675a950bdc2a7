"""A request's ``arrival_time`` on the engine's clock: vLLM's are wall-clock (``time.time()``), minengine's engine
clock may be ``perf_counter`` or modelled. ``InputProcessor`` maps a given arrival time through here."""

from __future__ import annotations

import time

UNIX_TIME_FLOOR = 1e9  # seconds since 1970 (2001-09-09): engine clocks (perf_counter, modelled) count from ~0


def wall_to_engine_clock(arrival_time: float, now: float, wall_now: float | None = None) -> float:
    """An ``arrival_time`` on the engine clock. vLLM's arrival times are wall-clock (``time.time()``); minengine's
    engine clock may be ``perf_counter`` (seconds since boot) or modelled (from 0). A value later than the engine
    clock's ``now`` that is a plausible Unix time (after 2001 and not in the wall clock's future by more than a
    second) is taken as wall-clock and mapped by its age: ``now - (time.time() - arrival_time)``, so
    ``arrival_time=time.time()`` means "now" on any clock and a request that arrived 2 s ago is 2 s old. Any
    other value is already on the engine clock and is returned as it is. (The age is wall seconds; on a modelled
    clock it counts as modelled seconds.)"""
    if arrival_time <= now:
        return arrival_time
    wall_now = time.time() if wall_now is None else wall_now
    if UNIX_TIME_FLOOR < arrival_time <= wall_now + 1.0:
        return now - max(0.0, wall_now - arrival_time)
    return arrival_time
