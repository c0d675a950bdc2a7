"""Helpers shared by the notebook course (``notebooks/``): the size switch, exercise checks, sentences with
measured numbers, and engine drivers.

Engine-agnostic on purpose: nothing here schedules, caches or computes attention; the notebooks import the
real engine for that. See ``notebooks/00_tour.ipynb``.
"""

from minengine.course.checks import check, check_close
from minengine.course.display import show
from minengine.course.drive import run_to_completion, run_with_arrivals
from minengine.course.settings import COURSE_MODEL, FAST, pick

__all__ = ["COURSE_MODEL", "FAST", "check", "check_close", "pick", "run_to_completion", "run_with_arrivals", "show"]
