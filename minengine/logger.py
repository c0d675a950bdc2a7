"""vLLM's ``vllm.logger.init_logger``: a module's logger (the standard library's ``logging``; minengine configures
no handlers of its own, so records go wherever the application sends them)."""

from __future__ import annotations

import logging


def init_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` under vLLM's name."""
    return logging.getLogger(name)
