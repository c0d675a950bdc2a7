"""Routers: which replica an arriving request goes to (and, disaggregated, which decode replica gets its KV).

A router sees the candidate replicas that can hold the request at all (the fleet filters them first, so no router
can send a request where it cannot fit) and their load as the fleet knows it at that moment:

- ``outstanding_requests`` / ``outstanding_tokens``: requests routed there and not finished, and their
  ``prompt + max_tokens`` tokens;
- ``kv_load``: the share of the KV pool held during the replica's step in progress, plus the blocks the prompts
  waiting there will take (what the pool will hold once its queue is admitted);
- ``cached_prefix_tokens(request)``: how many leading prompt tokens the replica's prefix cache holds right now
  (its real ``BlockPool``, full blocks by chained hash, free-but-cached blocks included).

Routers, each a small class behind ``Router.select``:
- ``round-robin``: each candidate in turn (the baseline of every load balancer; vllm-router's ``round_robin``,
  ``src/policies/round_robin.rs``, is the same counter modulo the healthy workers).
- ``random``: uniformly at random, seeded (``FleetConfig.seed``).
- ``least-outstanding-tokens``: the least work assigned and not done (a "least load" balancer).
- ``least-kv-usage``: the least ``kv_load`` (llm-d's KV-cache-utilization scorer reads vLLM's
  ``gpu_cache_usage_perc`` the same way).
- ``power-of-two``: vllm-router's ``power_of_two`` (vllm-project/router ``src/policies/power_of_two.rs``): two
  different candidates drawn uniformly at random (seeded), the one with fewer outstanding requests; equal loads: the
  first drawn (its ``load1 <= load2``). The power of two choices (Mitzenmacher, 2001). The real router's load is what
  each worker answers on ``GET /get_load``, polled every ``--worker-startup-check-interval`` (30 s), plus an in-flight
  count it keeps only under ``cache_aware`` (``src/routers/http/router.rs``); a ``minengine serve`` replica has no
  ``/get_load``, so behind vllm-router every load reads 0 and it sends to the first of its two draws: at random.
- ``cache-aware``: vllm-router's ``cache_aware`` (``src/policies/cache_aware.rs``, forked from SGLang's router) with
  its defaults (``cache_threshold`` 0.3, ``balance_abs_threshold`` 64, ``balance_rel_threshold`` 1.5; vllm-router's
  ``py_src/vllm_router/router_args.py``). Load = requests routed to a replica and not finished (the router counts
  them up when it routes and down at the stream's end). When the load is imbalanced, ``max - min >
  balance_abs_threshold`` and ``max > balance_rel_threshold x min``, the least loaded replica; otherwise the replica
  that holds the longest prefix of the prompt in the router's *own record of what it sent where* (its approximate
  radix tree, ``src/tree.rs``), if that prefix is more than ``cache_threshold`` of the prompt, else the least loaded
  one. Whatever it chose, it records the prompt under that replica (also when the load decided). The real tree holds
  the prompts' characters and a prefix belongs to the replica that last received it (``Node.last_tenant``); here the
  record holds the prompts' chained full-block hashes, each under the replica that last received it, so matches
  count whole KV blocks. The real tree is trimmed to ``max_tree_size`` characters per replica every 120 s; this
  record is not.
- ``prefix-aware``: the same rule reading each replica's *actual* prefix cache instead of a record of what was sent,
  as Mooncake's Conductor does with its global KV metadata (Qin et al., FAST 2025, section 5), llm-d's precise
  prefix-cache scorer does from KV events and vllm-router's ``precise_cache_aware`` policy does. A prompt sent
  moments ago counts only once its blocks are computed; one evicted from a replica's cache no longer counts.
- ``conductor``: Mooncake's Conductor (Qin et al., FAST 2025, section 5, Algorithm 1): for each candidate, estimate
  the request's TTFT there as its queueing time plus the prefill of what its prefix cache does not hold, or, if the
  fleet's KV store (``minengine.fleet.kv_store``) continues that prefix, the load of the stored part (which runs while
  the request queues) plus the prefill of the rest; pick the smallest. So it scores local hit + store hit - queue in
  seconds of the modelled clock. Queueing time = the prompt tokens routed there and not yet prefilled x the replica's
  prefill seconds per token; equal estimates (idle replicas, no cache anywhere) go to the fewest outstanding tokens.
  Mooncake also moves hot blocks between nodes and rejects requests early; neither here.

Ties go to the lowest replica index (Rust's ``min_by_key``, which vllm-router uses, keeps the first minimum too),
so every router is deterministic for a seed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol

from minengine.fleet.router_names import ROUTER_NAMES

if TYPE_CHECKING:
    from minengine.fleet.request import FleetRequest


class ReplicaView(Protocol):
    """What a router may read about a replica (``minengine.fleet.replica.Replica`` implements it)."""

    index: int
    num_kv_blocks: int
    outstanding_requests: int
    outstanding_tokens: int

    @property
    def kv_load(self) -> float: ...

    def cached_prefix_tokens(self, request: FleetRequest) -> int: ...

    # what the conductor reads as well
    block_size: int
    queued_prefill_tokens: int
    prefill_seconds_per_token: float

    def local_prefix_blocks(self, request: FleetRequest) -> int: ...

    def store_prefix_blocks(self, request: FleetRequest, first: int, now: float) -> int: ...

    def load_seconds(self, request: FleetRequest, first: int, end: int, now: float) -> float: ...

    def prefill_time_s(self, num_tokens: int, context_len: int = 0) -> float: ...


class Router:
    """Chooses one of ``candidates`` (a non-empty list, in replica index order) for ``request``.

    Args:
        seed: for routers that draw random numbers.
    """

    name: ClassVar[str] = ""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def select(self, request: FleetRequest, candidates: Sequence[ReplicaView], now: float = 0.0) -> ReplicaView:
        """The replica for ``request`` among ``candidates``; ``now``: the fleet's time (seconds)."""
        raise NotImplementedError


