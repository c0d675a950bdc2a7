"""Naming the clock on a figure: every figure whose axis is time says which clock that time is on (a modelled
GPU, or measured CPU time), as the title's subtitle, so a picture is never read as more than it is."""

from __future__ import annotations


def titled(text: str, clock_label: str | None = None) -> dict:
    """A Plotly ``layout.title`` with ``text`` and, when given, ``clock_label`` as its subtitle (e.g. "modelled:
    H100 SXM, Llama-3-8B shapes"). Use with a top margin of at least 80 px (``TOP_MARGIN``)."""
    title: dict = {"text": text}
    if clock_label:
        title["subtitle"] = {"text": clock_label}
    return title


TOP_MARGIN = 84  # px: room for a title and its one-line subtitle
