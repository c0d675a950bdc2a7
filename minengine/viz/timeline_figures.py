"""When tokens came out: per-request token rasters, inter-token latency (ITL, also called TBT) and the stalls
in it, each traced back to the step that caused it (the head-of-line blocking that chunked prefill removes:
Sarathi-Serve, Agrawal et al., OSDI 2024, section 3)."""

from __future__ import annotations

import bisect

import plotly.graph_objects as go

from minengine.metrics.trace import StepTrace
from minengine.outputs import RequestMetrics
from minengine.viz.colors import STALL_COLOR, request_color
from minengine.viz.i18n import t

_MAX_STALL_LABELS = 8  # more labels than this overlap; the rest stay in the hover text and the stall table


def token_times(m: RequestMetrics) -> list[float]:
    """Engine-clock times (s) of a request's output tokens: token i at ``first_token_time + sum(itls[:i])``.
    Empty when no token came out."""
    if m.first_token_time is None:
        return []
    times = [m.first_token_time]
    for gap in m.itls:
        times.append(times[-1] + gap)
    return times


def time_origin(request_metrics: dict[str, RequestMetrics]) -> float:
    """The first arrival (s, engine clock): time zero of the request-level figures."""
    return min((m.arrival_time for m in request_metrics.values()), default=0.0)


def token_timeline_figure(request_metrics: dict[str, RequestMetrics], lang: str = "en") -> go.Figure:
    """A raster: one row per request, a dot per output token at the time it came out (s since the first
    arrival), an open marker at the request's arrival, a diamond at its first token.

    Args:
        request_metrics: ``engine.request_metrics`` (request id -> ``RequestMetrics``).
        lang: "en" or "zh".
    """
    origin = time_origin(request_metrics)
    fig = go.Figure()
    for rid, m in request_metrics.items():
        label = f"{t('request', lang)} {rid}"
        times = [x - origin for x in token_times(m)]
        color = request_color(rid)
        fig.add_trace(go.Scatter(
            x=times, y=[label] * len(times), mode="markers", name=label, legendgroup=rid,
            marker={"color": color, "size": 6, "symbol": "line-ns-open", "line": {"width": 2, "color": color}},
            customdata=list(range(len(times))),
            hovertemplate=f"{label}<br>{t('output_token', lang)} #%{{customdata}}<br>%{{x:.3f}} s<extra></extra>",
        ))
        marks = [(m.arrival_time - origin, "circle-open", t("arrival", lang))]
        if times:
            marks.append((times[0], "diamond", t("first_token", lang)))
        for x, symbol, what in marks:
            fig.add_trace(go.Scatter(x=[x], y=[label], mode="markers", showlegend=False, legendgroup=rid,
                                     marker={"color": color, "size": 9, "symbol": symbol},
                                     hovertemplate=f"{label}<br>{what}<br>%{{x:.3f}} s<extra></extra>"))
    fig.update_layout(
        title=t("token_timeline_title", lang), xaxis={"title": t("time_since_arrival", lang)},
        yaxis={"title": t("request", lang), "type": "category", "autorange": "reversed"},
        height=max(320, 80 + 22 * len(request_metrics)), showlegend=False, margin={"t": 60},
    )
    return fig


def _steps_between(traces: list[StepTrace], end_times: list[float], after: float, upto: float) -> list[StepTrace]:
    """Steps that ended in (after, upto] (with a nanosecond of slack: token times are step end times, but
    summing ITLs may round)."""
    eps = 1e-9
    lo = bisect.bisect_right(end_times, after + eps)
    hi = bisect.bisect_right(end_times, upto + eps)
    return traces[lo:hi]


def _cause(rid: str, steps: list[StepTrace], lang: str) -> dict:
    """Why a request's token was late: its own preemption first, else the biggest prefill chunk computed in
    the gap (head-of-line blocking), else the longest step in the gap."""
    for tr in steps:
        if rid in tr.preempted_ids:
            return {"step": tr.step, "kind": "preempted", "cause_request_id": rid, "cause_tokens": 0,
                    "cause": t("cause_preempted", lang).format(step=tr.step, rid=rid)}
    prefills = [(c.num_tokens, tr.step, c.request_id) for tr in steps for c in tr.chunks if c.is_prefill]
    if prefills:
        tokens, step, other = max(prefills)
        return {"step": step, "kind": "prefill", "cause_request_id": other, "cause_tokens": tokens,
                "cause": t("cause_prefill", lang).format(step=step, tokens=tokens, rid=other)}
    if not steps:  # cannot happen for a token the engine produced; keep the stall rather than drop it
        return {"step": None, "kind": "unknown", "cause_request_id": None, "cause_tokens": 0, "cause": "?"}
    longest = max(steps, key=lambda tr: tr.duration)
    skipped = sum(1 for tr in steps if all(c.request_id != rid for c in tr.chunks))
    text = t("cause_batch", lang).format(step=longest.step, tokens=longest.num_scheduled_tokens,
                                         num=len(longest.chunks))
    if skipped:
        text += "; " + t("cause_not_scheduled", lang).format(rid=rid, num=skipped)
    return {"step": longest.step, "kind": "batch", "cause_request_id": None,
            "cause_tokens": longest.num_scheduled_tokens, "cause": text}


