"""Colours Streamlit's plotly frontend rewrites: before drawing, it replaces every ``#000001`` ... ``#000010`` in a
figure's JSON text with its own categorical palette (``PlotlyChart.tsx``, both themes), so a colorscale that starts
at Magma's black ``#000004`` paints zero pink. ``rewritten_colors`` finds any such colour in a figure spec, as a hex
string (any case, anywhere in the text, as the frontend's ``replaceAll`` does) or as a named or ``rgb()`` colour of
a colour field that means one. The pattern is wider than the frontend's ten (``#000000``-``#000019``), so a colour
one step from the set is caught too."""

from __future__ import annotations

import json
import re

from PIL import ImageColor

REWRITTEN = re.compile(r"#0000[01][0-9](?![0-9a-f])", re.IGNORECASE)


def _colour_strings(node, under_colour_key: bool = False):
    """Every string in a figure spec that sits under a key naming a colour (``color``, ``colorscale``,
    ``bgcolor``, ``colorway``, ...), however deep (colorscales are lists of [position, colour])."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _colour_strings(value, under_colour_key or "color" in key.lower())
    elif isinstance(node, list):
        for value in node:
            yield from _colour_strings(value, under_colour_key)
    elif isinstance(node, str) and under_colour_key:
        yield node


def _as_hex(colour: str) -> str | None:
    try:
        rgb = ImageColor.getrgb(colour.strip())
    except ValueError:
        return None
    return "#{:02x}{:02x}{:02x}".format(*rgb[:3])


def rewritten_colors(spec: str | dict) -> list[str]:
    """The colours in ``spec`` (a figure's JSON text or dict, e.g. ``st.plotly_chart``'s ``proto.spec`` or
    ``fig.to_plotly_json()``) that Streamlit's frontend would repaint; [] when none. ``layout.template`` is left
    out: with its theme on, ``st.plotly_chart`` puts its own template there, written in exactly these placeholder
    colours for the frontend to fill in."""
    figure = json.loads(spec) if isinstance(spec, str) else json.loads(json.dumps(spec))
    if isinstance(figure.get("layout"), dict):
        figure["layout"].pop("template", None)
    text = json.dumps(figure)
    found = REWRITTEN.findall(text)
    for colour in _colour_strings(figure):
        hex_form = _as_hex(colour)
        if hex_form is not None and not colour.startswith("#") and REWRITTEN.fullmatch(hex_form):
            found.append(colour)
    return found
