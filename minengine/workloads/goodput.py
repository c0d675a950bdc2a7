"""Goodput and capacity: how many requests per second a deployment serves *within its latency SLOs*.

Throughput counts every token; users only notice requests that came fast enough. Goodput (DistServe, Zhong
et al., OSDI 2024) counts the requests per second that meet every SLO; vLLM's serving benchmark reports it as
"Request goodput". Capacity (Sarathi-Serve, Agrawal et al., OSDI 2024, section 5) is the highest arrival rate
a system sustains while meeting its latency SLO with the scheduling delay bounded: found here by bisection
over Poisson arrival rates at or below the engine's maximum throughput (measured first, in the same search), each
probe a virtual-clock replay (``minengine.workloads.replay``) of many requests per running slot, its first
requests (a warm-up) left out of the measurement.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from minengine.config import EngineConfig
from minengine.metrics.stats import percentile
from minengine.outputs import RequestMetrics
from minengine.timing.clocks import ClockChoice, MeasuredClock, clock_factory
from minengine.workloads.arrivals import poisson_arrivals, with_arrivals
from minengine.workloads.replay import replay_trace
from minengine.workloads.traces import TraceRequest


def _metrics_list(request_metrics) -> list[RequestMetrics]:
    if isinstance(request_metrics, dict):
        return list(request_metrics.values())
    return list(request_metrics)


@dataclass(frozen=True)
class SLO:
    """Per-request latency objectives in seconds; None leaves one out.

    Attributes:
        ttft_s: time to first token (arrival -> first token, queueing included).
        tpot_s: time per output token after the first, ``(e2e - ttft) / (n - 1)``.
        tbt_p99_s: the 99th percentile of the request's own time-between-tokens (its ITLs): bounds the
            stalls a user sees while the text streams (Sarathi-Serve's SLO is on P99 TBT).

    Raises:
        ValueError: a bound that is not a number > 0.
    """

    ttft_s: float | None = None
    tpot_s: float | None = None
    tbt_p99_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s", "tbt_p99_s"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0):
                raise ValueError(f"{name} must be a number > 0 (seconds) or None, got {v!r}")

    def __str__(self) -> str:
        parts = [f"{label} <= {v * 1000:g} ms" for label, v in
                 (("TTFT", self.ttft_s), ("TPOT", self.tpot_s), ("P99 TBT", self.tbt_p99_s)) if v is not None]
        return ", ".join(parts) or "no SLO"


def meets_slo(m: RequestMetrics, slo: SLO) -> bool:
    """True when the request finished and met every bound of ``slo``. A request with one output token has no
    TPOT and no TBT, so only its TTFT is checked."""
    if m.finished_time is None or m.first_token_time is None:
        return False
    if slo.ttft_s is not None and m.ttft > slo.ttft_s:
        return False
    if slo.tpot_s is not None and m.tpot is not None and m.tpot > slo.tpot_s:
        return False
    if slo.tbt_p99_s is not None and m.itls and percentile(m.itls, 99) > slo.tbt_p99_s:
        return False
    return True


def slo_attainment(request_metrics: dict[str, RequestMetrics] | Iterable[RequestMetrics], slo: SLO) -> float:
    """Fraction of requests (finished or not) that met every SLO; NaN with no requests."""
    ms = _metrics_list(request_metrics)
    return sum(meets_slo(m, slo) for m in ms) / len(ms) if ms else math.nan


def benchmark_duration(request_metrics: dict[str, RequestMetrics] | Iterable[RequestMetrics]) -> float:
    """Seconds from the first arrival to the last finish (0 with no finished request), as ``summarize``."""
    ms = _metrics_list(request_metrics)
    done = [m.finished_time for m in ms if m.finished_time is not None]
    return max(done) - min(m.arrival_time for m in ms) if done else 0.0


def goodput(request_metrics: dict[str, RequestMetrics] | Iterable[RequestMetrics], slo: SLO,
            duration_s: float | None = None) -> float:
    """Requests per second that met every SLO (TTFT, TPOT, per-request P99 TBT).

    Args:
        request_metrics: the engine's ``request_metrics`` (dict or list).
        slo: the objectives.
        duration_s: the run's length; default first arrival -> last finish (``benchmark_duration``).

    Returns:
        requests/s; 0.0 when no request met the SLO, NaN when the duration is 0.
    """
    ms = _metrics_list(request_metrics)
    duration = benchmark_duration(ms) if duration_s is None else duration_s
    good = sum(meets_slo(m, slo) for m in ms)
    if duration <= 0:
        return math.nan if good else 0.0
    return good / duration


def _slo_counts(ms: list[RequestMetrics], slo: SLO) -> dict[str, int]:
    """Requests (of ``ms``) within each bound of ``slo`` separately, and within all of them ("all")."""
    counts = {"all": sum(meets_slo(m, slo) for m in ms)}
    for key in ("ttft_s", "tpot_s", "tbt_p99_s"):
        if getattr(slo, key) is not None:
            only = SLO(**{key: getattr(slo, key)})
            counts[key] = sum(meets_slo(m, only) for m in ms)
    return counts


# ---- the serving-benchmark table ----------------------------------------------------------------------------
@dataclass
class ServingBenchmark:
    """vLLM ``benchmark_serving.py``'s result numbers for one run. Latencies in seconds, rates per second."""

    completed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    request_goodput: float
    output_throughput: float
    total_token_throughput: float
    latencies: dict[str, tuple[float, float, float]]  # "TTFT"/"TPOT"/"ITL"/"E2EL" -> (mean, median, P99)
    slo: SLO | None = None
    slo_met: dict[str, int] = field(default_factory=dict)  # "all" and each given bound -> requests within it
    num_requests: int = 0  # requests in the run, finished or not (the SLO attainment's denominator)

    @classmethod
    def from_metrics(cls, request_metrics, slo: SLO | None = None) -> ServingBenchmark:
        """Compute the numbers from finished requests' ``RequestMetrics``."""
        every = _metrics_list(request_metrics)
        ms = [m for m in every if m.finished_time is not None]
        duration = benchmark_duration(ms)
        out_tokens = sum(m.num_output_tokens for m in ms)
        in_tokens = sum(m.num_prompt_tokens for m in ms)

        def stats(xs: list[float]) -> tuple[float, float, float]:
            return (statistics.fmean(xs), statistics.median(xs), percentile(xs, 99)) if xs else (math.nan,) * 3

        def rate(n: float) -> float:
            return n / duration if duration > 0 else math.nan

        return cls(
            completed=len(ms), duration_s=duration, total_input_tokens=in_tokens, total_output_tokens=out_tokens,
            request_throughput=rate(len(ms)), request_goodput=goodput(ms, slo) if slo is not None else math.nan,
            output_throughput=rate(out_tokens), total_token_throughput=rate(in_tokens + out_tokens),
            latencies={"TTFT": stats([m.ttft for m in ms]), "TPOT": stats([m.tpot for m in ms if m.tpot is not None]),
                       "ITL": stats([x for m in ms for x in m.itls]), "E2EL": stats([m.e2e_latency for m in ms])},
            slo=slo, slo_met=_slo_counts(every, slo) if slo is not None else {}, num_requests=len(every))

    def as_table(self, title: str = "Serving Benchmark Result") -> str:
        """The table in the layout of vLLM's ``benchmark_serving.py`` (milliseconds for latencies)."""
        w = 50

        def line(label: str, value: str) -> str:
            return f"{label:<40}{value:<10}"

        rows = [f"{' ' + title + ' ':=^{w}}",
                line("Successful requests:", f"{self.completed}"),
                line("Benchmark duration (s):", f"{self.duration_s:.2f}"),
                line("Total input tokens:", f"{self.total_input_tokens}"),
                line("Total generated tokens:", f"{self.total_output_tokens}"),
                line("Request throughput (req/s):", f"{self.request_throughput:.2f}")]
        if self.slo is not None:
            rows.append(line("Request goodput (req/s):", f"{self.request_goodput:.2f}"))
        rows += [line("Output token throughput (tok/s):", f"{self.output_throughput:.2f}"),
                 line("Total Token throughput (tok/s):", f"{self.total_token_throughput:.2f}")]
        names = {"TTFT": "Time to First Token", "TPOT": "Time per Output Token (excl. 1st token)",
                 "ITL": "Inter-token Latency", "E2EL": "End-to-end Latency"}
        for key, name in names.items():
            mean, median, p99 = self.latencies[key]
            rows += [f"{name:-^{w}}", line(f"Mean {key} (ms):", f"{mean * 1000:.2f}"),
                     line(f"Median {key} (ms):", f"{median * 1000:.2f}"), line(f"P99 {key} (ms):", f"{p99 * 1000:.2f}")]
        if self.slo is not None and self.slo_met:
            n = max(self.num_requests, 1)
            rows.append(f"{'SLO attainment':-^{w}}")
            for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("tbt_p99_s", "P99 TBT")):
                if key in self.slo_met:
                    bound = getattr(self.slo, key) * 1000
                    rows.append(line(f"Within {label} <= {bound:g} ms:", f"{self.slo_met[key]}/{self.num_requests} "
                                     f"({self.slo_met[key] / n:.1%})"))
            rows.append(line("Within all SLOs (goodput):", f"{self.slo_met['all']}/{self.num_requests} "
                             f"({self.slo_met['all'] / n:.1%})"))
        rows.append("=" * w)
        return "\n".join(r.rstrip() for r in rows)


