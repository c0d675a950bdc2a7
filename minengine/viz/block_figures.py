"""The KV block pool and the block tables of one step (PagedAttention, Kwon et al., SOSP 2023, section 4.1:
a request's K/V live in fixed-size physical blocks anywhere in the pool; its block table maps logical block i
to a physical block id)."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from minengine.metrics.trace import StepTrace
from minengine.viz.colors import CACHED_FREE_COLOR, FREE_COLOR, discrete_colorscale, request_color
from minengine.viz.i18n import t


def _require_blocks(trace: StepTrace) -> None:
    if trace.block_tables is None or trace.block_ref_counts is None:
        raise ValueError("trace has no block tables: run the engine with trace_block_tables=True")


def block_owners(trace: StepTrace) -> dict[int, list[str]]:
    """Physical block id -> the running requests whose block table holds it, in the trace's request order."""
    _require_blocks(trace)
    owners: dict[int, list[str]] = {}
    for rid, table in trace.block_tables.items():
        for block_id in table:
            owners.setdefault(block_id, []).append(rid)
    return owners


def pool_grid_columns(num_blocks: int) -> int:
    """Columns of the pool grid: a near-square layout, at most 64 wide, at least 8."""
    return max(8, min(64, math.ceil(math.sqrt(num_blocks))))


def _pool_heatmap(trace: StepTrace, lang: str) -> tuple[go.Heatmap, list[tuple[str, str]], str, int]:
    """The pool grid of one step: (heatmap, legend entries (name, colour), title, columns)."""
    owners = block_owners(trace)
    ref_counts = trace.block_ref_counts
    cached = set(trace.cached_block_ids or [])
    num_blocks = len(ref_counts)
    cols = pool_grid_columns(num_blocks)
    rows = math.ceil(num_blocks / cols)
    # Category 0 = free, 1 = cached-free, 2.. = one per request (in the trace's order).
    request_ids = list(trace.block_tables)
    colors = [FREE_COLOR, CACHED_FREE_COLOR] + [request_color(r) for r in request_ids]
    category_of = {rid: i + 2 for i, rid in enumerate(request_ids)}
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    hover = [[""] * cols for _ in range(rows)]
    for b in range(num_blocks):
        r, c = divmod(b, cols)
        holders = owners.get(b, [])
        if holders:
            z[r][c] = category_of[holders[0]]
            state = t("owned_by", lang).format(owners=", ".join(holders))
        elif ref_counts[b] > 0:  # held by a request not in the snapshot: should not happen, draw it anyway
            z[r][c] = 1
            state = "?"
        elif b in cached:
            z[r][c] = 1
            state = t("cached_free_block", lang)
        else:
            z[r][c] = 0
            state = t("free_block", lang)
        if ref_counts[b] > 1:
            text[r][c] = str(ref_counts[b])
        hover[r][c] = t("hover_pool_block", lang).format(block=b, state=state, ref=ref_counts[b])
    heatmap = go.Heatmap(
        z=z, text=text, texttemplate="%{text}", textfont={"size": 10, "color": "white"}, customdata=hover,
        hovertemplate="%{customdata}<extra></extra>", colorscale=discrete_colorscale(colors),
        zmin=-0.5, zmax=len(colors) - 0.5, showscale=False, xgap=1, ygap=1,
    )
    legend = [(t("free_block", lang), FREE_COLOR), (t("cached_free_block", lang), CACHED_FREE_COLOR)]
    legend += [(f"{t('request', lang)} {rid}", request_color(rid)) for rid in request_ids]
    if any(n > 1 for n in ref_counts):
        legend.append((t("shared_block", lang), "#555555"))
    used = sum(1 for n in ref_counts if n > 0)
    title = t("block_pool_title", lang).format(step=trace.step, used=used, total=num_blocks)
    return heatmap, legend, title, cols


def block_pool_figure(trace: StepTrace, lang: str = "en") -> go.Figure:
    """The physical KV block pool of one step as a grid (block id = row x columns + column).

    Each block is coloured by the request holding it (a shared block by its first holder); blocks with
    ref count > 1 (shared prefix-cache hits) show the count; free blocks that still hold a cached prefix are
    pale blue, other free blocks grey. Hover names the block, its owners and its ref count.

    Args:
        trace: one ``StepTrace`` recorded with ``trace_block_tables=True``.
        lang: "en" or "zh".

    Raises:
        ValueError: the trace has no block tables.
    """
    heatmap, legend, title, cols = _pool_heatmap(trace, lang)
    fig = go.Figure(heatmap)
    # Legend entries (a heatmap has none of its own): free, cached-free, the requests, shared.
    for name, color in legend:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker={"symbol": "square", "size": 12, "color": color}))
    fig.update_layout(
        title=title,
        xaxis={"title": t("block_column", lang).format(cols=cols), "showgrid": False, "zeroline": False},
        yaxis={"title": t("block_row", lang).format(cols=cols), "autorange": "reversed", "showgrid": False,
               "zeroline": False},
        plot_bgcolor="white", legend={"itemsizing": "constant"}, margin={"t": 60},
    )
    return fig


