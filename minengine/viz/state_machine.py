"""The request state machine as a figure: every ``RequestStatus`` is a node, every transition the engine makes
is an arrow, labelled with how often a real run took it (``minengine.course.states.StateRecorder``).

WAITING -> RUNNING -> FINISHED_*; RUNNING -> PREEMPTED (recompute) or SWAPPED (KV copied to the CPU swap
space), both back in the waiting queue, -> RUNNING again when re-admitted; a request in any unfinished state
can be aborted (the client left) or time out (its deadline passed). English labels (the course's figures).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import plotly.graph_objects as go

from minengine.request import RequestStatus as S

# (from, to, what moves it): the engine's transitions (scheduler.py, step_builder.py, llm_engine.py).
REQUEST_TRANSITIONS: tuple[tuple[S, S, str], ...] = (
    (S.WAITING, S.RUNNING, "admitted"),
    (S.RUNNING, S.FINISHED_STOPPED, "EOS / stop"),
    (S.RUNNING, S.FINISHED_LENGTH, "max_tokens"),
    (S.RUNNING, S.PREEMPTED, "preempted: recompute"),
    (S.RUNNING, S.SWAPPED, "preempted: swap out"),
    (S.PREEMPTED, S.RUNNING, "re-admitted"),
    (S.SWAPPED, S.RUNNING, "swapped in"),
    *((src, S.FINISHED_ABORTED, "abort") for src in (S.WAITING, S.RUNNING, S.PREEMPTED, S.SWAPPED)),
    *((src, S.FINISHED_TIMEOUT, "deadline") for src in (S.WAITING, S.RUNNING, S.PREEMPTED, S.SWAPPED)),
)

_POSITIONS = {S.WAITING: (0.0, 1.0), S.RUNNING: (2.0, 1.0), S.PREEMPTED: (1.0, -0.2), S.SWAPPED: (2.0, -0.6),
              S.FINISHED_STOPPED: (4.0, 2.1), S.FINISHED_LENGTH: (4.0, 1.35), S.FINISHED_ABORTED: (4.0, 0.6),
              S.FINISHED_TIMEOUT: (4.0, -0.15)}


def state_machine_figure(observed: Iterable[tuple[S, S]] = (), title: str = "Request states") -> go.Figure:
    """The state machine with each arrow labelled by how many ``(from, to)`` pairs of ``observed`` took it.

    Arrows never taken are drawn grey. Nodes are every member of ``RequestStatus``.

    Raises:
        ValueError: an observed transition that is not one of ``REQUEST_TRANSITIONS`` (the engine made a move
            the diagram does not know: the diagram, or the engine, is wrong).
    """
    counts = Counter(observed)
    known = {(a, b) for a, b, _ in REQUEST_TRANSITIONS}
    unknown = [pair for pair in counts if pair not in known]
    if unknown:
        raise ValueError(f"transitions not in the state machine: {[(a.name, b.name) for a, b in unknown]}")
    missing = [s for s in S if s not in _POSITIONS]
    if missing:  # a status added to the engine must get a place in the figure
        raise ValueError(f"no position for {missing}")
    fig = go.Figure()
    for src, dst, why in REQUEST_TRANSITIONS:
        n = counts.get((src, dst), 0)
        (x0, y0), (x1, y1) = _POSITIONS[src], _POSITIONS[dst]
        bend = 0.18 if (dst, src) in known else 0.0  # two-way pairs: draw the arrows apart
        x0, y0, x1, y1 = x0, y0 + bend, x1, y1 + bend
        color = "#1f77b4" if n else "#c7c7c7"
        fig.add_annotation(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                           arrowhead=3, arrowsize=1.2, arrowwidth=2.5 if n else 1, arrowcolor=color, standoff=28,
                           startstandoff=28, text="")
        if n or src in (S.WAITING, S.RUNNING, S.PREEMPTED, S.SWAPPED) and dst in (S.RUNNING, S.PREEMPTED, S.SWAPPED):
            fig.add_annotation(x=(x0 + x1) / 2, y=(y0 + y1) / 2 + 0.1, text=f"{why}: {n}", showarrow=False,
                               font={"size": 10, "color": "#1f77b4" if n else "#999999"}, bgcolor="white")
    xs = [_POSITIONS[s][0] for s in S]
    ys = [_POSITIONS[s][1] for s in S]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers+text", text=[s.name for s in S], textposition="middle center",
                             marker={"size": 60, "color": ["#fde0c5" if s.finished else "#d9ead3" for s in S],
                                     "line": {"width": 1, "color": "#555555"}},
                             textfont={"size": 9}, hovertext=[f"RequestStatus.{s.name} ('{s.value}')" for s in S],
                             hoverinfo="text", showlegend=False))
    fig.update_layout(title=title, xaxis={"visible": False, "range": [-0.6, 4.6]},
                      yaxis={"visible": False, "range": [-1.0, 2.5]}, height=460, margin={"t": 60, "l": 10, "r": 10})
    return fig
