"""Course settings read once from the environment: the size switch and the model the chapters load.

``MINENGINE_FAST=1`` shrinks every workload (fewer requests, shorter prompts) while keeping every cell, so
CI can run the whole course in minutes on 2 cores. ``MINENGINE_MODEL`` (the name the dashboard and its tests
use too) points the chapters at another checkpoint (a directory or Hugging Face id); unset means the bundled
tiny Shakespeare model.
"""

from __future__ import annotations

import os
from typing import TypeVar

T = TypeVar("T")

FAST: bool = os.environ.get("MINENGINE_FAST") == "1"
COURSE_MODEL: str | None = os.environ.get("MINENGINE_MODEL") or None


def pick(full: T, fast: T, fast_mode: bool | None = None) -> T:
    """``full`` normally, ``fast`` under ``MINENGINE_FAST=1`` (or when ``fast_mode`` says so explicitly).

    Example: ``num_requests = pick(32, 8)``.
    """
    return fast if (FAST if fast_mode is None else fast_mode) else full
