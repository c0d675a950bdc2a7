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

_POSITIONS = {S.WAITING: (0.0, 1.0), S.RUNNING: (2.0, 1.0), S.PREEMPTED: (1.0, -0.45), S.SWAPPED: (2.9, -0.6),
              S.FINISHED_STOPPED: (4.0, 2.1), S.FINISHED_LENGTH: (4.0, 1.35), S.FINISHED_ABORTED: (4.0, 0.6),
              S.FINISHED_TIMEOUT: (4.0, -0.15)}
_CORE = (S.WAITING, S.RUNNING, S.PREEMPTED, S.SWAPPED)
_X_RANGE, _Y_RANGE = (-0.5, 5.4), (-1.0, 2.5)
WIDTH_PX, HEIGHT_PX = 900, 460  # the figure's size: the label layout below is laid out (and tested) for it
FONT_PX = 10
_NODE_PX = 60  # marker diameter
_SEPARATION_PX = 16  # between the two arrows of a two-way pair
_LABEL_GAP_PX = 5  # between an arrow and its label
_ALONG = 0.4  # where on its arrow a label sits (fraction of the way from the source)


def _px_per_unit() -> tuple[float, float]:
    return WIDTH_PX / (_X_RANGE[1] - _X_RANGE[0]), (HEIGHT_PX - 80) / (_Y_RANGE[1] - _Y_RANGE[0])  # 80: margins


def _normal(src: S, dst: S) -> tuple[float, float]:
    """Unit normal (in pixels) to the arrow ``src -> dst``, on the right-hand side of its direction: the two
    arrows of a two-way pair get opposite normals, so each arrow and its label sit on their own side."""
    (x0, y0), (x1, y1) = _POSITIONS[src], _POSITIONS[dst]
    sx, sy = _px_per_unit()
    dx, dy = (x1 - x0) * sx, (y1 - y0) * sy
    length = (dx * dx + dy * dy) ** 0.5
    return dy / length, -dx / length


def label_layout(counts: Counter) -> list[dict]:
    """Where each arrow label goes: a list of ``{"x", "y", "text", "xanchor", "yanchor", "taken"}`` (data units).

    Arrows between the unfinished states carry their own label beside the arrow, on the arrow's own side (two-way
    pairs never share a spot). Arrows into a finished state fan in from up to four sources, so their counts are
    one label right of that state, a line per source that took it ("abort:", "RUNNING 2", "WAITING 1").
    """
    sx, sy = _px_per_unit()
    known = {(a, b) for a, b, _ in REQUEST_TRANSITIONS}
    labels = []
    for src, dst, why in REQUEST_TRANSITIONS:
        if dst not in _CORE:
            continue
        n = counts.get((src, dst), 0)
        (x0, y0), (x1, y1) = _POSITIONS[src], _POSITIONS[dst]
        nx, ny = _normal(src, dst)
        off = _SEPARATION_PX / 2 + _LABEL_GAP_PX if (dst, src) in known else _LABEL_GAP_PX
        # 40 % of the way from the source: the two labels of a pair are staggered along it as well as apart
        labels.append({"x": x0 + _ALONG * (x1 - x0) + nx * off / sx, "y": y0 + _ALONG * (y1 - y0) + ny * off / sy,
                       "text": f"{why}: {n}", "taken": bool(n),
                       "xanchor": "left" if nx > 0.3 else "right" if nx < -0.3 else "center",
                       "yanchor": "bottom" if ny > 0.3 else "top" if ny < -0.3 else "middle"})
    for dst in S:
        if dst in _CORE:
            continue
        into = [(src, why, counts.get((src, dst), 0)) for src, d, why in REQUEST_TRANSITIONS if d is dst]
        why = into[0][1]
        taken = "<br>".join(f"{src.name} {n}" for src, _, n in into if n)
        x, y = _POSITIONS[dst]
        labels.append({"x": x + (_NODE_PX / 2 + 6) / sx, "y": y, "text": f"{why}:<br>{taken}" if taken else f"{why}: 0",
                       "taken": bool(taken), "xanchor": "left", "yanchor": "middle"})
    return labels


