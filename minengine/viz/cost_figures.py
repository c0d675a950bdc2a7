"""Figures of the step cost model (``minengine.timing.StepCostModel``): the roofline with real steps placed on
it, and a step's compute time against its memory time (which roof bounds it).

A step's attained FLOP/s is ``flops / time_s`` at arithmetic intensity ``flops / bytes``; the roofs are the
hardware's effective peaks (datasheet x MFU for compute, x MBU for bandwidth), Williams et al., "Roofline",
CACM 2009. English labels (the course's figures).
"""

from __future__ import annotations

from collections.abc import Mapping

import plotly.graph_objects as go

from minengine.timing import StepCost, StepCostModel


def roofline_figure(cost_model: StepCostModel, steps: Mapping[str, StepCost], title: str | None = None,
                    intensity_range: tuple[float, float] = (0.25, 8192.0)) -> go.Figure:
    """The effective roofline of ``cost_model.hardware`` (TFLOP/s against FLOP/byte, log-log) with each named
    step of ``steps`` as a point at its arithmetic intensity and attained TFLOP/s (its FLOPs over its whole
    modelled time, overheads included, so a point sits on or under the roofs)."""
    hw, m = cost_model.hardware, cost_model.shape
    peak = hw.peak_flops_for(m.dtype_bytes) * hw.mfu
    bw = hw.memory_bandwidth * hw.mbu
    lo, hi = intensity_range
    xs = [lo * (hi / lo) ** (i / 60) for i in range(61)]
    fig = go.Figure(go.Scatter(x=xs, y=[min(peak, x * bw) / 1e12 for x in xs], mode="lines",
                               name=f"{hw.name} roof (MFU {hw.mfu:.0%}, MBU {hw.mbu:.0%})", line={"color": "#444444"}))
    fig.add_trace(go.Scatter(x=xs, y=[min(hw.peak_flops_for(m.dtype_bytes), x * hw.memory_bandwidth) / 1e12
                                      for x in xs], mode="lines", name="datasheet peaks",
                             line={"color": "#999999", "dash": "dot"}))
    for name, c in steps.items():
        fig.add_trace(go.Scatter(x=[c.arithmetic_intensity], y=[c.flops / c.time_s / 1e12], mode="markers+text",
                                 text=[name], textposition="top center", marker={"size": 11},
                                 name=f"{name}: {c.time_s * 1e3:.1f} ms, {c.bound}-bound",
                                 hovertext=f"{c.num_tokens} tokens, {c.num_requests} requests, "
                                           f"{c.time_s * 1e3:.2f} ms ({c.bound})", hoverinfo="text"))
    fig.update_layout(title=title or f"Roofline: {cost_model.label}",
                      xaxis={"title": "arithmetic intensity of the step (FLOP/byte)", "type": "log"},
                      yaxis={"title": "attained TFLOP/s", "type": "log"}, margin={"t": 70})
    return fig


def roofs_figure(steps: Mapping[str, StepCost], title: str = "Which roof bounds each step") -> go.Figure:
    """For each named step: its compute time and its memory time (ms), side by side, and its modelled duration.

    A step lasts between the larger of the two and their sum (a soft roofline per kernel group, plus kernel
    floors and overheads): a decode batch leaves compute idle, a prefill chunk leaves bandwidth idle, and in a
    mixed step the decodes share the chunk's weight read (their attention is still a kernel of its own)."""
    names = list(steps)
    fig = go.Figure([
        go.Bar(name="compute time (FLOPs / effective peak)", x=names,
               y=[c.compute_time_s * 1e3 for c in steps.values()], marker_color="#ff7f0e"),
        go.Bar(name="memory time (bytes / effective bandwidth)", x=names,
               y=[c.memory_time_s * 1e3 for c in steps.values()], marker_color="#1f77b4"),
        go.Scatter(name="step time (modelled)", x=names, y=[c.time_s * 1e3 for c in steps.values()],
                   mode="markers", marker={"symbol": "line-ew-open", "size": 40, "line": {"width": 3},
                                           "color": "#222222"}),
    ])
    fig.update_layout(barmode="group", title=title, yaxis={"title": "time (ms)", "rangemode": "tozero"},
                      margin={"t": 70})
    return fig
