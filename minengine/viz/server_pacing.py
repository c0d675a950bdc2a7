"""How often the dashboard redraws a live server (``app.py``'s server view, ``pages/Router.py``'s replicas): a
redraw rebuilds plotly figures, so the interval follows the traffic. Before the first step the view looks
often (the first figures come right after the first step), then every ``SERVER_TICK_S``, and once no step came
for ``SERVER_IDLE_AFTER_S`` every ``SERVER_IDLE_TICK_S`` (an idle server costs a third of the CPU)."""

from __future__ import annotations

from collections.abc import MutableMapping

SERVER_WINDOWS = (50, 100, 200, 500, 1000)  # steps of a server's feed on screen
SERVER_WINDOW = 100  # the default: ~0.3 s of steps at ~8 ms each (bundled model, 2 cores, 8 clients)
SERVER_TICK_S = 2.0  # a live server's view redraws seven figures (~0.5 s of plotly on a busy 2-core machine)
SERVER_IDLE_TICK_S = 6.0  # ... every 6 s once no step came for SERVER_IDLE_AFTER_S (an idle server: ~1/3 the CPU)
SERVER_IDLE_AFTER_S = 10.0
SERVER_CONNECT_WAIT_S = 5.0  # Connect waits this long at most for the server's history replay, to draw it at once
SERVER_FIRST_TICK_S = 0.5  # ... and until a first step came, the view looks again this often


def redraw_interval(has_steps: bool, idle: bool) -> float:
    """Seconds until the next redraw: ``SERVER_FIRST_TICK_S`` while no step has come, else ``SERVER_IDLE_TICK_S``
    when ``idle`` (``is_quiet``), else ``SERVER_TICK_S``."""
    if not has_steps:
        return SERVER_FIRST_TICK_S
    return SERVER_IDLE_TICK_S if idle else SERVER_TICK_S


def is_quiet(now_s: float, last_new_s: float) -> bool:
    """True once ``SERVER_IDLE_AFTER_S`` seconds have passed since a step last came (``time.monotonic`` seconds)."""
    return now_s - last_new_s >= SERVER_IDLE_AFTER_S


def note_traffic(state: MutableMapping, prefix: str, got_steps: bool, now_s: float) -> bool:
    """Keep in ``state`` (a page's session state) when a step last came, ``<prefix>_last_new`` (``time.monotonic``
    seconds; set at the first call too), and return whether the view is quiet now (``is_quiet``)."""
    key = f"{prefix}_last_new"
    if got_steps or key not in state:
        state[key] = now_s
    return is_quiet(now_s, state[key])