# ---- capacity -----------------------------------------------------------------------------------------------
STEADY_STATE_FACTOR = 8  # a probe reaches a steady state when it has >= this many requests per running slot
WARMUP_FRACTION = 0.25  # the first quarter of a probe's requests (by arrival) meet an empty engine: not counted
MIN_COMPLETED_FRACTION = 0.95  # a sustained rate: completions keep up with at least this share of the arrivals


@dataclass(frozen=True)
class CapacityProbe:
    """One probed arrival rate (req/s), measured on the probe's requests after its warm-up: SLO attainment,
    median scheduling delay (arrival -> first scheduled, s), goodput (req/s, whole probe), whether it passed;
    ``throughput`` is the probe's completed requests per second (first arrival -> last finish);
    ``completed_fraction`` the requests completed per request arrived over the arrival window (see
    ``completed_fraction``); ``sustained`` whether that kept to the search's minimum (else the backlog grew: the
    rate was not sustained, whatever the latencies); ``window_arrival_rate`` the arrivals per second over that window
    (a Poisson draw's own rate, not exactly ``rate``), so ``completed_fraction * window_arrival_rate`` is the
    completions per second over it."""

    rate: float
    attainment: float
    median_queue_delay_s: float
    goodput: float
    passed: bool
    throughput: float = math.nan
    completed_fraction: float = math.nan
    sustained: bool = True
    window_arrival_rate: float = math.nan


