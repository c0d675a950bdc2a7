"""Stable colours: one per request id (the same request keeps its colour in every figure and step), and
fixed colours for free, cached-but-free and shared KV blocks."""

from __future__ import annotations

import re
import zlib

import plotly.colors

FREE_COLOR = "#eeeeee"
CACHED_FREE_COLOR = "#a6cee3"
SHARED_COLOR = "#3a3a3a"  # a block held by more than one request (prefix cache hit): dark grey, the count in white
STALL_COLOR = "#d62728"
BUDGET_COLOR = "#444444"


def _rgb(hex_color: str) -> tuple[int, int, int]:
    return tuple(int(hex_color[i:i + 2], 16) for i in (1, 3, 5))


def _distinct_palette(candidates: list[str], reserved: list[str], min_saturation: float = 0.3,
                      min_distance: float = 60.0) -> list[str]:
    """``candidates`` in order, without greys (saturation below ``min_saturation``) and without any colour
    closer than ``min_distance`` (Euclidean, 0-255 RGB) to one already kept or to a ``reserved`` one."""
    kept: list[str] = []
    for c in candidates:
        rgb = _rgb(c)
        if max(rgb) / 255 - min(rgb) / 255 < min_saturation:
            continue
        if any(sum((a - b) ** 2 for a, b in zip(rgb, _rgb(o))) ** 0.5 < min_distance for o in kept + reserved):
            continue
        kept.append(c)
    return kept


# D3's category10, then Dark24 and Light24, keeping only colours that are neither grey nor close to another
# (28 colours): no request looks like a free, cached or shared block, and neighbours r4 / r10 stay apart.
REQUEST_PALETTE = _distinct_palette(
    plotly.colors.qualitative.D3 + plotly.colors.qualitative.Dark24 + plotly.colors.qualitative.Light24,
    reserved=[FREE_COLOR, CACHED_FREE_COLOR, SHARED_COLOR])


_NUMBERED_ID = re.compile(r"^(?:[A-Za-z][A-Za-z_-]{0,15}|.*#)(\d+)$")  # "r7", "req-12", "azure-4", "cmpl-…-0 #17"


def request_color(request_id: str) -> str:
    """The colour of one request. A short name and a number (``r7``, ``req-12``, ``dec-0``; or a feed's display
    name ending in ``#17``) use that number, so the first ``len(REQUEST_PALETTE)`` (28) requests of a run never
    collide. Any other id (``long``, a server's ``cmpl-71418df7...-0``, whose trailing 0 is the choice index
    and the same for every request) uses a CRC32 of the whole id (deterministic across processes, unlike
    ``hash``) into the upper half of the palette, clear of the low numbers that numbered ids take first."""
    m = _NUMBERED_ID.match(request_id)
    if m:
        return REQUEST_PALETTE[int(m.group(1)) % len(REQUEST_PALETTE)]
    half = len(REQUEST_PALETTE) // 2
    return REQUEST_PALETTE[half + zlib.crc32(request_id.encode()) % (len(REQUEST_PALETTE) - half)]


# Streamlit's plotly frontend replaces #000001 ... #000010 anywhere in a figure's JSON with its categorical palette
# (placeholders for its theme), so Magma's black #000004 would paint an empty queue pink. Near-blacks stay clear of
# #0000[01][0-9], one step wider than that set.
_REPAINTED_BY_STREAMLIT = re.compile(r"^#0000[01][0-9]$", re.IGNORECASE)


def streamlit_safe_colorscale(name: str) -> list[list]:
    """Plotly's named colorscale ``name`` (e.g. "Magma") as [position, "#rrggbb"] pairs, with any colour that
    Streamlit's frontend repaints (``#0000bb`` for bb in 00-19) raised to ``#0101bb``: the same near-black to the eye.

    Raises:
        plotly.exceptions.PlotlyError: an unknown colorscale name.
    """
    scale = []
    for pos, colour in plotly.colors.get_colorscale(name):
        if colour.startswith("rgb"):  # some of plotly's scales (Greys, Blues) are written as rgb(r, g, b)
            colour = "#{:02x}{:02x}{:02x}".format(*(round(v) for v in plotly.colors.unlabel_rgb(colour)))
        scale.append([pos, "#0101" + colour[5:] if _REPAINTED_BY_STREAMLIT.match(colour) else colour])
    return scale


def discrete_colorscale(colors: list[str]) -> list[list]:
    """A Plotly colorscale that paints integer z = i in ``colors[i]`` when used with
    ``zmin=-0.5, zmax=len(colors) - 0.5`` (each colour owns one equal band)."""
    n = len(colors)
    scale = []
    for i, c in enumerate(colors):
        scale += [[i / n, c], [(i + 1) / n, c]]
    return scale
