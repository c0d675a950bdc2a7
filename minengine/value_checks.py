"""Checks of raw input values shared by the engine's intake and the server: text that encodes as UTF-8, finite
numbers, token-id lists, request ids."""

from __future__ import annotations

import numbers
import re
from collections.abc import Iterable

from minengine.exceptions import VLLMValidationError, show


def check_unicode(text: str, field: str) -> None:
    """Raise ``VLLMValidationError`` (a ``ValueError``) naming ``field`` when ``text`` cannot be encoded as UTF-8: a
    lone surrogate (from undecodable bytes in argv, or a JSON ``"\\ud800"`` escape), which tokenizers reject with a
    ``TypeError``. The error's ``parameter`` is the field's top-level name ("messages" for "messages[0].content")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise VLLMValidationError(f"{field} is not valid Unicode text: {exc.object[exc.start:exc.end]!r} at "
                                  f"character {exc.start} is a lone surrogate",
                                  parameter=re.split(r"[.\[ ]", field, maxsplit=1)[0]) from None


def as_float(value) -> float | None:
    """``value`` as a Python float when it is a real number (an int or a float, not a bool) that a float can hold,
    else None: an integer beyond about 1.8e308 (a legal JSON or Python integer such as 10**400) is None rather
    than the ``OverflowError`` that ``float()`` and ``math.isfinite`` raise for it. NaN and inf pass through."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def token_ids(values) -> list:
    """``values`` as a list, its numpy (or other ``numbers.Integral``) integers turned into Python ints; bools and
    anything else are left as they are, for the caller's check to refuse. A 1-D numpy array or torch tensor is
    read with its ``tolist()``."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()
    values = list(values)
    kinds = set(map(type, values))  # one pass at C speed: prompts of a trace replay are long
    if kinds <= {int}:
        return values
    return [int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v for v in values]


def as_request_ids(request_id) -> list[str]:
    """``abort_request``'s argument as a list of ids: one id, or an iterable of ids (read once).

    Raises:
        VLLMValidationError: neither a string nor an iterable of strings.
    """
    if not isinstance(request_id, (str, Iterable)):
        raise VLLMValidationError(f"request_id must be a string or an iterable of strings, got {show(request_id)}")
    ids = [request_id] if isinstance(request_id, str) else list(request_id)  # a generator is read once
    if not all(isinstance(i, str) for i in ids):
        raise VLLMValidationError(f"request_id must be a string or an iterable of strings, got {show(ids)}")
    return ids