def block_tables_figure(trace: StepTrace, lang: str = "en") -> go.Figure:
    """Each running request's block table at one step: row = request, column = logical block index,
    cell = physical block id (written in the cell), coloured by request; shared cells (ref count > 1)
    are marked with "*".

    Args:
        trace: one ``StepTrace`` recorded with ``trace_block_tables=True``.
        lang: "en" or "zh".

    Raises:
        ValueError: the trace has no block tables.
    """
    _require_blocks(trace)
    request_ids = list(trace.block_tables)
    ref_counts = trace.block_ref_counts
    width = max((len(v) for v in trace.block_tables.values()), default=0)
    colors = [request_color(r) for r in request_ids] or [FREE_COLOR]
    z, text, hover = [], [], []
    for i, rid in enumerate(request_ids):
        table = trace.block_tables[rid]
        z.append([i if j < len(table) else None for j in range(width)])
        text.append([(f"{table[j]}*" if ref_counts[table[j]] > 1 else str(table[j])) if j < len(table) else ""
                     for j in range(width)])
        hover.append([t("hover_table_cell", lang).format(rid=rid, logical=j, physical=table[j],
                                                         ref=ref_counts[table[j]]) if j < len(table) else ""
                      for j in range(width)])
    labels = [f"{t('request', lang)} {rid}" for rid in request_ids]
    # Past ~48 columns the ids no longer fit in the cells; the hover still names every block.
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(width)), y=labels, text=text, texttemplate="%{text}" if width <= 48 else "",
        textfont={"size": 9, "color": "white"}, customdata=hover, hovertemplate="%{customdata}<extra></extra>",
        colorscale=discrete_colorscale(colors), zmin=-0.5, zmax=len(colors) - 0.5, showscale=False,
        xgap=1, ygap=1,
    ))
    fig.update_layout(
        title=t("block_tables_title", lang).format(step=trace.step),
        xaxis={"title": t("logical_block", lang), "showgrid": False, "zeroline": False},
        yaxis={"title": t("request", lang), "autorange": "reversed", "showgrid": False, "type": "category"},
        plot_bgcolor="white", height=max(260, 60 + 28 * len(request_ids)), margin={"t": 60},
    )
    if not request_ids:
        fig.add_annotation(text=t("no_running", lang), showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def block_pool_animation(traces: list[StepTrace], lang: str = "en", frame_ms: int = 300,
                         max_frames: int = 200) -> go.Figure:
    """The block pool played step by step with Plotly's own player (▶ play, ❚❚ pause, a step slider).

    Args:
        traces: the run's ``StepTrace``s (with block tables); at most ``max_frames`` evenly spaced steps are
            kept so the page stays light.
        frame_ms: milliseconds per step (the speed).

    Raises:
        ValueError: no traces, a trace without block tables, or ``frame_ms`` < 1.
    """
    if not traces:
        raise ValueError("traces is empty: run the engine first")
    if frame_ms < 1:
        raise ValueError(f"frame_ms must be >= 1, got {frame_ms}")
    stride = max(1, math.ceil(len(traces) / max_frames))
    shown = traces[::stride]
    if shown[-1] is not traces[-1]:
        shown.append(traces[-1])
    fig = block_pool_figure(shown[0], lang)
    # Frames carry only the heatmap and the title: a whole figure per step would be ~100x slower to build.
    frames = []
    for tr in shown:
        heatmap, _, title, _ = _pool_heatmap(tr, lang)
        frames.append(go.Frame(data=[heatmap], traces=[0], name=str(tr.step), layout={"title": {"text": title}}))
    fig.frames = frames
    play = {"args": [None, {"frame": {"duration": frame_ms, "redraw": True}, "fromcurrent": True,
                            "transition": {"duration": 0}}], "label": t("play", lang), "method": "animate"}
    pause = {"args": [[None], {"frame": {"duration": 0, "redraw": False}, "mode": "immediate"}],
             "label": t("pause", lang), "method": "animate"}
    steps = [{"args": [[str(tr.step)], {"frame": {"duration": 0, "redraw": True}, "mode": "immediate"}],
              "label": str(tr.step), "method": "animate"} for tr in shown]
    fig.update_layout(
        updatemenus=[{"type": "buttons", "direction": "left", "buttons": [play, pause], "x": 0, "y": -0.12,
                      "xanchor": "left", "yanchor": "top", "showactive": False}],
        sliders=[{"steps": steps, "x": 0.2, "len": 0.8, "y": -0.08, "currentvalue": {
            "prefix": t("step_slider", lang) + " "}}],
        margin={"b": 120, "t": 60},
    )
    # The legend lists only the first step's requests; later requests still get their colour in each frame.
    return fig
