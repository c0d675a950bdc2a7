"""PrometheusRecorder: the ``StepRecorder`` that also keeps vLLM's Prometheus series up to date.

``make_recorder`` picks it when the engine is built, unless ``disable_log_stats`` (which the offline ``LLM``
sets by default, as vLLM's; the server keeps the series for ``/metrics``). It fills the recorder's
statistics hooks: after each step (committed or rolled back), when requests are added or finish between steps,
and when the pool changes outside a step. Like the traces, a statistic that fails is logged and counted
(``num_bookkeeping_errors``), never raised into a step that committed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from minengine.config import EngineConfig
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.scheduler import Scheduler
from minengine.metrics.prometheus import PrometheusStatLogger
from minengine.metrics.recorder import ScheduledStep, StepRecorder
from minengine.metrics.trace import StepTrace
from minengine.outputs import RequestMetrics
from minengine.request import Request

logger = logging.getLogger(__name__)


def make_recorder(config: EngineConfig, scheduler: Scheduler, kv_cache_manager: KVCacheManager, num_kv_blocks: int,
                  num_swap_blocks: int, clock: Callable[[], float], swap_time_s: Callable[[], float]) -> StepRecorder:
    """The engine's recorder: a ``PrometheusRecorder``, or with ``disable_log_stats`` a plain ``StepRecorder``
    (its ``stat_logger``'s series are still there for ``/metrics``, at their starting values).

    Args:
        num_kv_blocks, num_swap_blocks: the pool's sizes in blocks (``cache_config_info``'s labels).
        clock: the engine's clock, in seconds.
        swap_time_s: the runner's seconds spent on the last step's swap copies.
    """
    stat_logger = PrometheusStatLogger(
        config.served_model_name, config.max_model_len,
        {"block_size": str(config.block_size), "num_gpu_blocks": str(num_kv_blocks),
         "num_cpu_blocks": str(num_swap_blocks), "enable_prefix_caching": str(config.enable_prefix_caching),
         "cache_dtype": config.dtype if config.kv_cache_dtype == "auto" else config.kv_cache_dtype},
        num_speculative_tokens=config.speculative_config.num_speculative_tokens if config.speculative_config else 0)
    recorder_class = StepRecorder if config.disable_log_stats else PrometheusRecorder
    return recorder_class(config, scheduler, kv_cache_manager, num_kv_blocks, clock, swap_time_s, stat_logger)


class PrometheusRecorder(StepRecorder):
    """The traces, and the Prometheus series (``stat_logger``: vLLM's names) updated at every hook."""

    log_stats = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._record_state()

    def on_requests_added(self, n: int, request_ids: list[str]) -> None:
        self.stat_logger.record_new_request(n, request_ids)
        self._record_state(self.stat_logger.last_cached_free_blocks)  # queueing frees no block

    def on_requests_finished(self, finished: list[Request], request_metrics: dict[str, RequestMetrics]) -> None:
        self._record_finished(finished, request_metrics)
        self._record_state()

    def on_running_preempted(self, num_preempted: int) -> None:
        self.stat_logger.preemptions.inc(num_preempted)

    def on_prefix_cache_reset(self) -> None:
        self._record_state()

    def on_finished_without_step(self, finished: list[Request], request_metrics: dict[str, RequestMetrics]) -> None:
        self._record_stats(None, [], finished, request_metrics, None)

    def _on_step_recorded(self, step: ScheduledStep, kept: dict[str, list[int]], got_token: list[Request],
                          finished: list[Request], request_metrics: dict[str, RequestMetrics]) -> None:
        num_new_tokens = ({rid: len(tokens) for rid, tokens in kept.items()}
                          if step.scheduler_output.num_spec_tokens else None)
        self._record_stats(self.traces[-1], got_token, finished, request_metrics, num_new_tokens)

    def _on_rolled_back_recorded(self, request_metrics: dict[str, RequestMetrics]) -> None:
        self.stat_logger.record_step(self.traces[-1], [], request_metrics)

    def _record_stats(self, trace: StepTrace | None, got_token: list[Request], finished: list[Request],
                      request_metrics: dict[str, RequestMetrics], num_new_tokens: dict[str, int] | None) -> None:
        """Update the Prometheus series after a step (``num_new_tokens``: tokens per request when a request got
        more than one, with speculative decoding)."""
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
        s, kv = self.scheduler, self.kv_cache_manager
        if num_cached_free_blocks is None:
            num_cached_free_blocks = kv.pool.num_cached_free_blocks
        self.stat_logger.record_state(s.num_running, s.num_waiting, s.num_swapped,
                                      kv.num_free_blocks, num_cached_free_blocks, self.num_kv_blocks)
