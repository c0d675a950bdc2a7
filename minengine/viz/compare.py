"""A/B comparison of two runs of the same workload, stated in one sentence (P99 TBT, P99 TTFT, throughput)."""

from __future__ import annotations

import math

from minengine.metrics.stats import ServingSummary
from minengine.viz.i18n import t


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
