"""Helpers of the dashboard tests."""

from __future__ import annotations

import json


def subtitles(at) -> list[str]:
    """Each plotly figure's subtitle on an ``AppTest`` page ("" for a figure without one), in page order."""
    out = []
    for chart in at.get("plotly_chart"):
        title = json.loads(chart.proto.spec)["layout"].get("title", {})
        out.append(title.get("subtitle", {}).get("text", "") if isinstance(title, dict) else "")
    return out
