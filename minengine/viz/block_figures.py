"""The KV block pool and the block tables of one step (PagedAttention, Kwon et al., SOSP 2023, section 4.1:
a request's K/V live in fixed-size physical blocks anywhere in the pool; its block table maps logical block i
to a physical block id)."""

from __future__ import annotations

import dataclasses
import math

import plotly.graph_objects as go

from minengine.metrics.trace import StepTrace
from minengine.viz.colors import CACHED_FREE_COLOR, FREE_COLOR, SHARED_COLOR, discrete_colorscale, request_color
from minengine.viz.i18n import t
from minengine.viz.legend import fit_legend

# A block-table entry whose block the request gave back (a sliding window left it behind:
# ``core/windowed_kv_cache_manager.py``); the logical position stays, the block belongs to the pool again.
RELEASED_ID = -1


def _require_blocks(trace: StepTrace) -> None:
    if trace.block_tables is None or trace.block_ref_counts is None:
        raise ValueError("trace has no block tables: run the engine with trace_block_tables=True")


def windowed_group_trace(trace: StepTrace) -> StepTrace:
    """The step as the windowed KV cache group of a model with two groups saw it
    (``core/hybrid_kv_cache_manager.py``): its block tables and ref counts in place of the full-attention group's
    (its own pool, no prefix cache), so every block figure draws it.

    Raises:
        ValueError: the trace has no windowed group (a model with one group, or ``trace_block_tables=False``).
    """
    if trace.windowed_block_tables is None or trace.windowed_block_ref_counts is None:
        raise ValueError("trace has no windowed KV cache group: a model that mixes full-attention and "
                         "sliding-window layers, run with trace_block_tables=True, records one")
    num_free = trace.windowed_block_ref_counts.count(0)
    return dataclasses.replace(trace, block_tables=trace.windowed_block_tables,
                               block_ref_counts=trace.windowed_block_ref_counts, cached_block_ids=[],
                               num_free_blocks=num_free, num_cached_free_blocks=0, windowed_block_tables=None,
                               windowed_block_ref_counts=None)


def block_owners(trace: StepTrace) -> dict[int, list[str]]:
    """Physical block id -> the running requests whose block table holds it, in the trace's request order."""
    _require_blocks(trace)
    owners: dict[int, list[str]] = {}
    for rid, table in trace.block_tables.items():
        for block_id in table:
            if block_id != RELEASED_ID:
                owners.setdefault(block_id, []).append(rid)
    return owners


def pool_grid_columns(num_blocks: int) -> int:
    """Columns of the pool grid: a near-square layout, at most 64 wide, at least 8."""
    return max(8, min(64, math.ceil(math.sqrt(num_blocks))))


def run_request_ids(traces: list[StepTrace]) -> list[str]:
    """Every request that holds blocks at some step of ``traces``, in order of first appearance (the legend of
    a whole run, and a colour category per request that stays the same in every frame)."""
    seen: dict[str, None] = {}
    for tr in traces:
        _require_blocks(tr)
        seen.update(dict.fromkeys(tr.block_tables))
    return list(seen)


# Pool grid categories: 0 free, 1 cached-free, 2 shared, then one per request.
_FREE, _CACHED, _SHARED, _FIRST_REQUEST = 0, 1, 2, 3


def _pool_heatmap(trace: StepTrace, lang: str, request_ids: list[str] | None = None
                  ) -> tuple[go.Heatmap, list[tuple[str, str]], str, int]:
    """The pool grid of one step: (heatmap, legend entries (name, colour), title, columns). ``request_ids``
    fixes the colour categories (default: the trace's running requests)."""
    owners = block_owners(trace)
    ref_counts = trace.block_ref_counts
    cached = set(trace.cached_block_ids or [])
    num_blocks = len(ref_counts)
    cols = pool_grid_columns(num_blocks)
    rows = math.ceil(num_blocks / cols)
    request_ids = list(trace.block_tables) if request_ids is None else list(request_ids)
    category_of = {rid: i + _FIRST_REQUEST for i, rid in enumerate(request_ids)}
    for rid in trace.block_tables:  # a request missing from request_ids still gets its own colour
        category_of.setdefault(rid, len(category_of) + _FIRST_REQUEST)
    colors = [FREE_COLOR, CACHED_FREE_COLOR, SHARED_COLOR] + [request_color(r) for r in category_of]
    z = [[None] * cols for _ in range(rows)]
    text = [[""] * cols for _ in range(rows)]
    hover = [[""] * cols for _ in range(rows)]
    for b in range(num_blocks):
        r, c = divmod(b, cols)
        holders = owners.get(b, [])
        if len(holders) > 1 or ref_counts[b] > 1:
            z[r][c] = _SHARED
            text[r][c] = str(ref_counts[b])
            state = t("owned_by", lang).format(owners=", ".join(holders))
        elif holders:
            z[r][c] = category_of[holders[0]]
            state = t("owned_by", lang).format(owners=holders[0])
        elif ref_counts[b] > 0:  # held by a request not in the snapshot: should not happen, draw it anyway
            z[r][c] = _CACHED
            state = "?"
        elif b in cached:
            z[r][c] = _CACHED
            state = t("cached_free_block", lang)
        else:
            z[r][c] = _FREE
            state = t("free_block", lang)
        hover[r][c] = t("hover_pool_block", lang).format(block=b, state=state, ref=ref_counts[b])
    heatmap = go.Heatmap(
        z=z, text=text, texttemplate="%{text}", textfont={"size": 10}, customdata=hover,
        hovertemplate="%{customdata}<extra></extra>", colorscale=discrete_colorscale(colors),
        zmin=-0.5, zmax=len(colors) - 0.5, showscale=False, xgap=1, ygap=1,
    )
    legend = [(t("free_block", lang), FREE_COLOR), (t("cached_free_block", lang), CACHED_FREE_COLOR)]
    if any(n > 1 for n in ref_counts):
        legend.append((t("shared_block", lang), SHARED_COLOR))
    legend += [(f"{t('request', lang)} {rid}", request_color(rid)) for rid in trace.block_tables]
    used = sum(1 for n in ref_counts if n > 0)
    title = t("block_pool_title", lang).format(step=trace.step, used=used, total=num_blocks)
    return heatmap, legend, title, cols