def arrival_window(request_metrics, warmup: int = 0) -> tuple[float, int, int]:
    """``(seconds, arrived, completed)`` over the arrival window of a run: from the arrival of the first request
    after the ``warmup`` first ones (by arrival) to the last arrival; ``arrived`` and ``completed`` count the
    arrivals and the completions (of any request) inside it, its start excluded.

    Raises:
        ValueError: ``warmup`` negative or not below the number of requests.
    """
    by_arrival = sorted(_metrics_list(request_metrics), key=lambda m: m.arrival_time)
    if not 0 <= warmup < len(by_arrival):
        raise ValueError(f"warmup must be in [0, {len(by_arrival)}), got {warmup!r}")
    start, end = by_arrival[warmup].arrival_time, by_arrival[-1].arrival_time
    arrived = sum(1 for m in by_arrival if start < m.arrival_time <= end)
    completed = sum(1 for m in by_arrival if m.finished_time is not None and start < m.finished_time <= end)
    return end - start, arrived, completed


def completed_fraction(request_metrics, warmup: int = 0) -> float:
    """Requests completed per request arrived over the arrival window of a run (``arrival_window``).

    Their difference is how much the backlog (requests arrived, not finished) grew over the window: an engine that
    keeps up completes about as many as arrive (about 1.0, either side by the requests in flight at the two ends),
    one that falls behind completes at its own pace while arrivals outrun it (completed rate / arrival rate).
    Judged over the arrival window, not first arrival -> last finish, so the drain after the last arrival does
    not count against a rate that was kept up with. 1.0 when no request arrives inside the window.

    Raises:
        ValueError: as ``arrival_window``.
    """
    _, arrived, completed = arrival_window(request_metrics, warmup)
    return completed / arrived if arrived else 1.0


