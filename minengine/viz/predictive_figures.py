"""Predictive scheduling pictures: predicted vs true output lengths, and what each policy does to latency
(``benchmarks/predictive.py`` writes the numbers; ``minengine.core.predictors`` makes the predictions)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

from minengine.viz.i18n import t

_LATENCIES = (("ttft_mean", "mean TTFT"), ("ttft_p99", "P99 TTFT"), ("e2e_mean", "mean E2E"), ("e2e_p99", "P99 E2E"))


def predicted_vs_true_figure(true: Sequence[int], predicted: Sequence[int], lang: str = "en",
                             name: str = "") -> go.Figure:
    """One dot per request: its true output length (x) against the predicted one (y), log-log, with the line
    y = x (a perfect predictor) and the band within a factor of 2.

    Args:
        true, predicted: output lengths in tokens (>= 1), one per request, in the same order.
        name: the predictor's name, for the legend and title.

    Raises:
        ValueError: different lengths, no requests, or a length < 1 (a log axis cannot show it).
    """
    if len(true) != len(predicted) or not true:
        raise ValueError("need one prediction per true length, at least one")
    if min(true) < 1 or min(predicted) < 1:
        raise ValueError("output lengths must be >= 1 token")
    lo, hi = min(min(true), min(predicted)), max(max(true), max(predicted))
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(true), y=list(predicted), mode="markers", name=name or t("predicted", lang),
                             marker={"size": 4, "opacity": 0.4},
                             hovertemplate=f"{t('true_len', lang)} %{{x}}<br>{t('predicted', lang)} %{{y}}"
                                           "<extra></extra>"))
    for factor, dash, key in ((1, "solid", "perfect_prediction"), (2, "dot", "within_2x"), (0.5, "dot", None)):
        fig.add_trace(go.Scatter(x=[lo, hi], y=[lo * factor, hi * factor], mode="lines",
                                 name=t(key, lang) if key else "", showlegend=key is not None,
                                 line={"color": "#444444", "dash": dash, "width": 1}, hoverinfo="skip"))
    fig.update_layout(title=t("predicted_vs_true_title", lang).format(name=name),
                      xaxis={"title": t("true_len_axis", lang), "type": "log"},
                      yaxis={"title": t("predicted_len_axis", lang), "type": "log"}, margin={"t": 60})
    return fig


def policy_latency_figure(rows: Sequence[dict], lang: str = "en", clock_label: str = "") -> go.Figure:
    """Grouped bars: mean and P99 TTFT and E2E latency (seconds) of each scheduling setup.

    Args:
        rows: one dict per setup with "label" and the seconds "ttft_mean", "ttft_p99", "e2e_mean", "e2e_p99"
            (the rows ``benchmarks/predictive.py`` writes to ``predictive.json``), optionally "preemptions".
        clock_label: which clock the times are on, for the subtitle.

    Raises:
        ValueError: no rows, or a row without one of the fields.
    """
    if not rows:
        raise ValueError("no rows to draw")
    for r in rows:
        missing = [f for f in ("label",) + tuple(k for k, _ in _LATENCIES) if f not in r]
        if missing:
            raise ValueError(f"row {r.get('label', '?')!r} lacks {missing}")
    labels = [r["label"] for r in rows]
    fig = go.Figure()
    for key, name in _LATENCIES:
        ys = [r[key] for r in rows]
        fig.add_trace(go.Bar(x=labels, y=ys, name=name,
                             customdata=[r.get("preemptions", math.nan) for r in rows],
                             hovertemplate=f"%{{x}}<br>{name} %{{y:.2f}} s<br>{t('metric_preemptions', lang)} "
                                           "%{customdata}<extra></extra>"))
    title = t("policy_latency_title", lang)
    if clock_label:
        title += f"<br><sup>{clock_label}</sup>"
    fig.update_layout(barmode="group", title=title, yaxis={"title": t("latency_s_axis", lang)},
                      xaxis={"tickangle": -30}, margin={"t": 70})
    return fig
