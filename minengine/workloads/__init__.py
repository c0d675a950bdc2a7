"""Workloads: real prompts and request traces to drive the engine with, online replay on a virtual clock,
goodput and capacity.

Trace data: the Azure LLM inference trace (Patel et al., "Splitwise", ISCA 2024) and the Mooncake trace
(Qin et al., "Mooncake", FAST 2025), read from ``find_data_dir()`` (``../shared/data``) or a user's path.
"""

from minengine.workloads.arrivals import (
    gamma_arrivals,
    inter_arrival_stats,
    poisson_arrivals,
    speed_up,
    synthetic_trace,
    with_arrivals,
)
from minengine.workloads.goodput import (
    SLO,
    CapacityProbe,
    CapacityResult,
    ServingBenchmark,
    arrival_window,
    completed_fraction,
    find_capacity,
    goodput,
    meets_slo,
    search_highest_passing_rate,
    search_rate_bracket,
    slo_attainment,
)
from minengine.workloads.prompts import SHAKESPEARE_OPENINGS, find_data_dir, load_real_prompts
from minengine.workloads.replay import ReplayResult, VirtualClock, replay, replay_trace
from minengine.workloads.traces import (
    Trace,
    TraceRequest,
    azure_conv_path,
    load_azure_trace,
    load_mooncake_trace,
    mooncake_path,
    parse_azure_csv,
    parse_mooncake_jsonl,
    synthetic_prompt_ids,
)

__all__ = [
    "SHAKESPEARE_OPENINGS", "SLO", "CapacityProbe", "CapacityResult", "ReplayResult", "ServingBenchmark", "Trace",
    "TraceRequest", "VirtualClock", "arrival_window", "azure_conv_path", "completed_fraction", "find_capacity",
    "find_data_dir", "gamma_arrivals",
    "goodput", "inter_arrival_stats", "load_azure_trace", "load_mooncake_trace", "load_real_prompts", "meets_slo",
    "mooncake_path", "parse_azure_csv", "parse_mooncake_jsonl", "poisson_arrivals", "replay", "replay_trace",
    "search_highest_passing_rate", "search_rate_bracket", "slo_attainment", "speed_up", "synthetic_prompt_ids",
    "synthetic_trace", "with_arrivals",
]
