"""A snapshot of an engine's Prometheus series as plain objects: ``LLM.get_metrics()`` (vLLM's
``vllm.v1.metrics.reader``: the same classes and fields, so the same loop prints both)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

PREFIXES = ("vllm:", "minengine:")


@dataclass
class Metric:
    """One series: its name and labels."""

    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Vector(Metric):
    values: list[int]


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Histogram(Metric):
    """``buckets``: upper bound (as Prometheus writes it, e.g. "0.5", "+Inf") -> cumulative count."""

    count: int
    sum: float
    buckets: dict[str, int]


def get_metrics_snapshot(registry: CollectorRegistry) -> list[Metric]:
    """Every ``vllm:`` and ``minengine:`` series of ``registry``, one object per label set."""
    out: list[Metric] = []
    for family in registry.collect():
        if not family.name.startswith(PREFIXES):
            continue
        if family.type == "gauge":
            out += [Gauge(family.name, dict(s.labels), s.value) for s in family.samples]
        elif family.type == "counter":
            out += [Counter(family.name, dict(s.labels), int(s.value)) for s in family.samples
                    if s.name.endswith("_total")]
        elif family.type == "histogram":
            series: dict[tuple, dict] = {}
            for s in family.samples:
                labels = {k: v for k, v in s.labels.items() if k != "le"}
                h = series.setdefault(tuple(sorted(labels.items())), {"labels": labels, "buckets": {}})
                if s.name.endswith("_bucket"):
                    h["buckets"][s.labels["le"]] = int(s.value)
                elif s.name.endswith("_count"):
                    h["count"] = int(s.value)
                elif s.name.endswith("_sum"):
                    h["sum"] = s.value
            out += [Histogram(family.name, h["labels"], h.get("count", 0), h.get("sum", 0.0), h["buckets"])
                    for h in series.values()]
    return out
