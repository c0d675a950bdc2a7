"""Batch composition per step: who got how many tokens, prefill chunks vs decodes, under the token budget
(continuous batching with chunked prefill: Orca, Yu et al., OSDI 2022; Sarathi-Serve, Agrawal et al., OSDI
2024)."""

from __future__ import annotations

import plotly.graph_objects as go

from minengine.metrics.trace import StepTrace
from minengine.viz.colors import BUDGET_COLOR, request_color
from minengine.viz.i18n import t
from minengine.viz.legend import fit_legend

_EVENTS = (  # (StepTrace field, i18n key, marker symbol, colour)
    ("admitted_ids", "admitted", "triangle-up", "#2ca02c"),
    ("preempted_ids", "preempted", "x", "#d62728"),
    ("finished_ids", "finished", "circle", "#111111"),
)


# Speculative decoding: a verifying decode's bar is its own token (solid), then the accepted proposals (dotted),
# then the rejected ones (crossed, faded): the budget they used, and what it bought.
_SPEC_PARTS = (("accepted_proposals", ".", 1.0), ("rejected_proposals", "x", 0.45))
SPEC_LEGEND_COLOR = "#7f7f7f"  # the legend's pattern swatches: grey, as they stand for every request's colour
OWN_TOKEN_COLOR = "#1f77b4"
ACCEPTED_COLOR = "#2ca02c"
REJECTED_COLOR = "#d62728"
MAX_REQUEST_ENTRIES = 12  # more requests than this share one legend entry ("one colour each"): 48 entries of
# "request doc-3" took half a course figure's height and told the reader nothing the hover does not
REQUESTS_SWATCH_COLOR = "#9e9e9e"


def batch_composition_figure(traces: list[StepTrace], lang: str = "en", min_steps: int = 0) -> go.Figure:
    """Stacked bars, one per step, one colour per request: the tokens each request computed in that step
    (hatched = prefill chunk, solid = decode), the token budget as a line, and markers above the bar for the
    requests admitted, preempted or finished in that step (hover lists their ids). Up to ``MAX_REQUEST_ENTRIES``
    requests each have a legend entry; past that one entry stands for them all and a bar's hover names its request,
    so the legend stays a few lines whatever the number of requests.

    Speculative decoding (``ScheduledChunk.num_spec_tokens``): a decode that verified k proposals stacks its own
    token (solid), the accepted proposals (dotted) and the rejected ones (crossed, faded) in its colour, all of
    them in the token budget; the hover gives proposed / accepted / rejected.

    Args:
        traces: the engine's ``StepTrace`` list (x = ``step``, y = tokens).
        lang: "en" or "zh".
        min_steps: the x axis spans at least ``min_steps`` steps from the first one (steps 0 .. ``min_steps`` - 1
            for a run from its start), so the first bars of a run still in progress keep a bar's width instead
            of filling the plot (0 = fit the steps).
    """
    steps = [tr.step for tr in traces]
    first = steps[0] if steps else 0  # a window of a long run (a server's feed) starts later
    per_request: dict[str, dict[int, object]] = {}  # rid -> step -> its ScheduledChunk
    for tr in traces:
        for c in tr.chunks:
            per_request.setdefault(c.request_id, {})[tr.step] = c
    fig = go.Figure()
    named = len(per_request) <= MAX_REQUEST_ENTRIES  # each request its own legend entry, or one for them all
    for rid, by_step in per_request.items():
        xs = sorted(by_step)
        chunks = [by_step[s] for s in xs]
        kinds = [t("prefill_chunk", lang) if c.is_prefill else t("decode", lang) for c in chunks]
        fig.add_trace(go.Bar(
            x=xs, y=[c.num_tokens - c.num_spec_tokens for c in chunks], name=f"{t('request', lang)} {rid}",
            marker_color=request_color(rid), legendgroup=rid, showlegend=named,
            marker_pattern_shape=["/" if c.is_prefill else "" for c in chunks], customdata=kinds,
            hovertemplate=f"{t('request', lang)} {rid}<br>{t('step_axis', lang)} %{{x}}<br>%{{customdata}}: "
                          f"%{{y}} {t('tokens_unit', lang)}<extra></extra>",
        ))
        spec = [(s, c) for s, c in zip(xs, chunks) if c.num_spec_tokens]
        for key, shape, opacity in _SPEC_PARTS if spec else ():
            counts = [c.num_accepted_tokens if key == "accepted_proposals" else c.num_rejected_tokens
                      for _, c in spec]
            fig.add_trace(go.Bar(
                x=[s for s, _ in spec], y=counts, name=f"{rid} {t(key, lang)}", legendgroup=rid, showlegend=False,
                marker_color=request_color(rid), marker_opacity=opacity, marker_pattern_shape=shape,
                customdata=[[c.num_spec_tokens, c.num_accepted_tokens, c.num_rejected_tokens] for _, c in spec],
                hovertemplate=f"{t('request', lang)} {rid}<br>{t('step_axis', lang)} %{{x}}<br>"
                              f"{t('proposed', lang)} %{{customdata[0]}}, {t('accepted_proposals', lang)} "
                              f"%{{customdata[1]}}, {t('rejected_proposals', lang)} %{{customdata[2]}}<extra></extra>",
            ))
    if not named:  # one entry for the requests' colours; each bar's hover names its request
        fig.add_trace(go.Bar(x=[None], y=[None], name=t("requests_by_colour", lang),
                             marker_color=REQUESTS_SWATCH_COLOR, hoverinfo="skip"))
    if any(tr.num_spec_tokens for tr in traces):  # legend entries for the two patterns (the bars have none each)
        for key, shape, opacity in _SPEC_PARTS:
            fig.add_trace(go.Bar(x=[None], y=[None], name=t(f"proposals_legend_{key.split('_')[0]}", lang),
                                 marker_color=SPEC_LEGEND_COLOR, marker_opacity=opacity, marker_pattern_shape=shape,
                                 hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=steps, y=[tr.token_budget for tr in traces], mode="lines",
                             name=t("token_budget", lang), line={"color": BUDGET_COLOR, "dash": "dash"}))
    tops = {tr.step: tr.num_scheduled_tokens for tr in traces}
    lift = max([tr.token_budget for tr in traces] + [1]) * 0.04
    for offset, (field, key, symbol, color) in enumerate(_EVENTS, start=1):
        hits = [(tr.step, getattr(tr, field)) for tr in traces if getattr(tr, field)]
        if not hits:
            continue
        fig.add_trace(go.Scatter(
            x=[s for s, _ in hits], y=[tops[s] + offset * lift for s, _ in hits], mode="markers",
            name=t(key, lang), marker={"symbol": symbol, "size": 9, "color": color},
            customdata=[", ".join(ids) for _, ids in hits],
            hovertemplate=f"{t('step_axis', lang)} %{{x}}<br>{t(key, lang)}: %{{customdata}}<extra></extra>",
        ))
    fig.update_layout(
        barmode="stack", bargap=0.1, title=t("batch_title", lang),
        xaxis={"title": t("step_axis", lang),
               **({"range": [first - 0.5, first + max(min_steps, steps[-1] - first + 1 if steps else 0) - 0.5]}
                  if min_steps else {})},
        yaxis={"title": t("tokens_per_step", lang)},
        legend={"itemsizing": "constant"}, margin={"t": 60},
    )
    fit_legend(fig, sum(1 for d in fig.data if d.showlegend is not False))
    return fig


