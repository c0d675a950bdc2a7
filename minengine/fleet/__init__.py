"""The fleet lab: the engine's own scheduler at cluster scale, on modelled GPUs.

Many replicas of the real ``LLMEngine`` (its ``Scheduler`` and ``KVCacheManager`` unchanged) on a stand-in for the
model that returns a token per sampling request (``TokenFreeRunner``), each on its own ``ModelledClock`` (hardware,
model shape, tensor parallelism), driven by one deterministic event loop over arrivals, steps and KV transfers;
routers in front; optionally disaggregated prefill and decode pools joined by a KV link. No torch.

    from minengine.fleet import FleetConfig, simulate
    from minengine.workloads import azure_conv_path, find_data_dir, load_azure_trace

    trace = load_azure_trace(azure_conv_path(find_data_dir()))
    result = simulate(trace, FleetConfig.colocated(16, hardware="h100", model="llama-3-8b"))
    print(result.describe())
    result = simulate(trace, FleetConfig.disaggregated(4, 12, link="ib-400g"))
"""

from minengine.fleet.config import ROLES, FleetConfig, ReplicaSpec, kv_pool_blocks
from minengine.fleet.links import LINKS, KVLink, get_link
from minengine.fleet.results import FleetResult, PercentileSLO, ReplicaStats, TransferStats
from minengine.fleet.routers import ROUTERS, Router, make_router
from minengine.fleet.simulator import FleetRequest, FleetSimulator, simulate, synthetic_prompt_ids
from minengine.fleet.token_free import TokenFreeModelConfig, TokenFreeRunner, token_free_engine

__all__ = [
    "LINKS", "ROLES", "ROUTERS", "FleetConfig", "FleetRequest", "FleetResult", "FleetSimulator", "KVLink",
    "PercentileSLO", "ReplicaSpec", "ReplicaStats", "Router", "TokenFreeModelConfig", "TokenFreeRunner",
    "TransferStats", "get_link", "kv_pool_blocks", "make_router", "simulate", "synthetic_prompt_ids",
    "token_free_engine",
]