@dataclass
class CapacityResult:
    """What the capacity search found.

    Attributes:
        capacity: the highest passing rate (req/s); 0.0 when every probed rate failed. Never above
            ``max_throughput``: an arrival rate the engine cannot complete is not sustained, however the
            first requests fare.
        slo: the objectives.
        probes: every probe in the order it ran.
        failing_rate: the lowest rate that failed (req/s); ``inf`` when none did. A probe fails on the SLO (too
            few requests met it, or the median queueing delay was too long) or on throughput (completions fell
            behind arrivals: ``CapacityProbe.sustained`` is false).
        clock_label: the clock the probes ran on ("modelled: H100 SXM, Llama-3-8B shapes", "measured: CPU time").
        max_throughput: the engine's maximum throughput measured in the same search (req/s): the probe's requests
            all at time 0 (a saturating run), completed requests / (first arrival -> last finish). NaN when not
            measured.
        peak_running: the most requests that saturating run had running at once (the engine's running slots as
            this workload fills them: ``max_num_seqs``, or fewer when the KV pool or token budget binds).
        num_requests: requests per probe; ``warmup_requests`` of them (the first by arrival) are not measured.
    """

    capacity: float
    slo: SLO
    probes: list[CapacityProbe] = field(default_factory=list)
    failing_rate: float = math.inf
    clock_label: str = ""
    max_throughput: float = math.nan
    peak_running: int = 0
    num_requests: int = 0
    warmup_requests: int = 0

    @property
    def bounded(self) -> bool:
        """True when a passing and a failing rate bracket the capacity (the SLO bounds it, as measured)."""
        return self.capacity > 0 and math.isfinite(self.failing_rate)

    @property
    def bound(self) -> str:
        """What bounds the number: ``"slo"`` (a passing and a failing rate bracket it, and the failing probe kept
        up with its arrivals but missed the SLO), ``"throughput"`` (the failing probe's completions fell behind its
        arrivals, or every rate up to the measured maximum throughput passed: the engine's throughput bounds it,
        not the SLO), ``"probes"`` (no failing rate within the probes run: a lower bound), ``"none"`` (no rate
        passed)."""
        if self.capacity <= 0:
            return "none"
        if math.isfinite(self.failing_rate):
            failing = next((p for p in self.probes if p.rate == self.failing_rate), None)
            return "throughput" if failing is not None and not failing.sustained else "slo"
        if math.isfinite(self.max_throughput) and self.capacity >= self.max_throughput * (1 - 1e-9):
            return "throughput"
        return "probes"

    @property
    def steady(self) -> bool:
        """True when each probe had at least ``STEADY_STATE_FACTOR`` requests per running slot
        (``peak_running``), so the measured requests after the warm-up met a steady state, not a burst."""
        return self.peak_running > 0 and self.num_requests >= STEADY_STATE_FACTOR * self.peak_running

    def describe(self) -> str:
        """The capacity and what bounds it, e.g. "12.3 req/s (between a passing and a failing probe)",
        "250 req/s (= the maximum throughput: every rate up to it met the SLO)", "≥ 12.3 req/s (no failing rate
        within 8 probes; maximum throughput 250 req/s)", "< 0.5 req/s (no passing rate found)"; then, when the
        probes were too short for a steady state, what they were."""
        bound, mu = self.bound, self.max_throughput
        if bound == "none":
            lowest = min((p.rate for p in self.probes), default=math.nan)
            text = f"< {_rate(lowest)} req/s (no passing rate found)"
        elif bound == "slo":
            text = f"{_rate(self.capacity)} req/s (the SLO bounds it: {_rate(self.failing_rate)} req/s failed)"
        elif bound == "throughput" and math.isfinite(self.failing_rate):
            text = (f"{_rate(self.capacity)} req/s (the engine's throughput bounds it, not the SLO: at "
                    f"{_rate(self.failing_rate)} req/s completions fell behind arrivals)")
        elif bound == "throughput":
            text = (f"{_rate(self.capacity)} req/s (= the maximum throughput: every rate up to it met the SLO, so "
                    "the engine's throughput bounds it, not the SLO)")
        else:
            most = f"; maximum throughput {_rate(mu)} req/s" if math.isfinite(mu) else ""
            text = f"≥ {_rate(self.capacity)} req/s (no failing rate within {len(self.probes)} probes{most})"
        if self.peak_running and not self.steady:
            text += (f"; probes of {self.num_requests} requests for {self.peak_running} running at once (under "
                     f"{STEADY_STATE_FACTOR} per slot): a transient, not a steady state")
        return text


