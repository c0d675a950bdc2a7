"""The fleet's event loop: many replicas of the real engine on modelled GPUs, one deterministic clock of events.

Three kinds of event, in time order (ties: arrivals, then KV arrivals, then steps; equal kinds first come, first
served), so the run is a pure function of the trace and the ``FleetConfig``:

- ARRIVAL: a trace request arrives; the router picks one of the replicas that can hold it (colocated: a "mixed"
  replica; disaggregated: a "prefill" replica) and the request joins that engine's waiting queue.
- STEP: a replica's step ends (its outputs take effect: finished requests leave, a finished prefill starts its KV
  transfer) and, if the engine has work, its next step begins at once. An idle replica that receives a request
  gets a STEP at that time. Each step is one ``LLMEngine.step()``: the real scheduler decides what runs and the
  replica's ``ModelledClock`` says how long it takes.
- KV_LOADED (with a ``kv_store``): the prefix an arriving request loads from the fleet's KV store has reached its
  replica; the blocks enter that replica's prefix cache (``Replica.insert_loaded``) and the request joins its waiting
  queue, where the scheduler finds them as a local prefix hit. A request loads at arrival only when the store holds
  a continuation of the prefix its replica caches and the load ends before recomputing those tokens would (the
  replica's ``prefill_time_s`` on the modelled clock); otherwise it joins the queue at once. Each step's completed
  prompt blocks are written to the store (``KVStore.write``).
- KV_ARRIVED (disaggregated): a request's KV has crossed the link to the decode replica the decode router chose;
  the request joins that engine's waiting queue with its prompt's KV computed, and the scheduler admits it when
  its blocks are free (DistServe, Zhong et al., OSDI 2024, section 4; Splitwise, Patel et al., ISCA 2024;
  Mooncake, Qin et al., FAST 2025). The prefill replica frees its blocks when the prefill finishes (the KV is
  staged for the transfer, as in Mooncake's store); each replica sends and receives one transfer at a time.

With one replica this is exactly ``minengine.workloads.replay`` on that replica's engine: requests join when they
arrive, a request arriving during a step waits for the step's end, idle gaps are skipped.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Sequence

from minengine.fleet.config import FleetConfig
from minengine.fleet.kv_store import KVStore, LoadPlan
from minengine.fleet.replica import Replica
from minengine.fleet.request import FleetRequest, fit_to_limit, synthetic_prompt_ids
from minengine.fleet.results import FleetResult, TransferStats, replica_stats
from minengine.fleet.routers import Router, make_router
from minengine.outputs import RequestMetrics, RequestOutput
from minengine.timing.hardware import get_hardware
from minengine.workloads.traces import TraceRequest

__all__ = ["FleetRequest", "FleetSimulator", "simulate", "synthetic_prompt_ids"]

ARRIVAL, KV_ARRIVED, KV_LOADED, STEP = 0, 1, 2, 3  # also the tie order of events at equal times


class FleetSimulator:
    """One run of a trace on a fleet.

    Args:
        config: the fleet.
        trace: ``TraceRequest``s (a ``Trace``); requests without ``prompt_token_ids`` get synthetic, unshared ids.
        max_steps: stop with ``RuntimeError`` after this many steps over all replicas (a guard).

    Attributes:
        replicas: the ``Replica`` objects (their engines can be inspected after ``run``).
        requests: the ``FleetRequest``s in arrival order.
        router, decode_router: the ``Router`` instances.

    Raises:
        ValueError: duplicate request ids; requests the engines reject (as ``LLMEngine.make_request``).
    """

    def __init__(self, config: FleetConfig, trace: Sequence[TraceRequest], max_steps: int | None = None):
        self.config = config
        self.max_steps = max_steps
        self.replicas = [Replica(i, spec, config) for i, spec in enumerate(config.replicas)]
        if config.is_disaggregated:
            self.first_stage = [r for r in self.replicas if r.role == "prefill"]
            self.decode_stage = [r for r in self.replicas if r.role == "decode"]
        else:
            self.first_stage, self.decode_stage = list(self.replicas), []
        self.router: Router = make_router(config.router, config.seed)
        self.decode_router: Router | None = make_router(config.decode_router, config.seed + 1) \
            if config.is_disaggregated else None
        self.requests, self.num_clipped = self._prepare(trace)
        self.store: KVStore | None = None
        if config.kv_store is not None:
            block_bytes = config.block_size * config.shape.kv_bytes_per_token
            self.store = KVStore(config.kv_store, config.block_size, block_bytes, [r.spec.tp for r in self.replicas],
                                 [get_hardware(r.spec.hardware).host_link_bandwidth for r in self.replicas])
            for r in self.first_stage:
                r.store = self.store
        self._next_store_sample = 0.0
        self._events: list[tuple] = []
        self._seq = 0
        self._outputs: dict[int, list[RequestOutput]] = {}  # replica index -> outputs of its step in flight
        self._kicked: set[int] = set()  # idle replicas with a STEP event pending
        self._egress_free = [0.0] * len(self.replicas)  # when each replica's NICs finish their last transfer
        self._ingress_free = [0.0] * len(self.replicas)
        self.transfers = TransferStats()
        self.metrics: dict[str, RequestMetrics] = {}
        self.num_finishes = 0
        self.num_steps = 0

    def _prepare(self, trace: Sequence[TraceRequest]) -> tuple[list[FleetRequest], int]:
        cfg = self.config
        ids = [r.request_id for r in trace]
        if len(set(ids)) != len(ids):
            raise ValueError("trace has duplicate request_id values")
        bs = cfg.block_size
        limit = min(cfg.max_model_len, max(r.num_kv_blocks for r in self.first_stage) * bs)
        if self.decode_stage:
            limit = min(limit, max(r.num_kv_blocks for r in self.decode_stage) * bs)
        order = sorted(range(len(trace)), key=lambda i: trace[i].arrival_time)  # stable: ties keep trace order
        out, clipped = [], 0
        vocab = cfg.shape.vocab_size
        for index, i in enumerate(order):
            r = trace[i]
            prompt_len, output_len = r.prompt_len, r.output_len
            if prompt_len + output_len > limit:
                prompt_len, output_len = fit_to_limit(prompt_len, output_len, limit)
                clipped += 1
            tokens = r.prompt_token_ids  # shared with the trace, not copied (a Mooncake trace holds 61M ids)
            if tokens is not None and len(tokens) != prompt_len:
                tokens = tokens[:prompt_len]
            out.append(FleetRequest(index, r.request_id, float(r.arrival_time), prompt_len, output_len, tokens,
                                    vocab, bs, cfg.seed))
        return out, clipped

    # ---- events -----------------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, what: int) -> None:
        heapq.heappush(self._events, (t, kind, self._seq, what))
        self._seq += 1

    def _kick(self, replica: Replica, t: float) -> None:
        """Make sure an idle replica with new work steps at ``t``."""
        if not replica.busy and replica.index not in self._kicked:
            self._kicked.add(replica.index)
            self._push(t, STEP, replica.index)

    def run(self) -> FleetResult:
        """Simulate the whole trace; returns the ``FleetResult``.

        Raises:
            RuntimeError: more than ``max_steps`` steps; a request that never finished; KV blocks still held
                at the end (both would be bugs).
        """
        wall, cpu = time.perf_counter(), time.process_time()
        for req in self.requests:
            self._push(req.arrival_time, ARRIVAL, req.index)
        events = self._events
        while events:
            t, kind, _, what = heapq.heappop(events)
            if kind == STEP:
                self._on_step(self.replicas[what], t)
            elif kind == ARRIVAL:
                self._on_arrival(self.requests[what], t)
            elif kind == KV_LOADED:
                self._on_kv_loaded(self.requests[what], t)
            else:
                self._on_kv_arrived(self.requests[what], t)
        self._check_done()
        store = self.store.finish() if self.store is not None else None
        return FleetResult(
            config=self.config, request_metrics={r.request_id: self.metrics[r.request_id] for r in self.requests},
            replicas=[replica_stats(r) for r in self.replicas], transfers=self.transfers,
            num_steps=self.num_steps, num_clipped=self.num_clipped, cpu_time_s=time.process_time() - cpu,
            wall_time_s=time.perf_counter() - wall,
            assignments={r.request_id: (r.replica, r.decode_replica) for r in self.requests},
            router_counts=_router_counts(self.router), store=store)

    def _on_arrival(self, req: FleetRequest, t: float) -> None:
        stage_tokens = req.prompt_len + (1 if self.decode_stage else req.output_len)
        candidates = [r for r in self.first_stage if r.can_hold(stage_tokens)]
        replica = self.router.select(req, candidates, t)
        max_tokens = 1 if self.decode_stage else req.output_len
        req.replica = replica.index
        plan, local = self._plan_load(replica, req, t) if self.store is not None else (None, 0)
        cached = (plan.end if plan is not None else local) * self.config.block_size
        replica.assign(req.request_id, req.prompt_len, max_tokens, expected_cached_tokens=cached)
        if plan is not None:  # the request waits for its prefix outside the engine, then joins the queue
            self.store.start_load(plan, t)
            req.load_blocks = (plan.first, plan.end)
            self._push(plan.end_s, KV_LOADED, req.index)
            return
        hashes = req.block_hashes() if self.config.enable_prefix_caching else None
        replica.add(req.request_id, req.prompt_ids(), max_tokens, t, block_hashes=hashes)
        self._kick(replica, t)

    def _plan_load(self, replica: Replica, req: FleetRequest, t: float) -> tuple[LoadPlan | None, int]:
        """(the load from the store worth starting for ``req`` on ``replica`` at ``t`` or None, the blocks its
        prefix cache holds). Worth it: the store continues the local prefix, the replica has free blocks for it,
        and the load ends before the replica would have recomputed those tokens alone."""
        local = replica.local_prefix_blocks(req)
        if local >= req.max_hit_blocks:
            return None, local
        plan = self.store.plan_load(replica.index, req.block_hashes(), local, req.max_hit_blocks, t)
        if plan is None:
            return None, local
        bs = self.config.block_size
        recompute = replica.prefill_time_s(plan.num_blocks * bs, local * bs)
        if plan.end_s - t >= recompute or plan.num_blocks > replica.engine.kv_cache_manager.num_free_blocks:
            self.store.decline(plan.num_blocks)
            return None, local
        return plan, local

    def _on_kv_loaded(self, req: FleetRequest, t: float) -> None:
        replica = self.replicas[req.replica]
        self.store.load_done()
        replica.insert_loaded(req)
        max_tokens = 1 if self.decode_stage else req.output_len
        replica.add(req.request_id, req.prompt_ids(), max_tokens, req.arrival_time, block_hashes=req.block_hashes(),
                    now=t)
        self._kick(replica, t)

    def _on_step(self, replica: Replica, t: float) -> None:
        i = replica.index
        self._kicked.discard(i)
        if replica.busy:  # the step in flight ends now: its outputs take effect
            replica.busy = False
            for out in self._outputs.pop(i):
                if out.finished:
                    self._on_finished(replica, out, t)
        if not replica.engine.has_unfinished_requests():
            replica.settle(t)
            return
        if self.max_steps is not None and self.num_steps >= self.max_steps:
            raise RuntimeError(f"fleet run did not finish within max_steps={self.max_steps} steps")
        self._outputs[i] = replica.step(t)
        self.num_steps += 1
        replica.busy = True
        end = replica.clock()
        if self.store is not None:
            if replica.role != "decode":
                by_id = self.requests_by_id
                for rid, first, stop in replica.take_computed_blocks():
                    self.store.write(i, by_id[rid].block_hashes()[first:stop], end)
            if t >= self._next_store_sample:
                self.store.sample(t)
                self._next_store_sample = t + self.config.timeline_interval_s
        self._push(end, STEP, i)

    def _on_finished(self, replica: Replica, out: RequestOutput, t: float) -> None:
        req = self.requests_by_id[out.request_id]
        if replica.role == "mixed":
            replica.finished(req.request_id)
            self._done(req, out.metrics)
        elif replica.role == "prefill":
            replica.finished(req.request_id)
            req.prefill_metrics = out.metrics
            if req.output_len <= 1:
                self._done(req, out.metrics)
                return
            req.first_token = out.outputs[0].token_ids[-1]
            self._start_transfer(req, replica, t)
        else:
            replica.finished(req.request_id)
            self._done(req, _merge(req.prefill_metrics, out.metrics))

    def _start_transfer(self, req: FleetRequest, prefill: Replica, t: float) -> None:
        candidates = [r for r in self.decode_stage if r.can_hold(req.prompt_len + req.output_len)]
        decode = self.decode_router.select(req, candidates)
        req.decode_replica = decode.index
        decode.assign(req.request_id, req.prompt_len + 1, req.output_len, prefill=False)
        num_bytes = req.prompt_len * self.config.shape.kv_bytes_per_token
        start = max(t, self._egress_free[prefill.index], self._ingress_free[decode.index])
        end = start + self.config.link.transfer_time(num_bytes, min(prefill.spec.tp, decode.spec.tp))
        self._egress_free[prefill.index] = self._ingress_free[decode.index] = end
        req.transfer_start, req.transfer_end = start, end
        self.transfers.add(num_bytes, start - t, end - start)
        self._push(end, KV_ARRIVED, req.index)

    def _on_kv_arrived(self, req: FleetRequest, t: float) -> None:
        decode = self.replicas[req.decode_replica]
        hashes = req.block_hashes() if self.config.enable_prefix_caching else None
        decode.add(req.request_id, req.prompt_ids(), req.output_len, t, block_hashes=hashes,
                   first_token=req.first_token)
        self._kick(decode, t)

    def _done(self, req: FleetRequest, metrics: RequestMetrics) -> None:
        if req.request_id in self.metrics:
            raise RuntimeError(f"request {req.request_id!r} finished twice")
        self.metrics[req.request_id] = metrics
        self.num_finishes += 1
        req.release()

    @property
    def requests_by_id(self) -> dict[str, FleetRequest]:
        by_id = getattr(self, "_by_id", None)
        if by_id is None:
            by_id = self._by_id = {r.request_id: r for r in self.requests}
        return by_id

    def _check_done(self) -> None:
        missing = [r.request_id for r in self.requests if r.request_id not in self.metrics]
        if missing:
            raise RuntimeError(f"{len(missing)} requests never finished, e.g. {missing[:3]}")
        for r in self.replicas:
            if r.engine.has_unfinished_requests() or r.engine.kv_cache_manager.num_used_blocks:
                raise RuntimeError(f"replica {r.index} still holds requests or KV blocks at the end")


def _merge(prefill: RequestMetrics, decode: RequestMetrics) -> RequestMetrics:
    """One request's metrics from its two engines: arrival, queueing, prefill and first token from the prefill
    replica; the second token's gap (transfer and decode-side queueing included), the later ITLs and the finish
    from the decode replica (whose engine counts the prefill's token among its outputs)."""
    return RequestMetrics(
        arrival_time=prefill.arrival_time, first_scheduled_time=prefill.first_scheduled_time,
        first_token_time=prefill.first_token_time, finished_time=decode.finished_time,
        num_output_tokens=decode.num_output_tokens, num_prompt_tokens=prefill.num_prompt_tokens,
        num_cached_tokens=prefill.num_cached_tokens, num_preemptions=prefill.num_preemptions + decode.num_preemptions,
        finish_reason=decode.finish_reason, itls=[decode.first_token_time - prefill.first_token_time] + decode.itls)


def _router_counts(router: Router) -> dict[str, int]:
    return {k: getattr(router, k) for k in ("num_by_cache", "num_by_load", "num_by_store") if hasattr(router, k)}


def simulate(trace: Sequence[TraceRequest], config: FleetConfig | None = None, *, max_steps: int | None = None,
             **config_fields) -> FleetResult:
    """Run ``trace`` on a fleet: ``config``, or ``FleetConfig(**config_fields)``.

    Example: ``simulate(trace, FleetConfig.colocated(16, router="least-kv-usage")).summary()``.

    Raises:
        ValueError: as ``FleetConfig`` and ``FleetSimulator``.
        RuntimeError: as ``FleetSimulator.run``.
    """
    if config is not None and config_fields:
        raise ValueError("pass either config or FleetConfig fields, not both")
    config = config if config is not None else FleetConfig(**config_fields)
    return FleetSimulator(config, trace, max_steps=max_steps).run()
