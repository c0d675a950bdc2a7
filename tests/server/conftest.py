"""Fixtures of the server tests."""

from __future__ import annotations

import pytest

from minengine import LLM
from tests.server_helpers import SERVER_CONFIG


@pytest.fixture(scope="module")
def ref(bundled_model) -> LLM:
    """An offline ``LLM`` with the engine settings of ``server`` (``SERVER_CONFIG``): the text the server must
    give back."""
    return LLM(bundled_model, **SERVER_CONFIG)
