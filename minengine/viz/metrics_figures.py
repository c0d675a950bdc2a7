"""Serving metrics over a run: queues, KV block use and latency distributions (the figures of the course's
metrics chapter; definitions as vLLM's serving benchmark: TTFT, TPOT)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from minengine.metrics.stats import percentile
from minengine.metrics.trace import StepTrace
from minengine.outputs import RequestMetrics
from minengine.viz.clock_label import TOP_MARGIN, titled
from minengine.viz.colors import CACHED_FREE_COLOR, FREE_COLOR
from minengine.viz.i18n import t

# Where the percentile labels of the CDF figure sit (fraction axis): low and staggered, so they never meet
# each other (close percentiles) nor the subplot titles above the plots.
_PERCENTILE_LABEL_Y = {50: 0.06, 95: 0.19, 99: 0.32}


def _step_times(traces: list[StepTrace]) -> list[float]:
    """Each step's end time in seconds since the first step started."""
    origin = traces[0].start_time if traces else 0.0
    return [tr.end_time - origin for tr in traces]


def queue_figure(traces: list[StepTrace], lang: str = "en", clock_label: str | None = None) -> go.Figure:
    """Running and waiting requests after each step (requests) against time (s since the first step);
    ``clock_label`` names the clock in the subtitle."""
    xs = _step_times(traces)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=[tr.num_running for tr in traces], mode="lines", line_shape="hv",
                             name=t("running", lang)))
    fig.add_trace(go.Scatter(x=xs, y=[tr.num_waiting for tr in traces], mode="lines", line_shape="hv",
                             name=t("waiting", lang)))
    fig.update_layout(title=titled(t("queue_title", lang), clock_label),
                      xaxis={"title": t("time_since_first_step", lang)},
                      yaxis={"title": t("num_requests_axis", lang), "rangemode": "tozero"}, margin={"t": TOP_MARGIN})
    return fig


def kv_usage_figure(traces: list[StepTrace], lang: str = "en", clock_label: str | None = None) -> go.Figure:
    """KV blocks at each step (blocks) against time (s since the first step), stacked: used (held by a
    request), cached-but-free (a reusable prefix, evictable) and free; the stack's top is ``num_kv_blocks``.
    ``clock_label`` names the clock in the subtitle."""
    xs = _step_times(traces)
    series = [
        ("used_blocks", [tr.num_used_blocks for tr in traces], "#1f77b4"),
        ("cached_free_block", [tr.num_cached_free_blocks for tr in traces], CACHED_FREE_COLOR),
        ("free_uncached_blocks", [tr.num_free_blocks - tr.num_cached_free_blocks for tr in traces], FREE_COLOR),
    ]
    fig = go.Figure()
    for key, ys, color in series:
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", stackgroup="kv", name=t(key, lang), line_shape="hv",
                                 line={"color": color}, fillcolor=color))
    fig.update_layout(title=titled(t("kv_title", lang), clock_label), xaxis={"title": t("time_since_first_step", lang)},
                      yaxis={"title": t("blocks_axis", lang), "rangemode": "tozero"}, margin={"t": TOP_MARGIN})
    return fig


def _cdf(values: list[float]) -> tuple[list[float], list[float]]:
    xs = sorted(values)
    return xs, [(i + 1) / len(xs) for i in range(len(xs))]


def latency_cdf_figure(request_metrics: dict[str, RequestMetrics], lang: str = "en",
                       clock_label: str | None = None) -> go.Figure:
    """Empirical CDFs of TTFT and TPOT (ms) over the finished requests, side by side, with the P50/P95/P99
    marked as dotted lines, each labelled low in the plot at its own height (so close percentiles and the
    subplot titles never overlap). TPOT is undefined for requests with fewer than 2 output tokens.
    ``clock_label`` names the clock in the subtitle."""
    done = [m for m in request_metrics.values() if m.finished_time is not None]
    fig = make_subplots(rows=1, cols=2, subplot_titles=[t("ttft_ms", lang), t("tpot_ms", lang)])
    for col, (key, values) in enumerate([("ttft_ms", [m.ttft * 1000 for m in done if m.ttft is not None]),
                                         ("tpot_ms", [m.tpot * 1000 for m in done if m.tpot is not None])],
                                        start=1):
        if not values:
            fig.add_annotation(text=t("no_data", lang), showarrow=False, row=1, col=col, x=0.5, y=0.5)
            continue
        xs, ys = _cdf(values)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", line_shape="hv", name=t(key, lang),
                                 hovertemplate="%{x:.1f} ms<br>%{y:.0%}<extra></extra>"), row=1, col=col)
        lo, hi = xs[0], xs[-1]
        for q in (50, 95, 99):
            x = percentile(values, q)
            right = hi > lo and (x - lo) / (hi - lo) > 0.75  # near the right edge: the label goes to the left
            fig.add_vline(x=x, line_dash="dot", line_color="#888888", row=1, col=col)
            fig.add_annotation(x=x, y=_PERCENTILE_LABEL_Y[q], text=f"P{q}", showarrow=False,
                               xanchor="right" if right else "left", xshift=-2 if right else 2,
                               font={"size": 11, "color": "#555555"}, row=1, col=col)
        fig.update_xaxes(title_text=t(key, lang), row=1, col=col)
    fig.update_yaxes(title_text=t("fraction_axis", lang), range=[0, 1.05], row=1, col=1)
    fig.update_yaxes(range=[0, 1.05], row=1, col=2)
    fig.update_layout(title=titled(t("latency_title", lang), clock_label), showlegend=False,
                      margin={"t": TOP_MARGIN + 24})
    return fig
