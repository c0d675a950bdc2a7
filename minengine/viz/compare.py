"""A/B comparison of two runs of the same workload: one sentence of latencies (P99 TBT, P99 TTFT, throughput), one
of work (tokens computed, steps, preemptions, swaps), and each request's TTFT and TBT under both runs."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from minengine.metrics.stats import ServingSummary, percentile
from minengine.metrics.trace import StepTrace
from minengine.outputs import RequestMetrics
from minengine.viz.clock_label import TOP_MARGIN, titled
from minengine.viz.i18n import t

AB_COLORS = ("#1f77b4", "#ff7f0e")  # run A, run B


def _pct(a: float, b: float) -> float:
    """Relative change of a against b, in percent; NaN when b is 0 or either is NaN."""
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return math.nan
    return (a - b) / b * 100


def ab_sentence(summary_a: ServingSummary, summary_b: ServingSummary, label_a: str, label_b: str,
                lang: str = "en") -> str:
    """One sentence comparing run A with run B: P99 TBT (= P99 ITL), P99 TTFT (ms) and output throughput
    (tok/s), each with A's relative change against B in percent. Numbers come from the two summaries."""
    return t("ab_sentence", lang).format(
        a=label_a, b=label_b,
        itl_ms_a=summary_a.itl_p99 * 1000, itl_ms_b=summary_b.itl_p99 * 1000,
        itl_pct=_pct(summary_a.itl_p99, summary_b.itl_p99),
        ttft_ms_a=summary_a.ttft_p99 * 1000, ttft_ms_b=summary_b.ttft_p99 * 1000,
        ttft_pct=_pct(summary_a.ttft_p99, summary_b.ttft_p99),
        tput_a=summary_a.output_tok_s, tput_b=summary_b.output_tok_s,
        tput_pct=_pct(summary_a.output_tok_s, summary_b.output_tok_s),
    )


def ab_work_sentence(traces_a: list[StepTrace], traces_b: list[StepTrace], summary_a: ServingSummary,
                     summary_b: ServingSummary, label_a: str, label_b: str, lang: str = "en") -> str:
    """What each run computed: tokens (prefill + decode + proposals, summed over steps), steps, preemptions and
    KV blocks swapped out to the CPU. What recompute vs swap, prefix caching and speculation change shows here
    even where the latencies hardly move."""
    def count(key: str, n: int) -> str:  # "1 preemption", "5 preemptions"
        return t(key if n == 1 else key + "s", lang).format(n=n)

    return t("ab_work", lang).format(
        a=label_a, b=label_b, tok_a=sum(tr.num_scheduled_tokens for tr in traces_a),
        tok_b=sum(tr.num_scheduled_tokens for tr in traces_b), steps_a=len(traces_a), steps_b=len(traces_b),
        pre_a=count("ab_preemption", summary_a.num_preemptions),
        pre_b=count("ab_preemption", summary_b.num_preemptions),
        swap_a=count("ab_kv_block", summary_a.num_swapped_out_blocks),
        swap_b=count("ab_block", summary_b.num_swapped_out_blocks))


def _request_values(metrics: dict[str, RequestMetrics], kind: str) -> dict[str, float]:
    """Per request, in ms: TTFT, or its longest inter-token gap (its worst stall; none with < 2 tokens)."""
    if kind == "ttft":
        return {rid: m.ttft * 1000 for rid, m in metrics.items() if m.ttft is not None}
    return {rid: max(m.itls) * 1000 for rid, m in metrics.items() if m.itls}


def _run_p99(metrics: dict[str, RequestMetrics], kind: str) -> float | None:
    """The sentence's P99 (ms) of a run, as ``summarize`` computes it: over requests (TTFT) or over every token gap
    of the run pooled (TBT); None when there is nothing to take it over."""
    done = [m for m in metrics.values() if m.finished_time is not None]
    values = [m.ttft for m in done if m.ttft is not None] if kind == "ttft" else [x for m in done for x in m.itls]
    return percentile(values, 99) * 1000 if values else None


def ab_request_figure(metrics_a: dict[str, RequestMetrics], metrics_b: dict[str, RequestMetrics], label_a: str,
                      label_b: str, kind: str, lang: str = "en", clock_label: str | None = None) -> go.Figure:
    """Each request's TTFT (``kind="ttft"``) or longest token gap (``kind="tbt"``: its worst stall), in ms, under
    run A and run B side by side (grouped bars, requests in arrival order), with each run's P99 in its colour as a
    dashed line: the P99 the A/B sentence gives (``ServingSummary.ttft_p99`` over requests, ``itl_p99`` over every
    gap of the run). So the line is the sentence's number; a bar above it is a request stalled worse than the run's
    tail, and a stall a few requests suffer lies above a P99 that it moves little. (A request's own P99 over its
    ~60 gaps smooths one stall away; it drew bars that disagreed with the sentence, 26 ms under a 53 ms P99.)

    Raises:
        ValueError: ``kind`` not "ttft" or "tbt".
    """
    if kind not in ("ttft", "tbt"):
        raise ValueError(f"kind must be 'ttft' or 'tbt', got {kind!r}")
    order = sorted(metrics_a, key=lambda rid: (metrics_a[rid].arrival_time, rid))
    fig = go.Figure()
    for label, metrics, color in ((label_a, metrics_a, AB_COLORS[0]), (label_b, metrics_b, AB_COLORS[1])):
        values = _request_values(metrics, kind)
        rids = [rid for rid in order if rid in values]
        fig.add_trace(go.Bar(x=rids, y=[values[r] for r in rids], name=label, marker_color=color,
                             hovertemplate=f"{label}<br>{t('request', lang)} %{{x}}<br>%{{y:.1f}} ms<extra></extra>"))
        p99 = _run_p99(metrics, kind)
        if p99 is not None and order:
            fig.add_trace(go.Scatter(x=[order[0], order[-1]], y=[p99, p99], mode="lines", showlegend=False,
                                     name=f"{label} P99", line={"color": color, "dash": "dash", "width": 1},
                                     hovertemplate=f"{label}: P99 %{{y:.1f}} ms<extra></extra>"))
    fig.update_layout(barmode="group", bargap=0.2, title=titled(t(f"ab_{kind}_title", lang), clock_label),
                      xaxis={"title": t("request", lang), "type": "category"},
                      yaxis={"title": t(f"ab_{kind}_axis", lang), "rangemode": "tozero"},
                      # above the plot, under the subtitle: below it, it met the rotated request ids and the axis title
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "x": 0},
                      margin={"t": TOP_MARGIN + 28})
    return fig


def share_y_range(figs: list[go.Figure]) -> None:
    """Give ``figs`` one y range from 0 to the highest of their tops (a fixed range, e.g. an ITL figure's label
    band, or else the highest point plus 5 %), so side by side the same height means the same value. ITL figures
    with stall labels should be built on one data top (``itl_figure(..., y_top_ms=...)``) so their label rows keep
    their spacing on the shared range."""
    def top(fig) -> float:
        if fig.layout.yaxis.range is not None:
            return fig.layout.yaxis.range[1]
        ys = [y for tr in fig.data for y in (tr.y or ()) if y is not None]
        return 1.05 * max(ys, default=1.0)

    high = max(top(f) for f in figs)
    for f in figs:
        f.update_yaxes(range=[0, high])
