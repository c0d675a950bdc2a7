"""Plotly figure builders for minengine runs, shared by ``app.py`` and the notebooks.

Every builder takes only the engine's own records (``engine.traces``, ``engine.request_metrics``,
``engine.summary()``) and ``lang`` ("en" or "zh"); every axis names its unit, and every figure whose axis is
time takes ``clock_label`` to name the clock in its subtitle. ``minengine.viz.live`` plays a run while it runs.
"""

from minengine.viz.batch_figure import batch_composition_figure
from minengine.viz.block_figures import (
    block_pool_animation,
    block_pool_figure,
    block_tables_figure,
    run_request_ids,
    windowed_group_trace,
)
from minengine.viz.compare import ab_sentence
from minengine.viz.i18n import t
from minengine.viz.metrics_figures import kv_usage_figure, latency_cdf_figure, queue_figure
from minengine.viz.predictive_figures import policy_latency_figure, predicted_vs_true_figure
from minengine.viz.timeline_figures import (
    STALL_MARKS,
    auto_stall_threshold,
    find_stalls,
    itl_figure,
    labelled_stalls,
    step_request_metrics,
    step_token_timeline_figure,
    step_token_times,
    token_timeline_figure,
)

__all__ = ["STALL_MARKS", "ab_sentence", "auto_stall_threshold", "batch_composition_figure", "block_pool_animation",
           "block_pool_figure", "block_tables_figure", "find_stalls", "itl_figure", "kv_usage_figure",
           "labelled_stalls", "latency_cdf_figure", "policy_latency_figure", "predicted_vs_true_figure",
           "queue_figure", "run_request_ids", "step_request_metrics", "step_token_timeline_figure",
           "step_token_times", "t", "token_timeline_figure", "windowed_group_trace"]
