"""StepRecorder: what a step leaves behind besides its outputs, its ``StepTrace``.

``LLMEngine`` calls it at fixed points and never reads it back: ``pool_state()`` when a step is scheduled,
``on_step`` after a step commits, ``on_rolled_back`` after a step fails, and ``on_requests_added`` /
``on_requests_finished`` / ``on_prefix_cache_reset`` for what happens between steps. Once a step has committed
nothing here may cost it its outputs: every ``on_*`` logs and counts a failure (``num_bookkeeping_errors``)
instead of raising.

The Prometheus series are a subclass's (``PrometheusRecorder``, ``metrics/prometheus_recorder.py``): the
recorder ``make_recorder`` builds unless ``disable_log_stats``. Here the statistics hooks do nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from minengine.config import EngineConfig
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.scheduler import Scheduler
from minengine.core.scheduler_output import SchedulerOutput
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
    """The engine's traces (``traces``: one ``StepTrace`` per step, ``num_steps`` recorded so far).

    ``stat_logger`` is the engine's Prometheus series (``/metrics``, ``get_metrics``), held for the engine:
    this class never updates them (``log_stats`` False: ``disable_log_stats``); ``PrometheusRecorder`` does.
    """

    log_stats = False

    def __init__(self, config: EngineConfig, scheduler: Scheduler, kv_cache_manager: KVCacheManager,
                 num_kv_blocks: int, clock: Callable[[], float], swap_time_s: Callable[[], float], stat_logger):
        self.config, self.scheduler, self.kv_cache_manager = config, scheduler, kv_cache_manager
        self.num_kv_blocks, self.clock, self.swap_time_s = num_kv_blocks, clock, swap_time_s
        self.stat_logger = stat_logger
        self.traces: list[StepTrace] = []
        self.num_steps = 0  # steps recorded so far (the next trace's ``step``), kept when old traces are dropped
        self.num_bookkeeping_errors = 0  # traces / statistics / final texts that failed after a step committed

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
            self._on_step_recorded(step, kept, got_token, timed_out + finished, request_metrics)
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
            self._on_rolled_back_recorded(request_metrics)
        except Exception:
            self.num_bookkeeping_errors += 1
            logger.exception("recording the rolled-back step %d failed", self.num_steps)

    def on_requests_added(self, n: int, request_ids: list[str]) -> None:
        """A request queued (``n``: its ``SamplingParams.n``; ``request_ids``: its children's ids)."""

    def on_requests_finished(self, finished: list[Request], request_metrics: dict[str, RequestMetrics]) -> None:
        """Requests finished outside a step's commit (aborted, or past their deadline with no step run)."""

    def on_running_preempted(self, num_preempted: int) -> None:
        """``num_preempted`` running requests were preempted outside a step (to reset the prefix cache)."""

    def on_prefix_cache_reset(self) -> None:
        """Every cached prefix was forgotten."""

    def on_finished_without_step(self, finished: list[Request], request_metrics: dict[str, RequestMetrics]) -> None:
        """Requests past their deadline, delivered by a step that ran nothing."""

    def _on_step_recorded(self, step: ScheduledStep, kept: dict[str, list[int]], got_token: list[Request],
                          finished: list[Request], request_metrics: dict[str, RequestMetrics]) -> None:
        """The statistics of a committed step, whose trace is ``self.traces[-1]`` (``finished``: those that
        timed out, then those that stopped)."""

    def _on_rolled_back_recorded(self, request_metrics: dict[str, RequestMetrics]) -> None:
        """The statistics of a rolled-back step, whose trace is ``self.traces[-1]``."""

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

    def _block_snapshot(self) -> dict:
        return self.kv_cache_manager.block_snapshot([r.request_id for r in self.scheduler.running])