def _least(candidates: Sequence[ReplicaView], key) -> ReplicaView:
    """The candidate with the smallest ``key``; ties: the first (lowest index)."""
    return min(candidates, key=key)


class RoundRobin(Router):
    """Each candidate in turn: the k-th request goes to candidate ``k mod n`` of those that can hold it."""

    name = "round-robin"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self._next = 0

    def select(self, request, candidates, now=0.0):
        choice = candidates[self._next % len(candidates)]
        self._next += 1
        return choice


class RandomRouter(Router):
    """Uniformly at random among the candidates (``random.Random(seed)``)."""

    name = "random"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self._rng = random.Random(seed)

    def select(self, request, candidates, now=0.0):
        return candidates[self._rng.randrange(len(candidates))]


class LeastOutstandingTokens(Router):
    """The replica with the fewest outstanding tokens (``prompt + max_tokens`` of requests not finished)."""

    name = "least-outstanding-tokens"

    def select(self, request, candidates, now=0.0):
        return _least(candidates, lambda r: r.outstanding_tokens)


class LeastKVUsage(Router):
    """The replica whose KV pool is least loaded (``kv_load``: held blocks + blocks of queued prompts, as a
    share of its pool, so replicas of different sizes compare fairly)."""

    name = "least-kv-usage"

    def select(self, request, candidates, now=0.0):
        return _least(candidates, lambda r: r.kv_load)


class PowerOfTwo(Router):
    """vllm-router's ``power_of_two``: the less loaded of two different candidates drawn at random (see the module
    docstring); load = outstanding requests; equal: the first drawn. One candidate: that one."""

    name = "power-of-two"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self._rng = random.Random(seed)

    def select(self, request, candidates, now=0.0):
        n = len(candidates)
        if n == 1:
            return candidates[0]
        i = self._rng.randrange(n)
        j = self._rng.randrange(n - 1)
        first, second = candidates[i], candidates[j + (j >= i)]  # j skips i: uniform over the others
        return first if first.outstanding_requests <= second.outstanding_requests else second


