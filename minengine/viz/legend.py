"""Legends that fit their figure: a vertical legend taller than the plot is cut (plotly scrolls it, and the
entries below the fold are easy to miss), as with preset (d)'s 40 requests. A figure grows to hold a side legend
of up to ``MAX_SIDE_ENTRIES`` entries; past that the legend goes below the plot, several entries per row, and the
figure grows by the rows it needs."""

from __future__ import annotations

import math

import plotly.graph_objects as go

ENTRY_PX = 30  # px per legend entry (a pattern swatch's row; plain markers take a little less)
FRAME_PX = 150  # px of a figure that are not plot area: title, margins, the x axis and its title
MAX_SIDE_ENTRIES = 20  # more than this go below the plot instead of making the figure taller
ENTRIES_PER_ROW = 3  # entries per row of a legend below the plot, each a third of the plot's width: room for
# "request azure-39" and its swatch in a half-width column (the narrowest use); a text-wide entry (plotly's default)
# wrapped to a number of rows that depends on the names, and the figure's rows came out short (cut, scrolled)
BASE_HEIGHT = 450  # px: plotly's default figure height


def fit_legend(fig: go.Figure, num_entries: int, height: int | None = None, below_px: int = 90) -> None:
    """Lay out ``fig``'s legend for ``num_entries`` entries so that none is cut: at the side, with the figure
    ``height`` (default its own, or 450 px) raised to hold them; past ``MAX_SIDE_ENTRIES``, horizontal at the
    bottom of the figure, under a bottom margin of ``below_px`` px kept for the x axis (its ticks and title, and any
    player controls), the figure grown by the legend's rows."""
    base = height or fig.layout.height or BASE_HEIGHT
    if num_entries <= MAX_SIDE_ENTRIES:
        need = FRAME_PX + ENTRY_PX * num_entries
        if need > base:
            fig.update_layout(height=need)
        return
    legend_px = math.ceil(num_entries / ENTRIES_PER_ROW) * ENTRY_PX
    # anchored to the figure's bottom edge (container coordinates), the plot area kept above it by the margin
    fig.update_layout(height=base + legend_px, margin={"b": below_px + legend_px},
                      legend={"orientation": "h", "yref": "container", "yanchor": "bottom", "y": 0,
                              "xanchor": "left", "x": 0, "itemsizing": "constant",
                              "entrywidthmode": "fraction", "entrywidth": 0.95 / ENTRIES_PER_ROW,
                              # plotly's default caps a horizontal legend at half the figure and scrolls the rest
                              "maxheight": legend_px + ENTRY_PX})
