"""``vllm.v1.metrics.reader`` is ``minengine.metrics.reader``."""

from minengine.metrics.reader import Counter, Gauge, Histogram, Metric, Vector, get_metrics_snapshot

__all__ = ["Counter", "Gauge", "Histogram", "Metric", "Vector", "get_metrics_snapshot"]