def label_boxes(labels: list[dict]) -> list[tuple[float, float, float, float]]:
    """Each label's box ``(left, bottom, right, top)`` in pixels, estimated from its text (0.6 em per character,
    1.4 em per line)."""
    sx, sy = _px_per_unit()
    boxes = []
    for lab in labels:
        lines = lab["text"].split("<br>")
        w, h = max(map(len, lines)) * FONT_PX * 0.6 + 6, len(lines) * FONT_PX * 1.4 + 2  # + bgcolor padding
        cx, cy = lab["x"] * sx, lab["y"] * sy
        left = {"left": cx, "right": cx - w, "center": cx - w / 2}[lab["xanchor"]]
        bottom = {"bottom": cy, "top": cy - h, "middle": cy - h / 2}[lab["yanchor"]]
        boxes.append((left, bottom, left + w, bottom + h))
    return boxes


def node_boxes() -> list[tuple[float, float, float, float]]:
    """Each state's marker as a box in pixels."""
    sx, sy = _px_per_unit()
    r = _NODE_PX / 2
    return [(x * sx - r, y * sy - r, x * sx + r, y * sy + r) for x, y in _POSITIONS.values()]


def node_text(status: S) -> str:
    """A state's name as drawn inside its marker: FINISHED_* on two lines, so it fits."""
    return status.name.replace("FINISHED_", "FINISHED<br>")


def state_machine_figure(observed: Iterable[tuple[S, S]] = (), title: str = "Request states") -> go.Figure:
    """The state machine with each arrow labelled by how many ``(from, to)`` pairs of ``observed`` took it.

    Arrows never taken are drawn grey. Nodes are every member of ``RequestStatus``. Labels never overlap each
    other or a state (``label_layout``, tested on the figure's fixed size ``WIDTH_PX`` x ``HEIGHT_PX``).

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
    sx, sy = _px_per_unit()
    fig = go.Figure()
    for src, dst, _ in REQUEST_TRANSITIONS:
        n = counts.get((src, dst), 0)
        (x0, y0), (x1, y1) = _POSITIONS[src], _POSITIONS[dst]
        if (dst, src) in known:  # two-way pair: each arrow moved to its own side
            nx, ny = _normal(src, dst)
            ox, oy = nx * _SEPARATION_PX / 2 / sx, ny * _SEPARATION_PX / 2 / sy
            x0, y0, x1, y1 = x0 + ox, y0 + oy, x1 + ox, y1 + oy
        color = "#1f77b4" if n else "#c7c7c7"
        fig.add_annotation(x=x1, y=y1, ax=x0, ay=y0, xref="x", yref="y", axref="x", ayref="y", showarrow=True,
                           arrowhead=3, arrowsize=1.2, arrowwidth=2.5 if n else 1, arrowcolor=color, standoff=30,
                           startstandoff=30, text="")
    for lab in label_layout(counts):
        fig.add_annotation(x=lab["x"], y=lab["y"], text=lab["text"], showarrow=False, xanchor=lab["xanchor"],
                           yanchor=lab["yanchor"], bgcolor="white",
                           font={"size": FONT_PX, "color": "#1f77b4" if lab["taken"] else "#999999"})
    xs = [_POSITIONS[s][0] for s in S]
    ys = [_POSITIONS[s][1] for s in S]
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers+text", text=[node_text(s) for s in S],
                             textposition="middle center",
                             marker={"size": _NODE_PX, "color": ["#fde0c5" if s.finished else "#d9ead3" for s in S],
                                     "line": {"width": 1, "color": "#555555"}},
                             textfont={"size": 9}, hovertext=[f"RequestStatus.{s.name} ('{s.value}')" for s in S],
                             hoverinfo="text", showlegend=False))
    fig.update_layout(title=title, xaxis={"visible": False, "range": list(_X_RANGE)},
                      yaxis={"visible": False, "range": list(_Y_RANGE)}, width=WIDTH_PX, height=HEIGHT_PX,
                      margin={"t": 60, "b": 20, "l": 0, "r": 0})
    return fig
