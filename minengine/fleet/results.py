"""What a fleet run measured: every request's ``RequestMetrics`` (from the engines), per-replica counters and
timelines, KV transfers, and the numbers the fleet questions are asked in.

- Latencies are the engines' own (TTFT, TPOT, ITLs); a disaggregated request's metrics join its prefill replica's
  (arrival, first token) and its decode replica's (later tokens); the second token's gap includes the transfer.
- ``meets_percentile_slo``: DistServe's SLO (Zhong et al., OSDI 2024): the P90 TTFT and the P90 TPOT of the run
  within their bounds (``PercentileSLO``).
- ``prefix_hit_rate``: prompt tokens served from the prefix caches of the first-stage replicas (those that
  prefill: "mixed" or "prefill") over the prompt tokens they looked up; with a KV store this includes the blocks
  loaded from it (they enter the replica's prefix cache), and ``store_hit_rate`` is their share alone.
- ``load_imbalance``: max over mean of the busy time (seconds spent in steps) of a stage's replicas: 1.0 is a
  perfectly even load; 2.0 means the busiest replica worked twice the average.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from minengine.fleet.config import FleetConfig
from minengine.fleet.kv_store import StoreStats
from minengine.metrics.stats import ServingSummary, percentile, summarize
from minengine.outputs import RequestMetrics
from minengine.timing.hardware import get_hardware
from minengine.workloads.goodput import SLO, slo_attainment


@dataclass(frozen=True)
class PercentileSLO:
    """DistServe's latency objective: the ``percentile``-th TTFT and TPOT of a run within their bounds (seconds).

    DistServe (Zhong et al., OSDI 2024, section 2) sets, per application, a TTFT and a TPOT bound and calls a
    rate served when 90 % of requests meet them; its figures use the P90 of each. A bound of None is left out.

    Raises:
        ValueError: a bound that is not > 0, a percentile outside (0, 100].
    """

    ttft_s: float | None = None
    tpot_s: float | None = None
    percentile: float = 90.0

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0):
                raise ValueError(f"{name} must be a number > 0 (seconds) or None, got {v!r}")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile!r}")

    def __str__(self) -> str:
        q = f"P{self.percentile:g}"
        parts = [f"{q} {name} <= {v * 1000:g} ms" for name, v in (("TTFT", self.ttft_s), ("TPOT", self.tpot_s))
                 if v is not None]
        return ", ".join(parts) or "no SLO"

    def per_request(self) -> SLO:
        """The same bounds per request (``minengine.workloads.SLO``), for attainment and goodput."""
        return SLO(ttft_s=self.ttft_s, tpot_s=self.tpot_s)


@dataclass
class TransferStats:
    """KV transfers of a disaggregated run: count, bytes, and seconds waiting for the link and moving."""

    count: int = 0
    bytes: float = 0.0
    total_wait_s: float = 0.0
    total_time_s: float = 0.0
    max_time_s: float = 0.0

    def add(self, num_bytes: float, wait_s: float, time_s: float) -> None:
        self.count += 1
        self.bytes += num_bytes
        self.total_wait_s += wait_s
        self.total_time_s += time_s
        self.max_time_s = max(self.max_time_s, time_s)

    @property
    def mean_time_s(self) -> float:
        return self.total_time_s / self.count if self.count else 0.0

    @property
    def mean_wait_s(self) -> float:
        return self.total_wait_s / self.count if self.count else 0.0


@dataclass
class ReplicaStats:
    """One replica over the run (see ``Replica``): counters, and its sampled timeline (seconds, blocks,
    requests) for drawing lanes."""

    index: int
    role: str
    hardware: str
    tp: int
    label: str
    num_kv_blocks: int
    num_steps: int
    busy_time_s: float
    num_requests: int
    num_prefill_tokens: int
    num_decode_tokens: int
    prefix_queried_tokens: int
    prefix_hit_tokens: int
    num_preemptions: int
    peak_used_blocks: int
    times: list[float] = field(default_factory=list, repr=False)
    used_blocks: list[int] = field(default_factory=list, repr=False)
    running: list[int] = field(default_factory=list, repr=False)
    waiting: list[int] = field(default_factory=list, repr=False)


def replica_stats(replica) -> ReplicaStats:
    """A ``ReplicaStats`` snapshot of a ``Replica``."""
    tl = replica.timeline
    return ReplicaStats(
        index=replica.index, role=replica.role, hardware=get_hardware(replica.spec.hardware).name,
        tp=replica.spec.tp, label=replica.label, num_kv_blocks=replica.num_kv_blocks, num_steps=replica.num_steps,
        busy_time_s=replica.busy_time_s, num_requests=replica.num_requests,
        num_prefill_tokens=replica.num_prefill_tokens, num_decode_tokens=replica.num_decode_tokens,
        prefix_queried_tokens=replica.prefix_queried_tokens, prefix_hit_tokens=replica.prefix_hit_tokens,
        num_preemptions=replica.num_preemptions, peak_used_blocks=replica.peak_used_blocks,
        times=list(tl.times), used_blocks=list(tl.used_blocks), running=list(tl.running), waiting=list(tl.waiting))


def _ratio_max_mean(values: list[float]) -> float:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else math.nan


@dataclass
class FleetResult:
    """A fleet run.

    Attributes:
        config: the fleet.
        request_metrics: per request id (trace order), its ``RequestMetrics`` (seconds on the fleet's clock).
        replicas: ``ReplicaStats`` per replica, in index order.
        transfers: KV transfers (disaggregated).
        num_steps: engine steps over all replicas.
        num_clipped: requests cut to fit ``max_model_len`` or the largest KV pool.
        cpu_time_s, wall_time_s: what the simulation itself took on this machine (CPU time of this process;
            real time).
        assignments: per request id, (first-stage replica, decode replica or -1).
        router_counts: the first-stage router's own counters (``prefix-aware``: by cache / by load;
            ``conductor``: by store).
        store: the KV store's ``StoreStats`` (loads, writes, bytes, evictions, timeline), None without a store.
    """

    config: FleetConfig
    request_metrics: dict[str, RequestMetrics]
    replicas: list[ReplicaStats]
    transfers: TransferStats
    num_steps: int
    num_clipped: int
    cpu_time_s: float
    wall_time_s: float
    assignments: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)
    router_counts: dict[str, int] = field(default_factory=dict)
    store: StoreStats | None = None

    # ---- speed of the simulation itself -------------------------------------------------------------------
    @property
    def steps_per_second(self) -> float:
        """Simulated engine steps per second of CPU time."""
        return self.num_steps / self.cpu_time_s if self.cpu_time_s > 0 else math.nan

    # ---- latency ----------------------------------------------------------------------------------------
    def _values(self, metric: str) -> list[float]:
        ms = self.request_metrics.values()
        if metric == "ttft":
            return [m.ttft for m in ms if m.ttft is not None]
        if metric == "tpot":
            return [m.tpot for m in ms if m.tpot is not None]
        if metric == "e2e":
            return [m.e2e_latency for m in ms if m.e2e_latency is not None]
        if metric == "itl":
            return [x for m in ms for x in m.itls]
        raise ValueError(f"metric must be 'ttft', 'tpot', 'e2e' or 'itl', got {metric!r}")

    def latency(self, metric: str, q: float) -> float:
        """The ``q``-th percentile (0-100) of ``metric`` ("ttft", "tpot", "e2e", "itl") over the run, seconds."""
        return percentile(self._values(metric), q)

    def meets_percentile_slo(self, slo: PercentileSLO) -> bool:
        """True when the run's ``slo.percentile``-th TTFT and TPOT are within the bounds (DistServe)."""
        for metric, bound in (("ttft", slo.ttft_s), ("tpot", slo.tpot_s)):
            if bound is not None:
                value = self.latency(metric, slo.percentile)
                if not value <= bound:  # NaN (no values) fails
                    return False
        return True

    def attainment(self, slo: PercentileSLO | SLO) -> float:
        """Share of requests within every bound of ``slo`` (per request)."""
        per_request = slo.per_request() if isinstance(slo, PercentileSLO) else slo
        return slo_attainment(self.request_metrics, per_request)

    @property
    def duration_s(self) -> float:
        """First arrival to last finish, seconds (simulated)."""
        ms = list(self.request_metrics.values())
        if not ms:
            return 0.0
        return max(m.finished_time for m in ms) - min(m.arrival_time for m in ms)

    # ---- the fleet ----------------------------------------------------------------------------------------
    def stage(self, role: str | None = None) -> list[ReplicaStats]:
        """Replicas of ``role`` ("mixed", "prefill", "decode"); None: the first stage ("mixed" or "prefill")."""
        if role is None:
            role = "prefill" if self.config.is_disaggregated else "mixed"
        return [r for r in self.replicas if r.role == role]

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens served by the first stage's prefix caches over those looked up (0 with no lookups)."""
        stage = self.stage()
        queried = sum(r.prefix_queried_tokens for r in stage)
        return sum(r.prefix_hit_tokens for r in stage) / queried if queried else 0.0

    @property
    def prefix_queried_tokens(self) -> int:
        """Prompt tokens the first stage looked up in its prefix caches (each request's prompt once)."""
        return sum(r.prefix_queried_tokens for r in self.stage())

    @property
    def store_hit_rate(self) -> float:
        """Prompt tokens served from blocks loaded from the KV store, over those looked up (0 without a store)."""
        queried = self.prefix_queried_tokens
        return self.store.used_tokens / queried if self.store is not None and queried else 0.0

    @property
    def bytes_moved(self) -> float:
        """Bytes over the fleet's links: KV store loads and writes, and disaggregated KV transfers."""
        store = self.store.loaded_bytes + self.store.written_bytes if self.store is not None else 0.0
        return store + self.transfers.bytes

    def load_imbalance(self, role: str | None = None) -> float:
        """Max over mean busy time of the replicas of ``role`` (default: the first stage); NaN if all idle."""
        return _ratio_max_mean([r.busy_time_s for r in self.stage(role)])

    def utilization(self, role: str | None = None) -> float:
        """Mean busy share of the replicas of ``role`` (default: the first stage) over the run's duration."""
        stage, duration = self.stage(role), self.duration_s
        return sum(r.busy_time_s for r in stage) / (len(stage) * duration) if stage and duration > 0 else math.nan

    def summary(self) -> ServingSummary:
        """The engine's ``ServingSummary`` over all requests (TTFT/TPOT/ITL percentiles, throughput), with the
        step counters of all replicas (steps, preemptions, first-stage prefix hits) and the fullest replica's
        peak KV use."""
        s = summarize(list(self.request_metrics.values()), [], 0)
        stage = self.stage()
        queried = sum(r.prefix_queried_tokens for r in stage)
        hit = sum(r.prefix_hit_tokens for r in stage)
        fullest = max(self.replicas, key=lambda r: r.peak_used_blocks / r.num_kv_blocks)
        return dataclasses.replace(
            s, num_steps=self.num_steps, num_preemptions=sum(r.num_preemptions for r in self.replicas),
            prefix_queried_tokens=queried, prefix_hit_tokens=hit, prefix_hit_rate=hit / queried if queried else 0.0,
            peak_kv_blocks_used=fullest.peak_used_blocks, num_kv_blocks=fullest.num_kv_blocks)

    def describe(self) -> str:
        """A few lines: the fleet, the latencies, the fleet counters and the simulation's own speed."""
        ms = 1000
        lines = [self.config.describe(),
                 f"{len(self.request_metrics)} requests ({self.num_clipped} clipped), {self.duration_s:.1f} s "
                 f"simulated, {self.num_steps:,} steps",
                 f"TTFT P50/P90/P99 {self.latency('ttft', 50) * ms:.0f} / {self.latency('ttft', 90) * ms:.0f} / "
                 f"{self.latency('ttft', 99) * ms:.0f} ms; TPOT P50/P90/P99 {self.latency('tpot', 50) * ms:.1f} / "
                 f"{self.latency('tpot', 90) * ms:.1f} / {self.latency('tpot', 99) * ms:.1f} ms",
                 f"prefix hit rate {self.prefix_hit_rate:.1%}, load imbalance {self.load_imbalance():.2f}, "
                 f"utilization {self.utilization():.0%}"]
        if self.transfers.count:
            lines.append(f"KV transfers: {self.transfers.count:,}, {self.transfers.bytes / 1e9:,.1f} GB, mean "
                         f"{self.transfers.mean_time_s * ms:.2f} ms (+{self.transfers.mean_wait_s * ms:.2f} ms "
                         "waiting for the link)")
        if self.store is not None:
            st = self.store
            lines.append(f"KV store: {self.store_hit_rate:.1%} of prompt tokens served from it; {st.num_loads:,} loads "
                         f"({st.loaded_bytes / 1e9:,.1f} GB, {st.declined_loads:,} declined: recomputing was cheaper), "
                         f"{st.written_bytes / 1e9:,.1f} GB written, {st.dropped_blocks:,} blocks evicted")
        lines.append(f"simulation: {self.cpu_time_s:.1f} s CPU, {self.steps_per_second:,.0f} steps/s")
        return "\n".join(lines)
