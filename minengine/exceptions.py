"""minengine's exceptions under vLLM's names (``vllm.exceptions``), and how an error message shows a bad value.

``VLLMValidationError`` is what every validation of a request or a setting raises (``SamplingParams``,
``EngineConfig``, ``EngineArgs``, the engine's ``add_request``): it is a ``ValueError``, so code written for
minengine (``except ValueError``) and code written for vLLM (``except VLLMValidationError``) both catch it.
"""

from __future__ import annotations

import reprlib
from typing import Any

_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlist, _SHOW.maxdict = 3, 60, 60, 8, 6
_MAX_DIGITS = 30


class VLLMValidationError(ValueError):
    """A request or a setting failed validation (vLLM's ``vllm.exceptions.VLLMValidationError``).

    Args:
        message: what is wrong, naming the field and the allowed range.
        parameter: the field's name (the OpenAI server answers 400 with it as ``param``), or None.
        value: the rejected value, or None; shown (shortened) after the message.
    """

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value

    def __str__(self) -> str:  # vLLM's format: "message (parameter=..., value=...)"
        base = super().__str__()
        extras = []
        if self.parameter is not None:
            extras.append(f"parameter={self.parameter}")
        if self.value is not None:
            extras.append(f"value={show(self.value)}")
        return f"{base} ({', '.join(extras)})" if extras else base

    @property
    def message(self) -> str:
        """The message alone, without vLLM's ``(parameter=..., value=...)`` suffix."""
        return super().__str__()


def show(value: Any) -> str:
    """A short ``repr`` of a user's value for an error message: nested containers three levels deep, long
    strings and lists cut with "...", an integer of more than 30 digits as its size (a plain ``repr`` of a
    5,000-deep list raises ``RecursionError``, and of a 5,000-digit int ``ValueError``)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3.33 * _MAX_DIGITS:
        return f"{'-' if value < 0 else ''}<an integer of {value.bit_length()} bits>"
    try:
        return _SHOW.repr(value)
    except Exception:  # a user object whose __repr__ fails
        return f"<{type(value).__name__} object>"


class RequestError(RuntimeError):
    """A step failed because of particular requests (their detokenizing or logprobs raised): ``LLMEngine.step``
    rolled the step back and raises this, ``from`` the original error. The caller decides: abort those requests
    and step on (the others are served as if nothing happened), or retry.

    Attributes:
        request_ids: the requests to blame, by the ids the caller gave (an ``n > 1`` request's own id, not its
            children's).
    """

    def __init__(self, request_ids: list[str], message: str):
        super().__init__(message)
        self.request_ids = list(request_ids)