def _add_legend(fig: go.Figure, legend: list[tuple[str, str]]) -> None:
    """Legend entries for a heatmap (it has none of its own): one square swatch per (name, colour)."""
    for name, color in legend:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                                 marker={"symbol": "square", "size": 12, "color": color}))


def integer_dtick(span: int) -> int:
    """A tick step for an axis of ``span`` integer cells: 1, 2, 5, 10, 20, ... so that about 6 or fewer ticks
    show and none falls between two cells (a small pool's axis read "0, 0.5, 1" before)."""
    step = 1
    while span / step > 6:
        step = step * 5 // 2 if str(step).startswith("2") else step * 2
    return step


def _pool_layout(fig: go.Figure, title: str, cols: int, rows: int, lang: str) -> None:
    fig.update_layout(
        title=title,
        xaxis={"title": t("block_column", lang).format(cols=cols), "showgrid": False, "zeroline": False,
               "dtick": integer_dtick(cols)},
        yaxis={"title": t("block_row", lang).format(cols=cols), "autorange": "reversed", "showgrid": False,
               "zeroline": False, "dtick": integer_dtick(rows)},
        plot_bgcolor="white", legend={"itemsizing": "constant"}, margin={"t": 60},
    )


def block_pool_figure(trace: StepTrace, lang: str = "en", request_ids: list[str] | None = None,
                      kv_cache_group: str | None = None) -> go.Figure:
    """The physical KV block pool of one step as a grid (block id = row x columns + column).

    Each block is coloured by the request holding it; a block held by more than one request (ref count > 1:
    a shared prefix-cache hit) is dark grey with its ref count written in it, as its legend swatch; free
    blocks that still hold a cached prefix are pale blue, other free blocks light grey. Hover names the
    block, its owners and its ref count.

    Args:
        trace: one ``StepTrace`` recorded with ``trace_block_tables=True``.
        lang: "en" or "zh".
        request_ids: fixes the colour categories (e.g. ``run_request_ids(traces)`` for a live view whose
            frames must keep their colours); default: the trace's running requests.
        kv_cache_group: a model with two KV cache groups (one pool each): "full" or "windowed" names the
            group in the title (draw the windowed one from ``windowed_group_trace(trace)``); None: one group.

    Raises:
        ValueError: the trace has no block tables; ``kv_cache_group`` not None, "full" or "windowed".
    """
    if kv_cache_group not in (None, "full", "windowed"):
        raise ValueError(f"kv_cache_group must be None, 'full' or 'windowed', got {kv_cache_group!r}")
    heatmap, legend, title, cols = _pool_heatmap(trace, lang, request_ids)
    if kv_cache_group is not None:
        title = f"{t('kv_cache_group_' + kv_cache_group, lang)}: {title}"
    fig = go.Figure(heatmap)
    _add_legend(fig, legend)
    _pool_layout(fig, title, cols, math.ceil(len(trace.block_ref_counts) / cols), lang)
    fit_legend(fig, len(legend))
    return fig


def table_columns(num_blocks: int) -> int:
    """Logical blocks per row of the block-table figure: enough room in each cell for the physical ids of a
    pool of ``num_blocks`` blocks (32 columns for 2-digit ids, 24 for 3, 16 for 4 or more)."""
    digits = len(str(max(num_blocks - 1, 0)))
    return 32 if digits <= 2 else 24 if digits == 3 else 16


def _table_category(block_id: int, ref_counts: list[int], own: int) -> int | None:
    """A table cell's colour: 0 shared, ``own`` the request's, None (blank) a released entry."""
    if block_id == RELEASED_ID:
        return None
    return 0 if ref_counts[block_id] > 1 else own


