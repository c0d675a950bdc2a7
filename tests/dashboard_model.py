"""Which model the dashboard tests run: ``$MINENGINE_MODEL`` if set, else the bundled one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from minengine.config import BUNDLED_MODEL


def dashboard_model() -> str | None:
    """``$MINENGINE_MODEL`` if set, else the bundled model (None = the engine's default); skips the test when
    neither exists."""
    env = os.environ.get("MINENGINE_MODEL")
    if env:
        return env
    if not (Path(BUNDLED_MODEL) / "config.json").exists():
        pytest.skip("bundled model missing: run scripts/train_tiny_model.py or set MINENGINE_MODEL")
    return None
