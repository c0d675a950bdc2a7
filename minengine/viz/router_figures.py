"""The router view's figure: requests per replica of a fleet (``minengine.viz.router_feed.route_requests``)."""

from __future__ import annotations

from urllib.parse import urlsplit

import plotly.graph_objects as go

from minengine.viz.i18n import t
from minengine.viz.router_feed import FleetRouting


def replica_label(url: str) -> str:
    """A replica's short name for labels: its URL's ``host:port`` ("127.0.0.1:8001"), else the URL as it is."""
    parts = urlsplit(url)
    return parts.netloc or url


def replica_requests_figure(routing: FleetRouting, lang: str = "en") -> go.Figure:
    """One bar per replica (in ``routing.replicas``' order): requests its steps named (requests), split into
    finished and still running or waiting, so an uneven split by the router shows at a glance."""
    names = [replica_label(u) for u in routing.replicas]
    done = {u: 0 for u in routing.replicas}
    for route in routing.routes:
        done[route.replica] += route.finished
    finished = [done[u] for u in routing.replicas]
    other = [c.requests - done[u] for u, c in routing.replicas.items()]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=names, y=finished, name=t("router_finished", lang), marker={"color": "#2ca02c"}))
    fig.add_trace(go.Bar(x=names, y=other, name=t("router_in_flight", lang), marker={"color": "#1f77b4"}))
    fig.update_layout(barmode="stack", title={"text": t("router_requests_title", lang)},
                      xaxis={"title": t("router_replica", lang), "type": "category"},
                      yaxis={"title": t("num_requests_axis", lang), "rangemode": "tozero"})
    return fig
