"""Helpers shared by the notebook course (``notebooks/``): the size switch, the teaching clock, exercise checks,
conclusions asserted against their numbers, sentences with measured numbers, and engine drivers.

Engine-agnostic on purpose: nothing here schedules, caches or computes attention; the notebooks import the
real engine for that. See ``notebooks/00_tour.ipynb``.
"""

from minengine.course.checks import check, check_close, check_function
from minengine.course.claims import ConclusionError, claim, conclude
from minengine.course.clock import (
    CLOCK_LABEL,
    TEACHING_CLOCK,
    cpu_engine,
    median_of,
    modelled_engine,
    teaching_clock,
    teaching_cost_model,
    titled,
)
from minengine.course.display import show
from minengine.course.drive import run_to_completion, run_with_arrivals
from minengine.course.settings import COURSE_MODEL, FAST, pick

__all__ = ["CLOCK_LABEL", "COURSE_MODEL", "FAST", "TEACHING_CLOCK", "ConclusionError", "check", "check_close",
           "check_function", "claim", "conclude", "cpu_engine", "median_of", "modelled_engine", "pick",
           "run_to_completion", "run_with_arrivals", "show", "teaching_clock", "teaching_cost_model", "titled"]