def _rate(x: float) -> str:
    """A rate with 3 significant digits, without exponent notation."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def search_rate_bracket(passes: Callable[[float], bool], start_rate: float = 1.0, rel_tol: float = 0.1,
                        max_probes: int = 12, max_rate: float = math.inf) -> tuple[float, float]:
    """Bracket the threshold rate of a monotone load response: returns ``(lo, hi)``, the highest rate where
    ``passes(rate)`` held (0.0 if none) and the lowest where it failed (``inf`` if none).

    From ``start_rate`` it doubles while the probes pass (growing the load until one fails, up to ``max_rate``),
    or halves while they fail, then bisects geometrically until ``hi / lo <= 1 + rel_tol`` or ``max_probes``
    rates were tried. ``hi == inf`` means no failing rate was found within the limits: ``lo`` is then a lower
    bound only.

    Raises:
        ValueError: ``start_rate`` or ``rel_tol`` not > 0, ``max_probes`` < 1, ``max_rate`` < ``start_rate``.
    """
    if not start_rate > 0 or not rel_tol > 0 or max_probes < 1:
        raise ValueError(f"need start_rate > 0, rel_tol > 0, max_probes >= 1; got {start_rate}, {rel_tol}, "
                         f"{max_probes}")
    if not max_rate >= start_rate:
        raise ValueError(f"max_rate ({max_rate}) must be >= start_rate ({start_rate})")
    probes = 0

    def check(rate: float) -> bool:
        nonlocal probes
        probes += 1
        return passes(rate)

    lo, hi = 0.0, math.inf  # highest rate that passed, lowest that failed
    rate = start_rate
    while probes < max_probes:  # bracket the threshold: double while passing, halve while failing
        if check(rate):
            lo = rate
        else:
            hi = rate
        if lo > 0 and hi < math.inf:
            break
        if hi == math.inf:
            if rate >= max_rate:
                break  # passed at the limit: no failing rate within it
            rate = min(rate * 2, max_rate)
        else:
            rate = rate / 2
    while probes < max_probes and lo > 0 and hi < math.inf and hi / lo > 1 + rel_tol:
        mid = math.sqrt(lo * hi)
        if check(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def search_highest_passing_rate(passes: Callable[[float], bool], start_rate: float = 1.0, rel_tol: float = 0.1,
                                max_probes: int = 12) -> float:
    """The highest rate (> 0) where ``passes(rate)`` held, 0.0 if none did: ``search_rate_bracket(...)[0]``.
    Raises ``ValueError`` as ``search_rate_bracket``."""
    return search_rate_bracket(passes, start_rate, rel_tol, max_probes)[0]


def find_capacity(slo: SLO, config: EngineConfig | None = None, lengths: Sequence[TraceRequest] | None = None,
                  *, num_requests: int | None = None, start_rate: float | None = None, rel_tol: float = 0.1,
                  max_probes: int = 10, min_attainment: float = 0.9, max_median_queue_delay_s: float = 2.0,
                  warmup_fraction: float = WARMUP_FRACTION, seed: int = 0,
                  timer: Callable[[], float] = time.perf_counter, step_time_scale: float = 1.0,
                  clock: ClockChoice | None = None, max_rate: float = math.inf,
                  min_completed_fraction: float = MIN_COMPLETED_FRACTION, **config_fields) -> CapacityResult:
    """The highest Poisson arrival rate the engine sustains within ``slo`` (Sarathi-Serve's capacity).

    First a saturating run: the probe's requests all at time 0, on a fresh engine; its completed requests per
    second is the engine's maximum throughput for this workload (``CapacityResult.max_throughput``), and its most
    requests running at once are the running slots (``peak_running``). No arrival rate above that throughput can
    be sustained (the queue grows without end, however well the first requests fare), so the search stays at or
    below it. Then each probe replays ``num_requests`` requests with Poisson arrivals at the probed rate on a
    fresh engine with a fresh clock (``clock``: "modelled", "cpu", "perf", a ``ClockSpec`` or a clock factory;
    default a ``MeasuredClock`` on ``timer``). The first ``warmup_fraction`` of them (by arrival) meet an engine
    still filling up and are not measured; a probe passes when at least ``min_attainment`` of the others meet
    every SLO, their median scheduling delay (arrival -> first scheduled) is at most
    ``max_median_queue_delay_s`` (Sarathi-Serve bounds it at 2 s, so an overloaded system whose queue grows does
    not count), and the rate is sustained: over the measured arrival window the engine completed at least
    ``min_completed_fraction`` of the requests that arrived (``completed_fraction``), so its backlog did not grow;
    a short probe can meet a latency SLO while falling behind, a bounded median delay alone does not catch it.
    The search grows the rate from ``start_rate`` until a probe fails, then bisects
    (``search_rate_bracket``), never above ``min(max_rate, max_throughput)``; ``CapacityResult.bound`` says what
    bounds the answer (the SLO, the throughput, the probe budget) and ``steady`` whether each probe had at least
    ``STEADY_STATE_FACTOR`` requests per running slot (``describe()`` says so when not).

    The request lengths (and token ids, if any) come from ``lengths`` (e.g. a scaled Azure trace, cycled if
    shorter), else 64-token prompts and 32-token outputs. One seed gives the same arrival pattern at every rate
    (only compressed), so probes differ only in load.

    Args:
        slo: the latency objectives.
        config / **config_fields: the engine settings (one of the two).
        num_requests: requests per probe; None: ``STEADY_STATE_FACTOR`` x ``max_num_seqs`` (at least 16).
        start_rate: the first probed rate (req/s); None: half the maximum throughput.
        warmup_fraction: the share of each probe's first requests left out of its measurement, in [0, 1).
        timer, step_time_scale: passed to each probe's ``MeasuredClock`` when ``clock`` is None.
        clock: the clock of every run (see above).
        max_rate: the highest rate to probe, req/s (the maximum throughput caps it too).
        min_completed_fraction: the completions per arrival, over the measured window, that a sustained rate
            keeps (in (0, 1]; default ``MIN_COMPLETED_FRACTION``, 95 %).

    Returns:
        ``CapacityResult`` with the capacity (req/s), the maximum throughput and every probe.

    Raises:
        ValueError: bad arguments (naming them), and as ``replay``.
    """
    if config is not None and config_fields:
        raise ValueError("pass either config or EngineConfig fields, not both")
    config = config if config is not None else EngineConfig(**config_fields)
    if num_requests is None:
        num_requests = max(16, STEADY_STATE_FACTOR * config.max_num_seqs)
    if not isinstance(num_requests, int) or isinstance(num_requests, bool) or num_requests < 2:
        raise ValueError(f"num_requests must be an integer >= 2, got {num_requests!r}")
    if not 0 < min_attainment <= 1:
        raise ValueError(f"min_attainment must be in (0, 1], got {min_attainment!r}")
    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction!r}")
    if start_rate is not None and not start_rate > 0:
        raise ValueError(f"start_rate must be > 0 req/s or None, got {start_rate!r}")
    if not max_rate > 0:
        raise ValueError(f"max_rate must be > 0 req/s, got {max_rate!r}")
    if not 0 < min_completed_fraction <= 1:
        raise ValueError(f"min_completed_fraction must be in (0, 1], got {min_completed_fraction!r}")
    if lengths:
        base = [lengths[i % len(lengths)] for i in range(num_requests)]
        base = [TraceRequest(0.0, r.prompt_len, r.output_len, r.prompt_token_ids, f"{r.request_id}#{i}")
                for i, r in enumerate(base)]
    else:
        base = [TraceRequest(0.0, 64, 32, None, f"capacity-{i}") for i in range(num_requests)]
    if clock is None:
        def new_clock():
            return MeasuredClock(timer=timer, step_time_scale=step_time_scale)
    else:
        new_clock = clock_factory(clock)
    warmup = min(num_requests - 1, math.floor(warmup_fraction * num_requests))
    result = CapacityResult(capacity=0.0, slo=slo, num_requests=num_requests, warmup_requests=warmup)

    # the saturating run: every request at time 0
    burst = replay_trace(with_arrivals(base, [0.0] * num_requests, source="all at once"), config, clock=new_clock(),
                         seed=seed)
    result.clock_label = burst.clock_label
    result.max_throughput = ServingBenchmark.from_metrics(burst.request_metrics).request_throughput
    result.peak_running = max((tr.num_running for tr in burst.steps), default=0)
    if not result.max_throughput > 0:  # nothing finished, or in no time: no rate to search below
        return result
    limit = min(max_rate, result.max_throughput)
    start = min(start_rate if start_rate is not None else result.max_throughput / 2, limit)

    def passes(rate: float) -> bool:
        arrivals = poisson_arrivals(rate, num_requests, seed)
        trace = with_arrivals(base, arrivals, source=f"poisson({rate:g})")
        run = replay_trace(trace, config, clock=new_clock(), seed=seed)
        ms = run.request_metrics
        by_arrival = sorted(ms.values(), key=lambda m: m.arrival_time)
        measured = by_arrival[warmup:]
        delays = [m.time_in_queue for m in measured if m.time_in_queue is not None]
        attained = slo_attainment(measured, slo)
        delay = statistics.median(delays) if delays else math.inf
        seconds, arrived, completed = arrival_window(ms, warmup)
        kept_up = completed / arrived if arrived else 1.0   # completed_fraction
        sustained = kept_up >= min_completed_fraction
        ok = attained >= min_attainment and delay <= max_median_queue_delay_s and sustained
        result.probes.append(CapacityProbe(rate, attained, delay, goodput(ms, slo), ok,
                                           ServingBenchmark.from_metrics(ms).request_throughput, kept_up, sustained,
                                           arrived / seconds if seconds > 0 else math.nan))
        return ok

    result.capacity, result.failing_rate = search_rate_bracket(passes, start, rel_tol, max_probes, limit)
    return result
