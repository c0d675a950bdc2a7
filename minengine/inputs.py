"""Prompt types (vLLM's ``vllm.inputs``): a prompt is a string, a ``TextPrompt`` or a ``TokensPrompt``."""

from __future__ import annotations

from typing import TypedDict


class TextPrompt(TypedDict):
    """A text prompt: ``{"prompt": "ROMEO:"}``."""

    prompt: str


class _TokenIds(TypedDict):
    prompt_token_ids: list[int]


class TokensPrompt(_TokenIds, total=False):
    """A prompt given as token ids: ``{"prompt_token_ids": [5, 6, 7]}`` (``prompt`` may keep its text)."""

    prompt: str


PromptType = str | TextPrompt | TokensPrompt