def spec_decode_figure(traces: list[StepTrace], lang: str = "en") -> go.Figure:
    """Speculative decoding zoomed in: per step, the decodes only, summed over requests, on their own token axis
    (a few to a few dozen tokens, where the batch figure's axis spans the token budget): the decodes' own tokens
    (1 each), the accepted proposals (dotted) and the rejected ones (crossed), each a legend entry; the hover
    gives the counts and the acceptance of the step.

    Args:
        traces: the engine's ``StepTrace`` list (x = ``step``, y = tokens; ``ScheduledChunk.num_spec_tokens``).
        lang: "en" or "zh".
    """
    steps = [tr.step for tr in traces]
    decodes = [[c for c in tr.chunks if not c.is_prefill] for tr in traces]
    own = [len(d) for d in decodes]
    accepted = [sum(c.num_accepted_tokens for c in d) for d in decodes]
    rejected = [sum(c.num_rejected_tokens for c in d) for d in decodes]
    fig = go.Figure()
    for key, ys, color, shape, opacity in (("own_tokens", own, OWN_TOKEN_COLOR, "", 1.0),
                                           ("proposals_legend_accepted", accepted, ACCEPTED_COLOR, ".", 1.0),
                                           ("proposals_legend_rejected", rejected, REJECTED_COLOR, "x", 0.6)):
        fig.add_trace(go.Bar(x=steps, y=ys, name=t(key, lang), marker_color=color, marker_opacity=opacity,
                             marker_pattern_shape=shape,
                             hovertemplate=f"{t('step_axis', lang)} %{{x}}<br>{t(key, lang)}: %{{y}}<extra></extra>"))
    fig.update_layout(barmode="stack", bargap=0.1, title=t("cap_spec_title", lang),
                      xaxis={"title": t("step_axis", lang)},
                      yaxis={"title": t("decode_tokens_axis", lang), "rangemode": "tozero"},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0, "traceorder": "normal"},
                      margin={"t": 90})
    return fig
