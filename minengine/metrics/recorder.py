"""StepRecorder: what a step leaves behind besides its outputs, its ``StepTrace`` and the Prometheus series.

``LLMEngine`` calls it at fixed points and never reads it back: ``pool_state()`` when a step is scheduled,
``on_step`` after a step commits, ``on_rolled_back`` after a step fails, and ``on_requests_added`` /
``on_requests_finished`` / ``on_prefix_cache_reset`` for what happens between steps. Once a step has committed
nothing here may cost it its outputs: every ``on_*`` logs and counts a failure (``num_bookkeeping_errors``)
instead of raising.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from minengine.config import EngineConfig
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.scheduler import Scheduler
from minengine.core.scheduler_output import SchedulerOutput
from minengine.metrics.prometheus import PrometheusStatLogger
from minengine.metrics.trace import ScheduledChunk, StepTrace
from minengine.outputs import RequestMetrics
from minengine.request import Request

logger = logging.getLogger(__name__)


@dataclass
class PoolState:
    """The KV pool when a step was scheduled, which is what its forward pass used: free blocks, free blocks
    still holding a cached prefix, and (``trace_block_tables``) the block tables, ref counts and cached ids."""

    num_free_blocks: int
    num_cached_free_blocks: int
    block_snapshot: dict


@dataclass
class ScheduledStep:
    """A scheduled step until its output is committed or rolled back: its ``SchedulerOutput``, when it was
    scheduled (engine-clock seconds), the pool then, and the preemptions its trace counts."""

    scheduler_output: SchedulerOutput
    scheduled_at: float
    pool: PoolState
    preempted_ids: list[str] = field(default_factory=list)


class StepRecorder:
    """The engine's traces (``traces``: one ``StepTrace`` per step, ``num_steps`` recorded so far) and its
    Prometheus series (``stat_logger``; not updated with ``disable_log_stats``)."""

    def __init__(self, config: EngineConfig, scheduler: Scheduler, kv_cache_manager: KVCacheManager,
                 num_kv_blocks: int, num_swap_blocks: int, clock: Callable[[], float],
                 swap_time_s: Callable[[], float]):
        self.config, self.scheduler, self.kv_cache_manager = config, scheduler, kv_cache_manager
        self.num_kv_blocks, self.clock, self.swap_time_s = num_kv_blocks, clock, swap_time_s
        self.traces: list[StepTrace] = []
        self.num_steps = 0  # steps recorded so far (the next trace's ``step``), kept when old traces are dropped
        self.num_bookkeeping_errors = 0  # traces / statistics / final texts that failed after a step committed
        self.log_stats = not config.disable_log_stats
        self.stat_logger = PrometheusStatLogger(
            config.served_model_name, config.max_model_len,
            {"block_size": str(config.block_size), "num_gpu_blocks": str(num_kv_blocks),
             "num_cpu_blocks": str(num_swap_blocks), "enable_prefix_caching": str(config.enable_prefix_caching),
             "cache_dtype": config.dtype if config.kv_cache_dtype == "auto" else config.kv_cache_dtype},
            num_speculative_tokens=config.speculative_config.num_speculative_tokens if config.speculative_config else 0)
        self._record_state()

    def reset(self) -> None:
        """Forget the traces (the Prometheus totals count on, as vLLM's)."""
        self.traces = []
        self.num_steps = 0

    def pool_state(self) -> PoolState:
        """The pool now (call it right after scheduling a step: its trace shows what the forward used)."""
        kv = self.kv_cache_manager
        return PoolState(kv.num_free_blocks, kv.pool.num_cached_free_blocks,
                         self._block_snapshot() if self.config.trace_block_tables else {})

    def on_step(self, step: ScheduledStep, start: float, end: float, sampled: dict[str, list[int]],
                kept: dict[str, list[int]], got_token: list[Request], finished: list[Request],
                timed_out: list[Request], request_metrics: dict[str, RequestMetrics]) -> None:
        """A committed step: its trace (``start`` / ``end``: engine-clock seconds of the ``step()`` call that
        committed it; ``sampled`` / ``kept``: each sampling request's tokens as sampled and as kept up to a stop)
        and its statistics. Never raises."""
        try:
            self._record_step(step, start, end, sampled, got_token, finished, timed_out)
            num_new_tokens = ({rid: len(tokens) for rid, tokens in kept.items()}
                              if step.scheduler_output.num_spec_tokens else None)
            self._record_stats(self.traces[-1], got_token, timed_out + finished, request_metrics, num_new_tokens)
        except Exception:  # an observer failed: the step stands and its outputs go out
            self.num_bookkeeping_errors += 1
            logger.exception("step %d committed, but recording its trace or statistics failed", self.num_steps)

    def on_rolled_back(self, step: ScheduledStep, start: float, request_metrics: dict[str, RequestMetrics]) -> None:
        """The trace of a step that was rolled back: no chunk ran, but the preemptions made while scheduling it
        stand (the victims' blocks are gone), so they are counted like any other (trace, summary, Prometheus).
        Never raises: the step's own error is what the caller must see."""
        try:
            kv = self.kv_cache_manager
            self.traces.append(StepTrace(
                step=self.num_steps, start_time=start, end_time=self.clock(),
                token_budget=self.config.max_num_batched_tokens, chunks=[], num_running=self.scheduler.num_running,
                num_waiting=self.scheduler.num_waiting, num_free_blocks=kv.num_free_blocks,
                num_cached_free_blocks=kv.pool.num_cached_free_blocks, num_total_blocks=self.num_kv_blocks,
                preempted_ids=list(step.preempted_ids), admitted_ids=[], finished_ids=[], prefix_queried_tokens=0,
                prefix_hit_tokens=0, rolled_back=True,
                **(self._block_snapshot() if self.config.trace_block_tables else {})))
            self.num_steps += 1
            if self.log_stats:
                self.stat_logger.record_step(self.traces[-1], [], request_metrics)
        except Exception:
            self.num_bookkeeping_errors += 1
            logger.exception("recording the rolled-back step %d failed", self.num_steps)

    def on_requests_added(self, n: int, request_ids: list[str]) -> None:
        """A request queued (``n``: its ``SamplingParams.n``; ``request_ids``: its children's ids)."""
        if self.log_stats:
            self.stat_logger.record_new_request(n, request_ids)
            self._record_state(self.stat_logger.last_cached_free_blocks)  # queueing frees no block

    def on_requests_finished(self, finished: list[Request], request_metrics: dict[str, RequestMetrics]) -> None:
        """Requests finished outside a step's commit (aborted, or past their deadline with no step run)."""
        if self.log_stats:
            self._record_finished(finished, request_metrics)
            self._record_state()

    def on_running_preempted(self, num_preempted: int) -> None:
        """``num_preempted`` running requests were preempted outside a step (to reset the prefix cache)."""
        if self.log_stats:
            self.stat_logger.preemptions.inc(num_preempted)

    def on_prefix_cache_reset(self) -> None:
        self._record_state()

    def on_finished_without_step(self, finished: list[Request], request_metrics: dict[str, RequestMetrics]) -> None:
        """Requests past their deadline, delivered by a step that ran nothing."""
        self._record_stats(None, [], finished, request_metrics, None)

    def _record_step(self, step: ScheduledStep, start: float, end: float, sampled: dict[str, list[int]],
                     got_token: list[Request], finished: list[Request], timed_out: list[Request]) -> None:
        out = step.scheduler_output
        timed_out_ids = [r.request_id for r in timed_out]
        self.traces.append(StepTrace(
            step=self.num_steps, start_time=start, end_time=end,
            token_budget=self.config.max_num_batched_tokens,
            chunks=[ScheduledChunk(s.request_id, s.num_new_tokens, s.start_pos, s.is_prefill, s.sample)
                    if not s.spec_token_ids else
                    ScheduledChunk(s.request_id, s.num_new_tokens, s.start_pos, s.is_prefill, s.sample,
                                   s.num_spec_tokens, len(sampled[s.request_id]) - 1)
                    for s in out.scheduled],
            num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
            num_free_blocks=step.pool.num_free_blocks, num_cached_free_blocks=step.pool.num_cached_free_blocks,
            num_total_blocks=self.num_kv_blocks,
            preempted_ids=step.preempted_ids, admitted_ids=out.admitted_ids,
            finished_ids=timed_out_ids + [r.request_id for r in finished],
            prefix_queried_tokens=out.prefix_queried_tokens, prefix_hit_tokens=out.prefix_hit_tokens,
            readmission_hit_tokens=out.readmission_hit_tokens,
            num_swapped_out_blocks=len(out.blocks_to_swap_out), num_swapped_in_blocks=len(out.blocks_to_swap_in),
            swap_time_s=self.swap_time_s(), timed_out_ids=timed_out_ids,
            **step.pool.block_snapshot,
        ))
        self.num_steps += 1

    def _record_stats(self, trace: StepTrace | None, got_token: list[Request], finished: list[Request],
                      request_metrics: dict[str, RequestMetrics], num_new_tokens: dict[str, int] | None) -> None:
        """Update the Prometheus series after a step (``num_new_tokens``: tokens per request when a request got
        more than one, with speculative decoding)."""
        if not self.log_stats:
            return
        self.stat_logger.record_step(trace, got_token, request_metrics, num_new_tokens)
        self._record_finished(finished, request_metrics)
        # Without finished requests no block was freed after scheduling: the trace's count is still exact.
        self._record_state(trace.num_cached_free_blocks if trace is not None and not finished else None)

    def _record_finished(self, finished: list[Request], request_metrics: dict[str, RequestMetrics]) -> None:
        """The Prometheus series of finished requests, one at a time: one request's statistics failing is logged
        and counted (``num_bookkeeping_errors``) and costs neither the others theirs nor anyone an output."""
        for r in finished:
            try:
                self.stat_logger.record_finished(
                    [(request_metrics[r.request_id], r.sampling_params.max_tokens, r.request_id)])
            except Exception:
                self.num_bookkeeping_errors += 1
                logger.exception("request %r: recording its statistics failed", r.request_id)

    def _record_state(self, num_cached_free_blocks: int | None = None) -> None:
        """Queue and pool gauges. ``num_cached_free_blocks`` saves a scan of the free queue when the caller
        knows it (None: count now)."""
        if not self.log_stats:
            return
        s, kv = self.scheduler, self.kv_cache_manager
        if num_cached_free_blocks is None:
            num_cached_free_blocks = kv.pool.num_cached_free_blocks
        self.stat_logger.record_state(s.num_running, s.num_waiting, s.num_swapped,
                                      kv.num_free_blocks, num_cached_free_blocks, self.num_kv_blocks)

    def _block_snapshot(self) -> dict:
        pool = self.kv_cache_manager.pool
        return {
            "block_tables": {r.request_id: self.kv_cache_manager.get_block_ids(r.request_id)
                             for r in self.scheduler.running},
            "block_ref_counts": pool.ref_counts(),
            "cached_block_ids": [b.block_id for b in pool.blocks if b.block_hash is not None],
        }
