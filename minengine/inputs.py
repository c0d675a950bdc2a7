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


def check_unicode(text: str, field: str) -> None:
    """Raise ``ValueError`` naming ``field`` when ``text`` cannot be encoded as UTF-8: a lone surrogate (from
    undecodable bytes in argv, or a JSON ``"\\ud800"`` escape), which tokenizers reject with a ``TypeError``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{field} is not valid Unicode text: {exc.object[exc.start:exc.end]!r} at character "
                         f"{exc.start} is a lone surrogate") from None
