"""Synthetic arrival processes (Poisson, bursty gamma) and re-timing of traces.

Inter-arrival gaps are drawn at unit rate and divided by ``rate``, so for one seed the arrival pattern is the
same at every rate, only compressed or stretched ("common random numbers"): a capacity search comparing
rates then compares loads, not two different random draws. A gamma process with coefficient of variation
``cv`` (std / mean of the gaps) is Poisson at ``cv = 1``, burstier above, more regular below; vLLM's serving
benchmark calls the gamma shape ``1 / cv**2`` its "burstiness".
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from minengine.workloads.traces import Trace, TraceRequest


def _check_rate(rate: float, allow_inf: bool = False) -> None:
    if not isinstance(rate, (int, float)) or isinstance(rate, bool) or not rate > 0 or math.isnan(rate) \
            or (math.isinf(rate) and not allow_inf):
        raise ValueError(f"rate must be a number > 0 (requests/s){' or inf' if allow_inf else ''}, got {rate!r}")


CV_RANGE = (1e-3, 1e3)  # beyond it gamma gaps underflow to all-zero or the shape over/underflows


def _check_count(num_requests: int) -> None:
    if not isinstance(num_requests, int) or isinstance(num_requests, bool) or num_requests < 0:
        raise ValueError(f"num_requests must be an integer >= 0, got {num_requests!r}")


def gamma_arrivals(rate: float, cv: float, num_requests: int, seed: int = 0) -> list[float]:
    """Arrival times (seconds, first at 0, non-decreasing) of a renewal process with gamma gaps.

    The gaps have mean ``1 / rate`` and coefficient of variation ``cv``: shape ``k = 1 / cv**2``,
    scale ``1 / (rate k)``. ``cv = 1`` is a Poisson process; ``cv > 1`` bursty; ``rate = inf`` puts every
    request at time 0 (vLLM's ``--request-rate inf``).

    Raises:
        ValueError: ``rate`` not > 0, ``cv`` outside [0.001, 1000] (where gamma sampling stays meaningful in
            floating point), ``num_requests`` < 0, or a rate so small that the times overflow.
    """
    _check_rate(rate, allow_inf=True)
    _check_count(num_requests)
    lo, hi = CV_RANGE
    if not isinstance(cv, (int, float)) or isinstance(cv, bool) or not lo <= cv <= hi:
        raise ValueError(f"cv must be a number in [{lo:g}, {hi:g}] (std/mean of the inter-arrival gaps), got {cv!r}")
    if math.isinf(rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    shape = 1.0 / cv**2
    times, t = [], 0.0
    for i in range(num_requests):
        if i:
            t += rng.gammavariate(shape, 1.0 / shape) / rate  # a unit-mean gap, then scaled to the rate
        times.append(t)
    if times and not math.isfinite(times[-1]):
        raise ValueError(f"rate {rate!r} is too small: the arrival times overflow")
    return times


def poisson_arrivals(rate: float, num_requests: int, seed: int = 0) -> list[float]:
    """Arrival times (seconds, first at 0) of a Poisson process of ``rate`` requests/s: exponential gaps.
    ``rate = inf``: all at 0. Raises ``ValueError`` for a rate not > 0 or a negative count."""
    _check_rate(rate, allow_inf=True)
    _check_count(num_requests)
    if math.isinf(rate):
        return [0.0] * num_requests
    rng = random.Random(seed)
    times, t = [], 0.0
    for i in range(num_requests):
        if i:
            t += rng.expovariate(1.0) / rate
        times.append(t)
    if times and not math.isfinite(times[-1]):
        raise ValueError(f"rate {rate!r} is too small: the arrival times overflow")
    return times


def inter_arrival_stats(times: Sequence[float]) -> tuple[float, float]:
    """(mean rate in requests/s, coefficient of variation of the gaps) of sorted arrival times.
    Raises ``ValueError`` with fewer than 3 times or no time span."""
    if len(times) < 3:
        raise ValueError(f"need at least 3 arrival times, got {len(times)}")
    gaps = [b - a for a, b in zip(times[:-1], times[1:])]
    mean = sum(gaps) / len(gaps)
    if mean <= 0:
        raise ValueError("arrival times span no time")
    var = sum((g - mean) ** 2 for g in gaps) / (len(gaps) - 1)
    return 1.0 / mean, math.sqrt(var) / mean


def with_arrivals(trace: Sequence[TraceRequest], arrival_times: Sequence[float], source: str | None = None) -> Trace:
    """The same requests (lengths, token ids, request ids, in order) at new arrival times.

    Used to replay a real trace's length distribution under a synthetic arrival process (Sarathi-Serve's
    capacity runs do this) or at a different rate. Raises ``ValueError`` when the lengths differ or the
    times are not finite numbers >= 0 in non-decreasing order.
    """
    arrival_times = list(arrival_times)
    if len(arrival_times) != len(trace):
        raise ValueError(f"arrival_times has {len(arrival_times)} entries, the trace {len(trace)} requests")
    for i, t in enumerate(arrival_times):
        if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t) or t < 0:
            raise ValueError(f"arrival_times[{i}] must be a finite number >= 0 (seconds), got {t!r}")
    if any(b < a for a, b in zip(arrival_times[:-1], arrival_times[1:])):
        raise ValueError("arrival_times must be non-decreasing (seconds)")
    reqs = [TraceRequest(float(t), r.prompt_len, r.output_len, r.prompt_token_ids, r.request_id)
            for r, t in zip(trace, arrival_times)]
    if isinstance(trace, Trace):
        return trace.with_requests(reqs, source=source)
    return Trace(reqs, source=source or "")


def speed_up(trace: Trace, factor: float) -> Trace:
    """The trace with every arrival time divided by ``factor`` (2 = twice the request rate, same pattern).
    Raises ``ValueError`` for a factor not > 0."""
    _check_rate(factor)
    return with_arrivals(trace, [r.arrival_time / factor for r in trace],
                         source=f"{trace.source} (arrivals x{factor:g} faster)")


def synthetic_trace(num_requests: int, rate: float, cv: float = 1.0, prompt_len: int = 64, output_len: int = 32,
                    range_ratio: float = 0.0, seed: int = 0) -> Trace:
    """A synthetic trace: gamma arrivals (Poisson at ``cv = 1``) and uniform lengths, like vLLM's ``random``
    dataset: each length uniform in ``[len (1 - range_ratio), len (1 + range_ratio)]``, at least 1.
    ``prompt_token_ids`` stay None (synthesized at replay). Raises ``ValueError`` naming a bad argument."""
    for name, v in (("prompt_len", prompt_len), ("output_len", output_len)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer (tokens), got {v!r}")
    if not isinstance(range_ratio, (int, float)) or not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio!r}")
    times = gamma_arrivals(rate, cv, num_requests, seed)
    rng = random.Random(f"lengths:{seed}")

    def draw(n: int) -> int:
        return max(1, rng.randint(round(n * (1 - range_ratio)), round(n * (1 + range_ratio))))

    reqs = [TraceRequest(t, draw(prompt_len), draw(output_len), None, f"synthetic-{i}") for i, t in enumerate(times)]
    kind = "poisson" if cv == 1 else f"gamma(cv={cv:g})"
    return Trace(reqs, source=f"{kind} rate={rate:g} req/s, prompt {prompt_len}, output {output_len} tokens")
