"""Structured outputs, drawn: the share of the vocabulary the grammar mask allows at each output position,
and what filling the mask cost there (``worker/structured_output.mask_profile``)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots


def mask_figure(profile, title: str = "The grammar mask, token by token", labels: list[str] | None = None):
    """Two panels over the output positions: the allowed share of the vocabulary (log scale: a JSON key may
    allow one token in 2,048, free text hundreds) and the median microseconds of one mask fill.

    Args:
        profile: a ``MaskProfile`` (its ``steps``, ``repeats``, ``load_average``).
        labels: optional text of the token generated at each position (hover).
    Returns:
        a plotly ``Figure`` with two traces.
    """
    steps = profile.steps
    x = [s.index for s in steps]
    hover = labels if labels is not None else [""] * len(steps)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("allowed tokens / vocabulary",
                                        f"mask fill time (median of {profile.repeats} replays, 1 thread)"))
    fig.add_trace(go.Bar(x=x, y=[s.allowed_share for s in steps], name="allowed share",
                         customdata=[[s.num_allowed, s.vocab_size, h] for s, h in zip(steps, hover)],
                         hovertemplate="position %{x}: %{customdata[0]} of %{customdata[1]} tokens allowed"
                                       "<br>then %{customdata[2]}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=[s.fill_seconds * 1e6 for s in steps], mode="lines+markers", name="fill µs",
                             hovertemplate="position %{x}: %{y:.1f} µs<extra></extra>"), row=2, col=1)
    fig.update_yaxes(type="log", title_text="share", row=1, col=1)
    fig.update_yaxes(title_text="µs", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text="output position", row=2, col=1)
    load = ", ".join(f"{v:.1f}" for v in profile.load_average)
    fig.update_layout(title=f"{title}<br><sup>load average {load}</sup>", showlegend=False, height=480)
    return fig
