"""The workload a dashboard run will replay, before it runs: each request's prompt and output tokens.

The page draws it under "press Run", so the first thing on screen is already the run's own data; it is also the
page's first plotly figure, so a browser loads its plotly code while the user reads, not when the live view's
first step arrives.
"""

from __future__ import annotations

import plotly.graph_objects as go

from minengine.viz.i18n import t
from minengine.viz.workload import Workload

PROMPT_COLOR = "#1f77b4"
OUTPUT_COLOR = "#ff7f0e"


def workload_figure(workload: Workload, lang: str = "en") -> go.Figure:
    """Stacked bars, one per request in arrival order: prompt tokens and output tokens (``max_tokens``), with the
    arrival (seconds on the run's clock, or the step it arrives before) in the hover.

    Raises:
        ValueError: unknown language.
    """
    requests = sorted(workload.requests, key=lambda r: (r.arrival_step is None, r.arrival_step or 0, r.arrival_time))
    ids = [r.request_id for r in requests]
    arrivals = [t("wl_arrives_step", lang).format(step=r.arrival_step) if r.arrival_step is not None
                else t("wl_arrives_s", lang).format(s=r.arrival_time) for r in requests]
    hover = "%{x}: %{y:,} " + "%{fullData.name}<br>%{customdata}<extra></extra>"
    fig = go.Figure([
        go.Bar(x=ids, y=[r.prompt_len for r in requests], name=t("wl_prompt", lang), marker_color=PROMPT_COLOR,
               customdata=arrivals, hovertemplate=hover),
        go.Bar(x=ids, y=[r.max_tokens for r in requests], name=t("wl_output", lang), marker_color=OUTPUT_COLOR,
               customdata=arrivals, hovertemplate=hover)])
    fig.update_layout(barmode="stack", title=t("wl_title", lang).format(n=len(requests)),
                      xaxis={"title": t("wl_request", lang), "type": "category"},
                      yaxis={"title": t("wl_tokens", lang)}, height=300, margin={"t": 50, "b": 40},
                      legend={"orientation": "h", "y": 1.02, "x": 1, "xanchor": "right", "yanchor": "bottom"})
    return fig
