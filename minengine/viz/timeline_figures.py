"""When tokens came out: per-request token rasters, inter-token latency (ITL, also called TBT) and the stalls
in it, each traced back to the step that caused it (the head-of-line blocking that chunked prefill removes:
Sarathi-Serve, Agrawal et al., OSDI 2024, section 3)."""

from __future__ import annotations

import bisect

import plotly.graph_objects as go

from minengine.metrics.trace import StepTrace
from minengine.outputs import RequestMetrics
from minengine.viz.clock_label import TOP_MARGIN, titled
from minengine.viz.colors import STALL_COLOR, request_color
from minengine.viz.i18n import t

# Stalls labelled in the ITL figure: the largest few, one per causing step, each on its own row above the
# data so no two labels can overlap; every stall is still in the hover text and in the stall table.
MAX_STALL_LABELS = 3
STALL_MARKS = "①②③④⑤⑥⑦⑧⑨⑩"  # the label numbers, also shown in the stall table


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


def _raster(rows: dict[str, tuple[float | None, list[float]]], lang: str, xaxis_key: str,
            arrival_key: str, clock_label: str | None) -> go.Figure:
    """rows: request id -> (arrival or admission time or None, token times), already shifted to the origin."""
    fig = go.Figure()
    for rid, (arrived, times) in rows.items():
        label = f"{t('request', lang)} {rid}"
        color = request_color(rid)
        fig.add_trace(go.Scatter(
            x=times, y=[label] * len(times), mode="markers", name=label, legendgroup=rid,
            marker={"color": color, "size": 6, "symbol": "line-ns-open", "line": {"width": 2, "color": color}},
            customdata=list(range(len(times))),
            hovertemplate=f"{label}<br>{t('output_token', lang)} #%{{customdata}}<br>%{{x:.3f}} s<extra></extra>",
        ))
        marks = [(arrived, "circle-open", t(arrival_key, lang))] if arrived is not None else []
        if times:
            marks.append((times[0], "diamond", t("first_token", lang)))
        for x, symbol, what in marks:
            fig.add_trace(go.Scatter(x=[x], y=[label], mode="markers", showlegend=False, legendgroup=rid,
                                     marker={"color": color, "size": 9, "symbol": symbol},
                                     hovertemplate=f"{label}<br>{what}<br>%{{x:.3f}} s<extra></extra>"))
    fig.update_layout(
        title=titled(t("token_timeline_title", lang), clock_label), xaxis={"title": t(xaxis_key, lang)},
        yaxis={"title": t("request", lang), "type": "category", "autorange": "reversed"},
        height=max(320, 100 + 22 * len(rows)), showlegend=False, margin={"t": TOP_MARGIN},
    )
    return fig


def token_timeline_figure(request_metrics: dict[str, RequestMetrics], lang: str = "en",
                          clock_label: str | None = None) -> go.Figure:
    """A raster: one row per request, a dot per output token at the time it came out (s since the first
    arrival), an open marker at the request's arrival, a diamond at its first token.

    Args:
        request_metrics: ``engine.request_metrics`` (request id -> ``RequestMetrics``).
        lang: "en" or "zh".
        clock_label: the clock the times are on, shown as the subtitle (``minengine.viz.clock_label``).
    """
    origin = time_origin(request_metrics)
    rows = {rid: (m.arrival_time - origin, [x - origin for x in token_times(m)])
            for rid, m in request_metrics.items()}
    return _raster(rows, lang, "time_since_arrival", "arrival", clock_label)


def step_token_times(traces: list[StepTrace]) -> dict[str, tuple[float, list[float]]]:
    """From the step stream alone: request id -> (time it was first scheduled, end times of the steps that
    sampled a token for it), in seconds on the engine clock. Token i of a request comes out at the end of the
    step whose chunk for it has ``sampled=True``; this is what a live view (a local run, or a server's stream of
    ``StepTrace``) knows before any ``RequestMetrics`` exist."""
    rows: dict[str, tuple[float, list[float]]] = {}
    for tr in traces:
        for c in tr.chunks:
            times = rows.setdefault(c.request_id, (tr.start_time, []))[1]
            if c.sampled:
                times.append(tr.end_time)
    return rows