class CacheAware(Router):
    """vllm-router's ``cache_aware`` with its load-balance guard, on the router's own record of what it sent where
    (see the module docstring).

    Args:
        cache_threshold: least share of the prompt the best replica's prefix must cover, in [0, 1).
        balance_abs_threshold: outstanding-request gap (max - min) above which the load counts as imbalanced.
        balance_rel_threshold: ... and ``max > balance_rel_threshold x min``.

    Attributes:
        num_by_cache, num_by_load: how many requests went by prefix affinity / by load.
    """

    name = "cache-aware"

    def __init__(self, seed: int = 0, cache_threshold: float = 0.3, balance_abs_threshold: int = 64,
                 balance_rel_threshold: float = 1.5):
        super().__init__(seed)
        if not 0 <= cache_threshold < 1:
            raise ValueError(f"cache_threshold must be in [0, 1), got {cache_threshold!r}")
        if balance_abs_threshold < 0 or balance_rel_threshold < 1:
            raise ValueError("balance_abs_threshold must be >= 0 and balance_rel_threshold >= 1, got "
                             f"{balance_abs_threshold!r}, {balance_rel_threshold!r}")
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.num_by_cache = 0
        self.num_by_load = 0
        self._sent_to: dict[bytes, int] = {}  # block hash -> index of the replica that last received it

    def is_imbalanced(self, loads: Sequence[int]) -> bool:
        """vllm-router's test: ``max - min > balance_abs_threshold`` and ``max > balance_rel_threshold x min``."""
        high, low = max(loads), min(loads)
        return high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low

    def longest_prefix(self, request: FleetRequest, candidates: Sequence[ReplicaView]) -> tuple[ReplicaView | None,
                                                                                                  int]:
        """(the candidate holding the longest prefix of ``request``'s prompt, that prefix in tokens); (None, 0)
        when none does. Here: the record of what was sent, the replica that last received the deepest block."""
        hashes, depth, holder = request.block_hashes(), 0, None
        for h in hashes:
            index = self._sent_to.get(h)
            if index is None:
                break
            depth, holder = depth + 1, index
        if holder is None:
            return None, 0
        by_index = {r.index: r for r in candidates}
        return by_index.get(holder), depth * request.block_size

    def record(self, request: FleetRequest, replica: ReplicaView) -> None:
        """Note that ``request``'s prompt was sent to ``replica`` (every full block, the head first)."""
        for h in request.block_hashes():
            self._sent_to[h] = replica.index

    def select(self, request, candidates, now=0.0):
        loads = [r.outstanding_requests for r in candidates]
        choice = candidates[loads.index(min(loads))]  # the least loaded; ties: the first
        by_cache = False
        if not self.is_imbalanced(loads):
            holder, matched = self.longest_prefix(request, candidates)
            if holder is not None and matched > self.cache_threshold * request.prompt_len:
                choice, by_cache = holder, True
        self.num_by_cache += by_cache
        self.num_by_load += not by_cache
        self.record(request, choice)
        return choice


class PrefixAware(CacheAware):
    """``CacheAware``'s rule on the replicas' actual prefix caches (see the module docstring); same arguments and
    attributes. The longest cached prefix wins; equal: the lowest index."""

    name = "prefix-aware"

    def longest_prefix(self, request, candidates):
        matched = [r.cached_prefix_tokens(request) for r in candidates]
        best = max(matched)
        return (candidates[matched.index(best)], best) if best > 0 else (None, 0)

    def record(self, request, replica):
        """Nothing to note: the caches themselves are read."""


class Conductor(Router):
    """Mooncake's Conductor: the replica with the smallest estimated TTFT (see the module docstring).

    For a candidate with ``L`` blocks of the prompt in its prefix cache and the store continuing them to ``S``
    blocks (``S = L`` without a store), prompt ``P`` tokens, ``bs`` tokens per block and queueing time ``q``:
    ``TTFT = min(q + prefill(P - L bs after L bs), max(q, load(L..S)) + prefill(P - S bs after S bs))``.

    Attributes:
        num_by_store: requests sent where the estimate counted on a load from the store.
    """

    name = "conductor"

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.num_by_store = 0

    def estimate(self, request: FleetRequest, replica: ReplicaView, now: float = 0.0) -> tuple[float, bool]:
        """(estimated TTFT on ``replica`` in seconds, whether it counts on a load from the store)."""
        bs, p = replica.block_size, request.prompt_len
        local = replica.local_prefix_blocks(request)
        queue = replica.queued_prefill_tokens * replica.prefill_seconds_per_token
        compute = queue + replica.prefill_time_s(p - local * bs, local * bs)
        stored = replica.store_prefix_blocks(request, local, now)
        if not stored:
            return compute, False
        end = local + stored
        loaded = (max(queue, replica.load_seconds(request, local, end, now))
                  + replica.prefill_time_s(p - end * bs, end * bs))
        return (loaded, True) if loaded < compute else (compute, False)

    def select(self, request, candidates, now=0.0):
        best, best_key, best_load = candidates[0], None, False
        for r in candidates:
            t, by_load = self.estimate(request, r, now)
            key = (t, r.outstanding_tokens)  # ties: the least loaded, then the lowest index
            if best_key is None or key < best_key:
                best, best_key, best_load = r, key, by_load
        self.num_by_store += best_load
        return best


ROUTERS: dict[str, type[Router]] = {
    cls.name: cls for cls in (RoundRobin, RandomRouter, PowerOfTwo, LeastOutstandingTokens, LeastKVUsage, CacheAware,
                               PrefixAware, Conductor)
}
if tuple(ROUTERS) != ROUTER_NAMES:  # the names FleetConfig validates against live in a leaf module
    raise RuntimeError(f"minengine.fleet.router_names.ROUTER_NAMES {ROUTER_NAMES} != the routers {tuple(ROUTERS)}")


def make_router(name: str, seed: int = 0) -> Router:
    """A fresh router called ``name`` (a key of ``ROUTERS``). Raises ``ValueError`` for an unknown name."""
    if name not in ROUTERS:
        raise ValueError(f"router must be one of {tuple(ROUTERS)}, got {name!r}")
    return ROUTERS[name](seed)
