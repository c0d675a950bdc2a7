"""Streamlit's plotly frontend repaints #000001 ... #000010 in every figure (tests/streamlit_colors.py): the checker
finds such a colour in any form, and the Fleet page's queue lane draws an empty queue near-black, not pink."""

from __future__ import annotations

import pytest

pytest.importorskip("plotly")

import plotly.graph_objects as go  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from minengine.fleet import FleetConfig, simulate  # noqa: E402
from minengine.viz.colors import streamlit_safe_colorscale  # noqa: E402
from minengine.viz.fleet_figures import fleet_lanes_figure  # noqa: E402
from minengine.workloads import synthetic_trace  # noqa: E402
from tests.streamlit_colors import rewritten_colors  # noqa: E402


@given(st.integers(0, 19), st.sampled_from(["hex", "HEX", "rgb", "rgb_spaced"]),
       st.sampled_from(["marker", "line", "colorscale", "paper_bgcolor"]))
def test_the_checker_finds_a_repainted_colour_in_any_form_and_place(n, form, where):
    colour = {"hex": f"#0000{n:02d}", "HEX": f"#0000{n:02d}".upper(), "rgb": f"rgb(0,0,{int(str(n), 16)})",
              "rgb_spaced": f"rgb(0, 0, {int(str(n), 16)})"}[form]
    if where == "marker":
        fig = go.Figure(go.Scatter(y=[1, 2], marker={"color": [colour, "#ff0000"]}))
    elif where == "line":
        fig = go.Figure(go.Scatter(y=[1, 2], line={"color": colour}))
    elif where == "colorscale":
        fig = go.Figure(go.Heatmap(z=[[0, 1]], colorscale=[[0, colour], [1, "#ffffff"]]))
    else:
        fig = go.Figure(layout={"paper_bgcolor": colour})
    assert rewritten_colors(fig.to_json()) != []


def test_the_checker_passes_other_colours_and_finds_named_ones():
    assert rewritten_colors(go.Figure(go.Scatter(y=[1], marker_color="#0000ff")).to_json()) == []
    assert rewritten_colors(go.Figure(go.Scatter(y=[1], marker_color="#010104")).to_json()) == []
    assert rewritten_colors(go.Figure(go.Scatter(y=[1], marker_color="black")).to_json()) == ["black"]
    # the reported case: plotly's Magma starts at #000004
    assert rewritten_colors(go.Figure(go.Heatmap(z=[[0, 1]], colorscale="Magma")).to_json()) == ["#000004"]


@pytest.mark.parametrize("name", ["Magma", "Inferno", "Viridis", "Greys", "Blues"])
def test_safe_colorscales_keep_every_stop_and_leave_nothing_to_repaint(name):
    import plotly.colors

    original, safe = plotly.colors.get_colorscale(name), streamlit_safe_colorscale(name)
    assert [p for p, _ in safe] == [p for p, _ in original]
    assert rewritten_colors({"colorscale": safe}) == []
    for (_, a), (_, b) in zip(original, safe):  # a repainted stop moves by at most one step per channel
        ra = plotly.colors.unlabel_rgb(a) if a.startswith("rgb") else plotly.colors.hex_to_rgb(a)
        rb = plotly.colors.hex_to_rgb(b)
        assert max(abs(x - y) for x, y in zip(ra, rb)) <= 1


def test_an_empty_queue_lane_is_near_black():
    trace = synthetic_trace(20, rate=2.0, prompt_len=64, output_len=8, range_ratio=0.5)
    res = simulate(trace, FleetConfig.colocated(2, hardware="h100-sxm"))
    fig = fleet_lanes_figure(res, "queue")
    assert rewritten_colors(fig.to_json()) == []
    low = fig.data[0].colorscale[0][1]  # z = 0, the empty queue
    r, g, b = (int(low[i:i + 2], 16) for i in (1, 3, 5))
    assert fig.data[0].zmin == 0 and max(r, g, b) < 8