def _table_text(block_id: int, ref_counts: list[int]) -> str:
    if block_id == RELEASED_ID:
        return "–"
    return f"{block_id}*" if ref_counts[block_id] > 1 else str(block_id)


def _table_hover(rid: str, logical: int, block_id: int, ref_counts: list[int], lang: str) -> str:
    if block_id == RELEASED_ID:
        return t("hover_released_cell", lang).format(rid=rid, logical=logical)
    return t("hover_table_cell", lang).format(rid=rid, logical=logical, physical=block_id, ref=ref_counts[block_id])


def block_tables_figure(trace: StepTrace, lang: str = "en", max_columns: int | None = None) -> go.Figure:
    """Each running request's block table at one step: row = request, column = logical block index,
    cell = physical block id (written in the cell), coloured by request; shared cells (ref count > 1) are
    dark grey, as in the pool, and marked with "*"; a block a sliding window gave back (``RELEASED_ID`` in the
    trace) is a blank cell marked "–".

    A table longer than ``max_columns`` blocks wraps onto continuation rows labelled "+24", "+48", ...
    (logical index = that offset + column), so a long prompt's table stays one readable cell per block
    instead of a stripe of hairline cells.

    Args:
        trace: one ``StepTrace`` recorded with ``trace_block_tables=True``.
        lang: "en" or "zh".
        max_columns: logical blocks per row (>= 1); default ``table_columns`` of the pool size.

    Raises:
        ValueError: the trace has no block tables, or ``max_columns`` < 1.
    """
    _require_blocks(trace)
    if max_columns is None:
        max_columns = table_columns(len(trace.block_ref_counts))
    if max_columns < 1:
        raise ValueError(f"max_columns must be >= 1, got {max_columns}")
    request_ids = list(trace.block_tables)
    ref_counts = trace.block_ref_counts
    longest = max((len(v) for v in trace.block_tables.values()), default=0)
    width = min(longest, max_columns)
    colors = [SHARED_COLOR] + [request_color(r) for r in request_ids]
    z, text, hover, labels = [], [], [], []
    for i, rid in enumerate(request_ids):
        table = trace.block_tables[rid]
        for offset in range(0, max(len(table), 1), max(width, 1)):
            line = table[offset:offset + width]
            labels.append(f"{t('request', lang)} {rid}" if offset == 0 else f"{rid} +{offset}")
            pad = [None] * (width - len(line))
            z.append([_table_category(b, ref_counts, i + 1) for b in line] + pad)
            text.append([_table_text(b, ref_counts) for b in line] + [""] * len(pad))
            hover.append([_table_hover(rid, offset + j, b, ref_counts, lang) for j, b in enumerate(line)]
                         + [""] * len(pad))
    fig = go.Figure(go.Heatmap(
        z=z, x=list(range(width)), y=labels, text=text, texttemplate="%{text}", textfont={"size": 9},
        customdata=hover, hovertemplate="%{customdata}<extra></extra>", colorscale=discrete_colorscale(colors),
        zmin=-0.5, zmax=len(colors) - 0.5, showscale=False, xgap=1, ygap=1,
    ))
    wrapped = longest > width
    fig.update_layout(
        title=t("block_tables_title", lang).format(step=trace.step),
        xaxis={"title": t("logical_block_wrapped" if wrapped else "logical_block", lang).format(cols=width),
               "showgrid": False, "zeroline": False, "dtick": integer_dtick(width)},
        yaxis={"title": t("request", lang), "autorange": "reversed", "showgrid": False, "type": "category"},
        plot_bgcolor="white", height=max(260, 90 + 24 * len(labels)), margin={"t": 60},
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
    # One colour category per request of the whole run, so every frame paints a request alike and the legend
    # can list every request of the run (not only those running at the first frame).
    request_ids = run_request_ids(traces)
    heatmap, _, title, cols = _pool_heatmap(shown[0], lang, request_ids)
    fig = go.Figure(heatmap)
    legend = [(t("free_block", lang), FREE_COLOR), (t("cached_free_block", lang), CACHED_FREE_COLOR)]
    if any(n > 1 for tr in shown for n in tr.block_ref_counts):
        legend.append((t("shared_block", lang), SHARED_COLOR))
    legend += [(f"{t('request', lang)} {rid}", request_color(rid)) for rid in request_ids]
    _add_legend(fig, legend)
    _pool_layout(fig, title, cols, math.ceil(len(shown[0].block_ref_counts) / cols), lang)
    # Frames carry only the heatmap and the title: a whole figure per step would be ~100x slower to build.
    frames = []
    for tr in shown:
        heatmap, _, title, _ = _pool_heatmap(tr, lang, request_ids)
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
    fit_legend(fig, len(legend), below_px=170)  # below the player's buttons and slider
    return fig