def step_request_metrics(traces: list[StepTrace]) -> dict[str, RequestMetrics]:
    """``RequestMetrics`` rebuilt from the step stream alone (``step_token_times``), for the ITL figure and the
    stall finder of a live view that has no engine records (a server's feed): ``first_token_time`` and
    ``itls`` from the steps that sampled for the request, ``finished_time`` from ``finished_ids``. The stream
    does not carry arrivals, so ``arrival_time`` is the time the request was first scheduled within ``traces``
    (TTFT and queueing are not known from it; ITLs are exact: a token comes out at the end of its step)."""
    metrics: dict[str, RequestMetrics] = {}
    for rid, (first, times) in step_token_times(traces).items():
        metrics[rid] = RequestMetrics(arrival_time=first, first_scheduled_time=first,
                                      first_token_time=times[0] if times else None, num_output_tokens=len(times),
                                      itls=[b - a for a, b in zip(times, times[1:])])
    for tr in traces:
        for rid in tr.finished_ids:
            if rid in metrics:
                metrics[rid].finished_time = tr.end_time
    return metrics


def step_token_timeline_figure(traces: list[StepTrace], lang: str = "en",
                               clock_label: str | None = None) -> go.Figure:
    """The token raster of ``token_timeline_figure`` built from ``StepTrace``s only (``step_token_times``), so
    it can grow step by step while a run is in progress: x = seconds since the first step started, an open
    marker where the request was first scheduled, a diamond at its first token."""
    origin = traces[0].start_time if traces else 0.0
    rows = {rid: (first - origin, [x - origin for x in times])
            for rid, (first, times) in step_token_times(traces).items()}
    return _raster(rows, lang, "time_since_first_step", "first_scheduled", clock_label)


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
                    "cause": t("cause_preempted", lang).format(step=tr.step, rid=rid),
                    "short": t("short_preempted", lang).format(step=tr.step, rid=rid)}
    prefills = [(c.num_tokens, tr.step, c.request_id) for tr in steps for c in tr.chunks if c.is_prefill]
    if prefills:
        tokens, step, other = max(prefills)
        return {"step": step, "kind": "prefill", "cause_request_id": other, "cause_tokens": tokens,
                "cause": t("cause_prefill", lang).format(step=step, tokens=tokens, rid=other),
                "short": t("short_prefill", lang).format(step=step, tokens=tokens, rid=other)}
    if not steps:  # cannot happen for a token the engine produced; keep the stall rather than drop it
        return {"step": None, "kind": "unknown", "cause_request_id": None, "cause_tokens": 0, "cause": "?",
                "short": "?"}
    longest = max(steps, key=lambda tr: tr.duration)
    skipped = sum(1 for tr in steps if all(c.request_id != rid for c in tr.chunks))
    text = t("cause_batch", lang).format(step=longest.step, tokens=longest.num_scheduled_tokens,
                                         num=len(longest.chunks))
    if skipped:
        text += "; " + t("cause_not_scheduled", lang).format(rid=rid, num=skipped)
    return {"step": longest.step, "kind": "batch", "cause_request_id": None,
            "cause_tokens": longest.num_scheduled_tokens, "cause": text,
            "short": t("short_batch", lang).format(step=longest.step, tokens=longest.num_scheduled_tokens)}


