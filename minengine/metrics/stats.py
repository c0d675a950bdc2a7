"""Serving statistics: percentiles of TTFT, TPOT, ITL and E2E latency, throughput, cache and preemption counts.

Definitions follow vLLM's serving benchmark: TTFT = first token time - arrival; TPOT = (E2E - TTFT) / (n - 1);
ITL = gap between consecutive tokens of one request; throughput over the span first arrival -> last finish.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from minengine.core.spec_decode import SpecDecodeStats
from minengine.metrics.trace import StepTrace
from minengine.outputs import RequestMetrics


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation (numpy's default); NaN for no values."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass
class ServingSummary:
    """A run in numbers. Latencies in seconds; throughput in tokens/s; NaN where undefined.

    ``prefix_queried_tokens`` / ``prefix_hit_tokens`` / ``prefix_hit_rate`` count each request's first
    admission only (as vLLM since PR #25787); ``readmission_hit_tokens`` are the tokens recompute-preempted
    requests got back from the prefix cache on re-admission (recompute work the cache saved).

    Speculative decoding: ``spec_num_drafts`` (request-steps that carried proposals), ``spec_draft_tokens``
    (proposed), ``spec_accepted_tokens`` (accepted), ``spec_acceptance_rate`` (accepted / proposed) and
    ``spec_mean_acceptance_length`` (1 + accepted / drafts: tokens per drafted decode, vLLM's "mean acceptance
    length"); the last two are properties computed from the counts, NaN without speculation (so two summaries
    and their ``as_dict()`` compare equal when their fields do; ``as_dict`` has them only when drafts ran)."""

    num_requests: int
    num_steps: int
    duration_s: float
    prompt_tokens: int
    output_tokens: int
    output_tok_s: float
    total_tok_s: float
    ttft_p50: float
    ttft_p95: float
    ttft_p99: float
    tpot_p50: float
    tpot_p95: float
    tpot_p99: float
    itl_p50: float
    itl_p95: float
    itl_p99: float
    e2e_p50: float
    e2e_p99: float
    num_preemptions: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    prefix_hit_rate: float
    peak_kv_blocks_used: int
    num_kv_blocks: int
    num_swapped_out_blocks: int = 0
    num_swapped_in_blocks: int = 0
    swap_time_s: float = 0.0
    num_timeouts: int = 0
    readmission_hit_tokens: int = 0
    spec_num_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0

    @property
    def spec_acceptance_rate(self) -> float:
        """Accepted / proposed tokens; NaN without proposals."""
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else math.nan

    @property
    def spec_mean_acceptance_length(self) -> float:
        """1 + accepted proposals per draft (tokens a drafted decode produced); NaN without drafts."""
        return 1 + self.spec_accepted_tokens / self.spec_num_drafts if self.spec_num_drafts else math.nan

    def as_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.spec_num_drafts:
            d["spec_acceptance_rate"] = self.spec_acceptance_rate
            d["spec_mean_acceptance_length"] = self.spec_mean_acceptance_length
        return d

    def as_table(self) -> str:
        """A plain-text table, milliseconds for latencies."""
        ms = 1000
        rows = [
            ("requests", f"{self.num_requests}"), ("steps", f"{self.num_steps}"),
            ("duration (s)", f"{self.duration_s:.2f}"),
            ("prompt / output tokens", f"{self.prompt_tokens} / {self.output_tokens}"),
            ("output tok/s", f"{self.output_tok_s:.1f}"), ("total tok/s", f"{self.total_tok_s:.1f}"),
            ("TTFT P50/P95/P99 (ms)", f"{self.ttft_p50*ms:.1f} / {self.ttft_p95*ms:.1f} / {self.ttft_p99*ms:.1f}"),
            ("TPOT P50/P95/P99 (ms)", f"{self.tpot_p50*ms:.1f} / {self.tpot_p95*ms:.1f} / {self.tpot_p99*ms:.1f}"),
            ("ITL P50/P95/P99 (ms)", f"{self.itl_p50*ms:.1f} / {self.itl_p95*ms:.1f} / {self.itl_p99*ms:.1f}"),
            ("E2E P50/P99 (ms)", f"{self.e2e_p50*ms:.1f} / {self.e2e_p99*ms:.1f}"),
            ("preemptions", f"{self.num_preemptions}"),
            ("prefix hit tokens", f"{self.prefix_hit_tokens} of {self.prefix_queried_tokens} "
                                  f"({self.prefix_hit_rate:.1%})"),
            ("peak KV blocks used", f"{self.peak_kv_blocks_used} of {self.num_kv_blocks}"),
        ]
        if self.num_swapped_out_blocks or self.num_swapped_in_blocks:
            rows.append(("swapped out / in blocks (time ms)", f"{self.num_swapped_out_blocks} / "
                         f"{self.num_swapped_in_blocks} ({self.swap_time_s * ms:.1f})"))
        if self.readmission_hit_tokens:
            rows.append(("re-admission prefix hit tokens", f"{self.readmission_hit_tokens}"))
        if self.num_timeouts:
            rows.append(("timeouts", f"{self.num_timeouts}"))
        if self.spec_num_drafts:
            rows.append(("speculative: accepted / proposed", f"{self.spec_accepted_tokens} / "
                         f"{self.spec_draft_tokens} ({self.spec_acceptance_rate:.1%}), mean acceptance length "
                         f"{self.spec_mean_acceptance_length:.2f}"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def summarize(metrics: list[RequestMetrics], traces: list[StepTrace], num_kv_blocks: int) -> ServingSummary:
    """Summarize finished requests and the steps that served them."""
    done = [m for m in metrics if m.finished_time is not None]
    ttfts = [m.ttft for m in done if m.ttft is not None]
    tpots = [m.tpot for m in done if m.tpot is not None]
    itls = [x for m in done for x in m.itls]
    e2es = [m.e2e_latency for m in done]
    out_tokens = sum(m.num_output_tokens for m in done)
    prompt_tokens = sum(m.num_prompt_tokens for m in done)
    duration = (max(m.finished_time for m in done) - min(m.arrival_time for m in done)) if done else 0.0
    spec = SpecDecodeStats.of_steps(traces)
    queried = sum(t.prefix_queried_tokens for t in traces)
    hit = sum(t.prefix_hit_tokens for t in traces)
    return ServingSummary(
        num_requests=len(done), num_steps=sum(not t.rolled_back for t in traces), duration_s=duration,
        prompt_tokens=prompt_tokens, output_tokens=out_tokens,
        output_tok_s=out_tokens / duration if duration > 0 else math.nan,
        total_tok_s=(out_tokens + prompt_tokens) / duration if duration > 0 else math.nan,
        ttft_p50=percentile(ttfts, 50), ttft_p95=percentile(ttfts, 95), ttft_p99=percentile(ttfts, 99),
        tpot_p50=percentile(tpots, 50), tpot_p95=percentile(tpots, 95), tpot_p99=percentile(tpots, 99),
        itl_p50=percentile(itls, 50), itl_p95=percentile(itls, 95), itl_p99=percentile(itls, 99),
        e2e_p50=percentile(e2es, 50), e2e_p99=percentile(e2es, 99),
        num_preemptions=sum(len(t.preempted_ids) for t in traces),
        prefix_queried_tokens=queried, prefix_hit_tokens=hit, prefix_hit_rate=hit / queried if queried else 0.0,
        peak_kv_blocks_used=max((t.num_used_blocks for t in traces), default=0), num_kv_blocks=num_kv_blocks,
        num_swapped_out_blocks=sum(t.num_swapped_out_blocks for t in traces),
        num_swapped_in_blocks=sum(t.num_swapped_in_blocks for t in traces),
        swap_time_s=sum(t.swap_time_s for t in traces),
        num_timeouts=sum(m.finish_reason == "timeout" for m in done),
        readmission_hit_tokens=sum(t.readmission_hit_tokens for t in traces),
        spec_num_drafts=spec.num_drafts, spec_draft_tokens=spec.num_draft_tokens,
        spec_accepted_tokens=spec.num_accepted_tokens,
    )
