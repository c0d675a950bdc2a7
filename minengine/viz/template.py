"""The plotly template of the course's figures: log axes label their decades only.

Plotly labels the ticks between decades of a log axis with bare digits ("2", "5": ``minorloglabels="small
digits"``), which read as stray numbers beside the axis (issue 22). This template turns those labels off
(``minorloglabels="none"``, plotly >= 5.21); the minor ticks and grid lines stay. An axis shorter than a decade gets
linear-style ticks from plotly, labelled in full, so it never ends up without labels.
"""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio

NAME = "minengine"


def course_template() -> go.layout.Template:
    """The template: every x and y axis (``xaxis``, ``xaxis2``, ...) without minor log labels."""
    axis = {"minorloglabels": "none"}
    return go.layout.Template(layout={"xaxis": axis, "yaxis": axis})


def use_course_template() -> str:
    """Register ``course_template`` as ``"minengine"`` and make ``"plotly+minengine"`` plotly's default for this
    process (a notebook's kernel); returns the default's name."""
    pio.templates[NAME] = course_template()
    pio.templates.default = f"plotly+{NAME}"
    return pio.templates.default