def find_stalls(request_metrics: dict[str, RequestMetrics], traces: list[StepTrace], threshold_s: float,
                lang: str = "en", origin: float | None = None) -> list[dict]:
    """Every inter-token latency above ``threshold_s``, with the step that caused it named.

    Args:
        request_metrics: ``engine.request_metrics``.
        traces: ``engine.traces`` (sorted by step, as the engine records them).
        threshold_s: the stall threshold in seconds (>= 0).
        lang: language of the ``cause`` text.
        origin: time zero of ``time_s`` (s, engine clock); default the first arrival.

    Returns:
        One dict per stall, sorted by time: ``request_id``, ``token_index`` (the late token's index in the
        output), ``time_s`` (when it came out, s since ``origin``), ``itl_s``, ``step`` (the causing
        step), ``kind`` ("prefill", "preempted", "batch"), ``cause_request_id``, ``cause_tokens``,
        ``cause``, e.g. "step 42: 2,048-token prefill of request 7", and ``short``, the figure label
        ("step 42: 2,048-token prefill of 7").

    Raises:
        ValueError: negative threshold.
    """
    if threshold_s < 0:
        raise ValueError(f"threshold_s must be >= 0 seconds, got {threshold_s}")
    origin = time_origin(request_metrics) if origin is None else origin
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


AUTO_STALL_FACTOR = 3.0  # the default stall threshold: this many times the run's median ITL


def auto_stall_threshold(request_metrics: dict[str, RequestMetrics], factor: float = AUTO_STALL_FACTOR) -> float:
    """A stall threshold (s) that follows the clock: ``factor`` x the median inter-token latency of the run, so
    a stall means "much slower than this run's usual token", whether a step lasts 8 ms (a modelled H100) or
    60 ms (a modelled L4, or this CPU). 0 when no request produced two tokens.

    Raises:
        ValueError: ``factor`` not > 0.
    """
    if not factor > 0:
        raise ValueError(f"factor must be > 0, got {factor!r}")
    gaps = sorted(g for m in request_metrics.values() for g in m.itls)
    if not gaps:
        return 0.0
    mid = len(gaps) // 2
    median = gaps[mid] if len(gaps) % 2 else (gaps[mid - 1] + gaps[mid]) / 2
    return factor * median


def labelled_stalls(stalls: list[dict], max_labels: int = MAX_STALL_LABELS) -> list[dict]:
    """The stalls the ITL figure labels, largest first: the worst stall of each causing step, the
    ``max_labels`` largest of those (a step that stalls ten requests is one label, not ten). Index i gets the
    mark ``STALL_MARKS[i]`` in the figure and the stall table."""
    if not 0 <= max_labels <= len(STALL_MARKS):
        raise ValueError(f"max_labels must be in [0, {len(STALL_MARKS)}], got {max_labels}")
    worst_per_step: dict = {}
    for s in stalls:
        if s["step"] not in worst_per_step or s["itl_s"] > worst_per_step[s["step"]]["itl_s"]:
            worst_per_step[s["step"]] = s
    return sorted(worst_per_step.values(), key=lambda s: (-s["itl_s"], s["time_s"]))[:max_labels]


