"""A live server's redraw interval follows its traffic (``minengine/viz/server_pacing.py``)."""

from __future__ import annotations

from minengine.viz.server_pacing import (
    SERVER_FIRST_TICK_S,
    SERVER_IDLE_AFTER_S,
    SERVER_IDLE_TICK_S,
    SERVER_TICK_S,
    note_traffic,
    redraw_interval,
)


def test_the_interval_is_short_before_the_first_step_then_follows_the_traffic():
    assert redraw_interval(False, True) == redraw_interval(False, False) == SERVER_FIRST_TICK_S
    assert redraw_interval(True, False) == SERVER_TICK_S
    assert redraw_interval(True, True) == SERVER_IDLE_TICK_S


def test_note_traffic_is_quiet_only_after_the_idle_time_without_steps():
    state: dict = {}
    assert note_traffic(state, "p", False, 100.0) is False  # the first call starts the count
    assert state == {"p_last_new": 100.0}
    assert note_traffic(state, "p", False, 100.0 + SERVER_IDLE_AFTER_S - 0.1) is False
    assert note_traffic(state, "p", False, 100.0 + SERVER_IDLE_AFTER_S) is True
    assert note_traffic(state, "p", True, 200.0) is False  # a step came: busy again
    assert state["p_last_new"] == 200.0
