"""Markdown output for notebooks: sentences whose numbers come from the cell that prints them."""

from __future__ import annotations

from IPython.display import Markdown


def show(text: str) -> Markdown:
    """A sentence (usually an f-string with measured numbers) rendered as Markdown; use as a cell's value."""
    return Markdown(text)

