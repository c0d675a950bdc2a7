"""Goodput and capacity planning on a fleet: searches over simulated runs.

- ``max_goodput``: DistServe's goodput (Zhong et al., OSDI 2024): the highest request rate a fleet serves within a
  ``PercentileSLO`` (P90 TTFT and P90 TPOT). The trace keeps its lengths and its arrival pattern; its arrivals
  are compressed by a factor k (``speed_up``), and k is searched by doubling, halving and geometric bisection
  (``minengine.workloads.search_rate_bracket``). Goodput = k x the trace's mean rate; per GPU = / GPUs.
- ``min_replicas``: capacity planning: the fewest replicas (``make_config(n)``) that serve a trace within the SLO,
  by doubling then bisection over n (the SLO is assumed to hold from some n on).

Every probe is a full, deterministic ``simulate`` run, so the searches are repeatable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from minengine.fleet.config import FleetConfig
from minengine.fleet.results import FleetResult, PercentileSLO
from minengine.fleet.simulator import simulate
from minengine.workloads.arrivals import speed_up
from minengine.workloads.goodput import search_rate_bracket
from minengine.workloads.traces import Trace, TraceRequest


@dataclass(frozen=True)
class Probe:
    """One simulated run of a search: its knob (rate multiplier or replicas), the P90s it measured (s), whether it
    met the SLO, and its own simulation cost."""

    value: float
    ttft_p: float
    tpot_p: float
    passed: bool
    num_steps: int
    cpu_time_s: float


def _probe(value: float, result: FleetResult, slo: PercentileSLO) -> Probe:
    return Probe(value, result.latency("ttft", slo.percentile), result.latency("tpot", slo.percentile),
                 result.meets_percentile_slo(slo), result.num_steps, result.cpu_time_s)


@dataclass
class GoodputResult:
    """What ``max_goodput`` found.

    Attributes:
        multiplier: the highest arrival-speed factor k that met the SLO (0.0 if none did).
        failing_multiplier: the lowest that failed (``inf`` if none did: the goodput is then a lower bound).
        base_rate: the trace's own mean rate, requests/s.
        num_gpus: GPUs of the fleet.
        probes: every probe in the order it ran.
    """

    multiplier: float
    failing_multiplier: float
    base_rate: float
    num_gpus: int
    slo: PercentileSLO
    probes: list[Probe] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        """Requests/s served within the SLO: ``multiplier x base_rate``."""
        return self.multiplier * self.base_rate

    @property
    def per_gpu(self) -> float:
        return self.goodput / self.num_gpus

    @property
    def bounded(self) -> bool:
        return self.multiplier > 0 and math.isfinite(self.failing_multiplier)

    @property
    def cpu_time_s(self) -> float:
        return sum(p.cpu_time_s for p in self.probes)


def max_goodput(trace: Trace | Sequence[TraceRequest], config: FleetConfig, slo: PercentileSLO, *,
                start_multiplier: float = 1.0, rel_tol: float = 0.05, max_probes: int = 12,
                max_multiplier: float = 1024.0) -> GoodputResult:
    """DistServe's goodput of ``config`` on ``trace``: the highest arrival speed-up within ``slo``.

    Raises:
        ValueError: a trace without a mean rate (fewer than 2 requests, no time span); as ``search_rate_bracket``.
    """
    trace = trace if isinstance(trace, Trace) else Trace(trace)
    base = trace.mean_rate
    if not base > 0:
        raise ValueError("the trace needs at least 2 requests over a time span to have a rate")
    out = GoodputResult(0.0, math.inf, base, config.num_gpus, slo)

    def passes(k: float) -> bool:
        probe = _probe(k, simulate(speed_up(trace, k), config), slo)
        out.probes.append(probe)
        return probe.passed

    out.multiplier, out.failing_multiplier = search_rate_bracket(passes, start_multiplier, rel_tol, max_probes,
                                                                 max_multiplier)
    return out


@dataclass
class ReplicaSearchResult:
    """What ``min_replicas`` found: the fewest replicas within the SLO (None if even ``max_replicas`` failed),
    its run, and every probe (value = replicas)."""

    num_replicas: int | None
    result: FleetResult | None
    slo: PercentileSLO
    probes: list[Probe] = field(default_factory=list)

    @property
    def cpu_time_s(self) -> float:
        return sum(p.cpu_time_s for p in self.probes)


def min_replicas(trace: Sequence[TraceRequest], make_config: Callable[[int], FleetConfig], slo: PercentileSLO, *,
                 start: int = 1, max_replicas: int = 512) -> ReplicaSearchResult:
    """The fewest replicas ``n`` for which ``simulate(trace, make_config(n))`` meets ``slo``.

    From ``start`` it doubles while the SLO fails (up to ``max_replicas``) or halves while it holds, then bisects
    between the largest failing and the smallest passing ``n``. Raises ``ValueError`` for ``start`` < 1 or
    ``max_replicas`` < ``start``.
    """
    if not 1 <= start <= max_replicas:
        raise ValueError(f"need 1 <= start <= max_replicas, got {start}, {max_replicas}")
    out = ReplicaSearchResult(None, None, slo)
    runs: dict[int, FleetResult] = {}

    def passes(n: int) -> bool:
        result = simulate(trace, make_config(n))
        probe = _probe(n, result, slo)
        out.probes.append(probe)
        if probe.passed:
            runs[n] = result
        return probe.passed

    lo, hi = 0, None  # largest failing, smallest passing
    n = start
    while True:
        if passes(n):
            hi = n
            if n == 1:
                break
            if lo:
                break
            n = max(1, n // 2)
            if n <= lo:
                break
        else:
            lo = n
            if hi is not None:
                break
            if n >= max_replicas:
                return out
            n = min(max_replicas, n * 2)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if passes(mid):
            hi = mid
        else:
            lo = mid
    out.num_replicas = hi
    out.result = runs[hi]
    return out