def find_stalls(request_metrics: dict[str, RequestMetrics], traces: list[StepTrace], threshold_s: float,
                lang: str = "en") -> list[dict]:
    """Every inter-token latency above ``threshold_s``, with the step that caused it named.

    Args:
        request_metrics: ``engine.request_metrics``.
        traces: ``engine.traces`` (sorted by step, as the engine records them).
        threshold_s: the stall threshold in seconds (>= 0).
        lang: language of the ``cause`` text.

    Returns:
        One dict per stall, sorted by time: ``request_id``, ``token_index`` (the late token's index in the
        output), ``time_s`` (when it came out, s since the first arrival), ``itl_s``, ``step`` (the causing
        step), ``kind`` ("prefill", "preempted", "batch"), ``cause_request_id``, ``cause_tokens`` and
        ``cause``, e.g. "step 42: 2,048-token prefill of request 7".

    Raises:
        ValueError: negative threshold.
    """
    if threshold_s < 0:
        raise ValueError(f"threshold_s must be >= 0 seconds, got {threshold_s}")
    origin = time_origin(request_metrics)
    end_times = [tr.end_time for tr in traces]
    stalls = []
    for rid, m in request_metrics.items():
        times = token_times(m)
        for i, gap in enumerate(m.itls):
            if gap <= threshold_s:
                continue
            cause = _cause(rid, _steps_between(traces, end_times, times[i], times[i + 1]), lang)
            stalls.append({"request_id": rid, "token_index": i + 1, "time_s": times[i + 1] - origin,
                           "itl_s": gap, **cause})
    stalls.sort(key=lambda s: (s["time_s"], s["request_id"]))
    return stalls


def itl_figure(request_metrics: dict[str, RequestMetrics], traces: list[StepTrace], threshold_s: float,
               lang: str = "en") -> go.Figure:
    """Every ITL (ms) against the time its token came out (s since the first arrival); stalls above
    ``threshold_s`` in red, the worst stall of each causing step labelled with that step's description, and
    the threshold as a dashed line.

    Raises:
        ValueError: negative threshold.
    """
    origin = time_origin(request_metrics)
    xs, ys, text = [], [], []
    for rid, m in request_metrics.items():
        times = token_times(m)
        for i, gap in enumerate(m.itls):
            xs.append(times[i + 1] - origin)
            ys.append(gap * 1000)
            text.append(f"{t('request', lang)} {rid}, #{i + 1}")
    stalls = find_stalls(request_metrics, traces, threshold_s, lang)
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="markers", name=t("itl", lang), text=text,
                               marker={"size": 5, "color": "#1f77b4", "opacity": 0.6},
                               hovertemplate="%{text}<br>%{x:.3f} s<br>%{y:.1f} ms<extra></extra>"))
    if stalls:
        fig.add_trace(go.Scatter(
            x=[s["time_s"] for s in stalls], y=[s["itl_s"] * 1000 for s in stalls], mode="markers",
            name=t("stall", lang), marker={"size": 9, "color": STALL_COLOR, "symbol": "diamond"},
            text=[f"{t('request', lang)} {s['request_id']}: {s['cause']}" for s in stalls],
            hovertemplate="%{text}<br>%{x:.3f} s<br>%{y:.1f} ms<extra></extra>"))
        worst_per_step: dict = {}
        for s in stalls:
            if s["step"] not in worst_per_step or s["itl_s"] > worst_per_step[s["step"]]["itl_s"]:
                worst_per_step[s["step"]] = s
        labelled = sorted(worst_per_step.values(), key=lambda s: -s["itl_s"])[:_MAX_STALL_LABELS]
        for k, s in enumerate(labelled):
            fig.add_annotation(x=s["time_s"], y=s["itl_s"] * 1000, text=s["cause"], showarrow=True, arrowhead=2,
                               ax=30, ay=-30 - 18 * (k % 3), font={"size": 10, "color": STALL_COLOR},
                               bgcolor="rgba(255,255,255,0.8)")
    fig.add_hline(y=threshold_s * 1000, line_dash="dash", line_color="#444444",
                  annotation_text=f"{t('threshold', lang)} {threshold_s * 1000:.0f} ms",
                  annotation_position="top left")
    fig.update_layout(title=t("itl_title", lang).format(threshold_ms=threshold_s * 1000),
                      xaxis={"title": t("time_since_arrival", lang)}, yaxis={"title": t("itl_axis", lang)},
                      margin={"t": 60})
    return fig
