"""EngineStatistics: what an ``LLMEngine`` reports about the requests and steps it has served, for its caller
between steps (no step reads it): the ``StepTrace``s, the serving summary (TTFT, TPOT, throughput...) and vLLM's
``get_metrics`` snapshot of the Prometheus series.
"""

from __future__ import annotations

from minengine.metrics.reader import Metric, get_metrics_snapshot
from minengine.metrics.stats import ServingSummary, summarize


class EngineStatistics:
    """``LLMEngine``'s reports, a base class of it: they read what the engine keeps (``recorder``,
    ``detokenizers``, ``request_metrics`` and the finished requests' ``_past_metrics``, ``scheduler``,
    ``num_kv_blocks``, ``stat_logger`` / ``log_stats``)."""

    @property
    def traces(self):  # one ``StepTrace`` per recorded step
        return self.recorder.traces

    @property
    def num_steps(self) -> int:
        return self.recorder.num_steps

    @property
    def num_bookkeeping_errors(self) -> int:
        """Traces, statistics or final texts that failed to record after a step committed (each one logged)."""
        return self.recorder.num_bookkeeping_errors + self.detokenizers.num_errors

    def summary(self) -> ServingSummary:
        """TTFT/TPOT/ITL percentiles, throughput, preemptions, prefix hits and peak KV use of all requests
        finished so far, over all recorded steps."""
        return summarize(self._past_metrics + list(self.request_metrics.values()), self.traces, self.num_kv_blocks)

    def reset_stats(self) -> None:
        """Forget finished requests' metrics and the step trace (e.g. between benchmark runs)."""
        live = set(self.scheduler.requests)
        self.request_metrics = {k: v for k, v in self.request_metrics.items() if k in live}
        self._past_metrics = []
        self.recorder.reset()

    def get_metrics(self) -> list[Metric]:
        """vLLM's ``LLMEngine.get_metrics()``: a snapshot of the Prometheus series (``minengine.metrics.reader``
        Counter / Gauge / Histogram objects, vLLM's names; the totals count since the engine started).

        Raises:
            RuntimeError: the engine runs with ``disable_log_stats`` (as vLLM: the series are not kept).
        """
        if not self.log_stats:
            raise RuntimeError("stat logging is disabled (EngineConfig.disable_log_stats=True)")
        with self.stat_logger.lock:  # one consistent snapshot, as /metrics renders it
            return get_metrics_snapshot(self.stat_logger.registry)
