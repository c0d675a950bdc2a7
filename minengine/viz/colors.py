"""Stable colours: one per request id (the same request keeps its colour in every figure and step), and
fixed colours for free and cached-but-free KV blocks."""

from __future__ import annotations

import re
import zlib

import plotly.colors

# Dark24 then Light24: 48 distinct colours, none of them the pale greys and blues used for free blocks.
REQUEST_PALETTE = plotly.colors.qualitative.Dark24 + plotly.colors.qualitative.Light24
FREE_COLOR = "#eeeeee"
CACHED_FREE_COLOR = "#a6cee3"
STALL_COLOR = "#d62728"
BUDGET_COLOR = "#444444"


def request_color(request_id: str) -> str:
    """The colour of one request: ids ending in a number (``r7``, ``req-12``) use that number, so the first
    48 requests of a run never collide; other ids use a CRC32 of the id (deterministic across processes,
    unlike ``hash``)."""
    m = re.search(r"(\d+)$", request_id)
    index = int(m.group(1)) if m else zlib.crc32(request_id.encode())
    return REQUEST_PALETTE[index % len(REQUEST_PALETTE)]


def discrete_colorscale(colors: list[str]) -> list[list]:
    """A Plotly colorscale that paints integer z = i in ``colors[i]`` when used with
    ``zmin=-0.5, zmax=len(colors) - 0.5`` (each colour owns one equal band)."""
    n = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale
