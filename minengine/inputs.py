"""Prompt types (vLLM's ``vllm.inputs``): a prompt is a string, a ``TextPrompt`` or a ``TokensPrompt``."""

from __future__ import annotations

from typing import TypedDict

# re-exported: the checks of raw prompt values (``minengine/value_checks.py``)
from minengine.value_checks import as_float, as_request_ids, check_unicode, token_ids  # noqa: F401


class TextPrompt(TypedDict):
    """A text prompt: ``{"prompt": "ROMEO:"}``."""

    prompt: str


class _TokenIds(TypedDict):
    prompt_token_ids: list[int]


class TokensPrompt(_TokenIds, total=False):
    """A prompt given as token ids: ``{"prompt_token_ids": [5, 6, 7]}`` (``prompt`` may keep its text)."""

    prompt: str


PromptType = str | TextPrompt | TokensPrompt
