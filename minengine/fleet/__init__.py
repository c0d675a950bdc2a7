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
    result = simulate(mooncake, FleetConfig.colocated(8, router="conductor", kv_store=KVStoreConfig()))

Modules import one way (leaves first): ``links``, ``router_names``, ``request``, ``token_free``, ``kv_store`` ->
``config`` -> ``routers``, ``replica``, ``results``, ``reuse`` -> ``simulator`` -> ``planning``.
"""

from minengine.fleet.config import ROLES, FleetConfig, ReplicaSpec, kv_pool_blocks
from minengine.fleet.kv_store import KVStore, KVStoreConfig, StoreStats
from minengine.fleet.links import LINKS, KVLink, get_link
from minengine.fleet.request import FleetRequest, synthetic_prompt_ids
from minengine.fleet.results import FleetResult, PercentileSLO, ReplicaStats, TransferStats
from minengine.fleet.reuse import infinite_cache_hits, reusable_prefix_tokens, reuse_gaps
from minengine.fleet.routers import ROUTERS, Router, make_router
from minengine.fleet.simulator import FleetSimulator, simulate
from minengine.fleet.token_free import TokenFreeModelConfig, TokenFreeRunner, token_free_engine

__all__ = [
    "LINKS", "ROLES", "ROUTERS", "FleetConfig", "FleetRequest", "FleetResult", "FleetSimulator", "KVLink",
    "KVStore", "KVStoreConfig", "PercentileSLO", "ReplicaSpec", "ReplicaStats", "Router", "StoreStats",
    "TokenFreeModelConfig", "TokenFreeRunner", "TransferStats", "get_link", "infinite_cache_hits",
    "kv_pool_blocks", "make_router", "reusable_prefix_tokens", "reuse_gaps", "simulate", "synthetic_prompt_ids",
    "token_free_engine",
]
