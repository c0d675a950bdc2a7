"""Conclusions that hold: a sentence of the course is shown only with the checks that make it true.

``conclude(text, checks)`` renders ``text`` (Markdown, usually an f-string of the cell's own numbers) after
asserting every ``(statement, holds)`` pair; when an experiment stops showing what the text says, the cell
raises ``ConclusionError`` naming the failed statement, so the notebook run (and CI) fails instead of
printing a sentence its numbers contradict.
"""

from __future__ import annotations

from collections.abc import Iterable

from minengine.course.display import show


class ConclusionError(AssertionError):
    """A conclusion sentence of the course is not supported by the numbers of its cell."""


def claim(statement: str, holds: bool) -> None:
    """Raise ``ConclusionError(statement)`` unless ``holds`` is true (a bool, not merely truthy data).

    Raises:
        ConclusionError: ``holds`` is false.
        ValueError: ``holds`` is not a bool (a guard against passing the numbers instead of the comparison).
    """
    if not isinstance(holds, bool):
        holds_type = type(holds).__name__
        if holds_type != "bool_":  # numpy's bool
            raise ValueError(f"claim {statement!r}: holds must be a bool, got {holds_type}")
    if not holds:
        raise ConclusionError(f"the experiment no longer shows: {statement}")


def conclude(text: str, checks: Iterable[tuple[str, bool]] = ()):
    """Assert every ``(statement, holds)`` in ``checks`` (``claim``), then return ``text`` as Markdown.

    Use it as the last expression of a conclusion cell (tag ``conclusion``), so the sentence renders.

    Raises:
        ConclusionError: a check does not hold.
    """
    for statement, holds in checks:
        claim(statement, holds)
    return show(text)