def itl_figure(request_metrics: dict[str, RequestMetrics], traces: list[StepTrace], threshold_s: float,
               lang: str = "en", max_labels: int = MAX_STALL_LABELS, clock_label: str | None = None,
               origin: float | None = None, y_top_ms: float | None = None) -> go.Figure:
    """Every ITL (ms) against the time its token came out (s since the first arrival, or since ``origin``); stalls above
    ``threshold_s`` in red, the threshold as a dashed line, and the ``max_labels`` largest stalls
    (``labelled_stalls``) named by the step that caused them.

    The labels sit in a band above the data, one row each, above their stall with an arrow down to it: rows
    cannot overlap whatever the stall times or the language; the other stalls are in the hover text and in
    ``find_stalls`` (the page's stall table).

    Args:
        clock_label: the clock the times are on, shown as the subtitle.
        origin: time zero of the x axis (s, engine clock): default the first arrival; a live view of a step
            stream (``step_request_metrics``) passes its first step's start, and the axis says "since first step".
        y_top_ms: build the label band on at least this data top (ms): figures shown side by side on one y range
            (an A/B pair) pass their common top, so each one's label rows keep their spacing on the shared axis
            (rows sized on a lower top were squeezed together, and overlapped, once the axis grew).

    Raises:
        ValueError: negative threshold; ``max_labels`` outside [0, 10].
    """
    xaxis_key = "time_since_arrival" if origin is None else "time_since_first_step"
    origin = time_origin(request_metrics) if origin is None else origin
    xs, ys, text = [], [], []
    for rid, m in request_metrics.items():
        times = token_times(m)
        for i, gap in enumerate(m.itls):
            xs.append(times[i + 1] - origin)
            ys.append(gap * 1000)
            text.append(f"{t('request', lang)} {rid}, #{i + 1}")
    stalls = find_stalls(request_metrics, traces, threshold_s, lang, origin=origin)
    labelled = labelled_stalls(stalls, max_labels)
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="markers", name=t("itl", lang), text=text,
                               marker={"size": 5, "color": "#1f77b4", "opacity": 0.6},
                               hovertemplate="%{text}<br>%{x:.3f} s<br>%{y:.1f} ms<extra></extra>"))
    threshold_ms = threshold_s * 1000
    y_top = max(ys + [threshold_ms, 1e-3] + ([y_top_ms] if y_top_ms is not None else []))
    x_lo, x_hi = min(xs + [0.0]), max(xs + [1e-3])
    x_pad = (x_hi - x_lo) * 0.03 or 1e-3
    yaxis = {"title": t("itl_axis", lang), "rangemode": "tozero"}
    if stalls:
        fig.add_trace(go.Scatter(
            x=[s["time_s"] for s in stalls], y=[s["itl_s"] * 1000 for s in stalls], mode="markers",
            name=t("stall", lang), marker={"size": 9, "color": STALL_COLOR, "symbol": "diamond"},
            text=[f"{t('request', lang)} {s['request_id']}: {s['cause']}" for s in stalls],
            hovertemplate="%{text}<br>%{x:.3f} s<br>%{y:.1f} ms<extra></extra>"))
    if labelled:
        # A band of len(labelled) rows above the highest point; the axis range is fixed so rows stay apart.
        row_h = 0.13 * y_top
        band_top = y_top * 1.08 + row_h * len(labelled)
        yaxis["range"] = [0, band_top]
        span = (x_hi - x_lo) or 1.0
        for k, s in enumerate(labelled):
            # above its own stall, anchored by the side it is on so the text runs into the plot, not off it
            where = (s["time_s"] - x_lo) / span
            anchor = "left" if where < 1 / 3 else "right" if where > 2 / 3 else "center"
            fig.add_annotation(
                x=s["time_s"], y=s["itl_s"] * 1000, ax=s["time_s"], ay=band_top - row_h * (k + 0.5),
                axref="x", ayref="y", xanchor=anchor, yanchor="middle", text=f"{STALL_MARKS[k]} {s['short']}",
                showarrow=True, arrowhead=2, arrowwidth=1, arrowcolor=STALL_COLOR,
                font={"size": 11, "color": STALL_COLOR}, bgcolor="rgba(255,255,255,0.85)")
    # the threshold as a legend entry, not a text label: a label on the line sat on top of the points near it
    fig.add_trace(go.Scatter(x=[x_lo - x_pad, x_hi + x_pad], y=[threshold_ms, threshold_ms], mode="lines",
                             name=f"{t('threshold', lang)} {threshold_ms:.1f} {t('ms', lang)}", hoverinfo="skip",
                             line={"dash": "dash", "color": "#444444", "width": 1}))
    fig.update_layout(title=titled(t("itl_title", lang).format(threshold_ms=threshold_ms), clock_label),
                      xaxis={"title": t(xaxis_key, lang), "range": [x_lo - x_pad, x_hi + x_pad]},
                      yaxis=yaxis, margin={"t": TOP_MARGIN},
                      # the legend in a row under the axis title: on the right it took the plot's width and sat
                      # where a long stall label (a server's request ids) anchored left of centre runs out
                      legend={"orientation": "h", "yanchor": "top", "y": -0.28, "x": 0, "xanchor": "left"})
    return fig
