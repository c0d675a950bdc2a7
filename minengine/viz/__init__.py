"""Plotly figure builders for minengine runs, shared by ``app.py`` and the notebooks.

Every builder takes only the engine's own records (``engine.traces``, ``engine.request_metrics``,
``engine.summary()``) and ``lang`` ("en" or "zh"); every axis names its unit.
"""

from minengine.viz.batch_figure import batch_composition_figure
from minengine.viz.block_figures import block_pool_animation, block_pool_figure, block_tables_figure
from minengine.viz.compare import ab_sentence
from minengine.viz.i18n import t
from minengine.viz.metrics_figures import kv_usage_figure, latency_cdf_figure, queue_figure
from minengine.viz.timeline_figures import find_stalls, itl_figure, token_timeline_figure

__all__ = ["ab_sentence", "batch_composition_figure", "block_pool_animation", "block_pool_figure",
           "block_tables_figure", "find_stalls", "itl_figure", "kv_usage_figure", "latency_cdf_figure",
           "queue_figure", "t", "token_timeline_figure"]
