"""Replica: one engine of the fleet, the real ``LLMEngine`` on a ``TokenFreeRunner`` and its own ``ModelledClock``,
plus what the fleet knows about it (load for the routers, counters for the results, a sampled timeline).

The fleet calls ``step()`` at the time the replica's next step begins; the engine schedules, "runs" and updates at
once and its clock jumps to the step's end. The step's ``StepTrace`` (block use after scheduling, admissions) is
the replica's state while the step is in flight, so routers deciding meanwhile see that; the outputs (tokens,
finished requests) are handed to the fleet at the step's end time. Traces are folded into counters and dropped
(a fleet run has millions of steps) unless ``keep_step_traces``.

With a fleet KV store (``minengine.fleet.kv_store``), the replica also reports the prompt blocks each step completed
(``take_computed_blocks``: the fleet writes them to the store) and takes loaded blocks into its prefix cache
(``insert_loaded``) through the engine's ``BlockPool``, as blocks a finished request left behind: a free block
is filled, indexed under its chained hash and freed again, so the scheduler finds it at admission exactly like a
local prefix hit (vLLM's KV connectors load into blocks the engine allocated; here the blocks come from the free
queue, evicting its least recently used cached blocks as any new allocation does).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from minengine.config import EngineConfig
from minengine.core.kv_cache_manager import cdiv
from minengine.engine.llm_engine import LLMEngine
from minengine.fleet.config import FleetConfig, ReplicaSpec
from minengine.fleet.token_free import TokenFreeRunner
from minengine.metrics.trace import StepTrace
from minengine.outputs import RequestOutput
from minengine.request import Request
from minengine.sampling_params import RequestOutputKind, SamplingParams
from minengine.timing.clocks import ModelledClock
from minengine.timing.cost_model import StepCostModel, StepWork


@dataclass
class Timeline:
    """A replica's state sampled over simulated time (one sample per ``timeline_interval_s`` at most).

    Attributes:
        times: step start times, seconds.
        used_blocks: KV blocks held during that step.
        running, waiting: requests running / waiting after that step.
    """

    times: array = field(default_factory=lambda: array("d"))
    used_blocks: array = field(default_factory=lambda: array("l"))
    running: array = field(default_factory=lambda: array("l"))
    waiting: array = field(default_factory=lambda: array("l"))

    def append(self, t: float, used: int, running: int, waiting: int) -> None:
        self.times.append(t)
        self.used_blocks.append(used)
        self.running.append(running)
        self.waiting.append(waiting)


class Replica:
    """One replica of a fleet.

    Args:
        index: its position in ``FleetConfig.replicas``.
        spec: role, hardware, tensor parallelism, KV pool.
        config: the fleet (engine settings, model shape).

    Attributes:
        engine: the ``LLMEngine`` (token-free) that schedules this replica's requests.
        clock: its ``ModelledClock`` (hardware, model shape, ``tp``).
        num_kv_blocks: its KV pool.
        outstanding_requests, outstanding_tokens: routed here and not finished (tokens: prompt + max_tokens).
        queued_prefill_tokens: prompt tokens routed here and not prefilled yet (less the prefix the router expected
            to be cached); ``prefill_seconds_per_token``: a full chunk's modelled time per token (the conductor's
            queueing estimate).
        store: the fleet's ``KVStore`` (set by the simulator), or None.
        used_blocks: KV blocks held during the step in flight (or after the last one).
        num_steps, busy_time_s, num_prefill_tokens, num_decode_tokens, prefix_queried_tokens, prefix_hit_tokens,
            num_preemptions, peak_used_blocks, num_requests: counters over the run.
        timeline: the sampled ``Timeline``.
    """

    def __init__(self, index: int, spec: ReplicaSpec, config: FleetConfig):
        self.index = index
        self.spec = spec
        self.role = spec.role
        self.num_kv_blocks = config.num_kv_blocks(spec)
        self.block_size = config.block_size
        engine_config = EngineConfig(
            num_kv_blocks=self.num_kv_blocks, block_size=config.block_size,
            max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
            max_model_len=config.max_model_len, enable_chunked_prefill=config.enable_chunked_prefill,
            long_prefill_token_threshold=config.long_prefill_token_threshold,
            enable_prefix_caching=config.enable_prefix_caching, scheduling_policy=config.scheduling_policy,
            preemption_mode=config.preemption_mode, trace_block_tables=False, disable_log_stats=True,
            num_cpu_threads=None, seed=config.seed)
        cost_model = StepCostModel(spec.hardware, config.shape, tp=spec.tp, block_size=config.block_size)
        self.cost_model = cost_model
        self.max_num_batched_tokens = config.max_num_batched_tokens
        self._prefill_times: dict[tuple[int, int], float] = {}
        self.prefill_seconds_per_token = self.prefill_time_s(config.max_num_batched_tokens) / \
            config.max_num_batched_tokens
        self.store = None
        self.clock = ModelledClock(cost_model, keep_costs=False)
        self.engine = LLMEngine(engine_config, clock=self.clock,
                                runner=TokenFreeRunner(config.shape, config.max_model_len, spec.tp))
        self.label = cost_model.label
        self.keep_step_traces = config.keep_step_traces
        self.timeline_interval_s = config.timeline_interval_s
        self.timeline = Timeline()
        self.busy = False  # a step is in flight (its end is an event of the fleet)
        self.outstanding_requests = 0
        self.outstanding_tokens = 0
        self.used_blocks = 0
        self._pending_blocks = 0  # blocks the prompts routed here and not yet admitted will take
        self._pending: dict[str, int] = {}
        self._assigned: dict[str, int] = {}  # request id -> its outstanding tokens
        self._prompt_len: dict[str, int] = {}
        self._prefill_left: dict[str, int] = {}  # request id -> prompt tokens still to prefill (an estimate)
        self.queued_prefill_tokens = 0
        self._loads: dict[str, tuple[int, int, int]] = {}  # request id -> (first, chain end, loaded end) blocks
        self._computed: list[tuple[str, int, int]] = []  # (request id, first, end) prompt blocks completed
        self._next_sample = 0.0
        self.num_steps = 0
        self.busy_time_s = 0.0
        self.num_prefill_tokens = 0
        self.num_decode_tokens = 0
        self.prefix_queried_tokens = 0
        self.prefix_hit_tokens = 0
        self.num_preemptions = 0
        self.peak_used_blocks = 0
        self.num_requests = 0

    # ---- what routers read ------------------------------------------------------------------------------
    def can_hold(self, num_tokens: int) -> bool:
        """True when a request of ``num_tokens`` tokens fits in this replica's KV pool at all."""
        return cdiv(num_tokens, self.block_size) <= self.num_kv_blocks

    @property
    def kv_load(self) -> float:
        """Blocks held during the step in flight plus blocks of prompts waiting here, over the pool (may pass 1)."""
        return (self.used_blocks + self._pending_blocks) / self.num_kv_blocks

    def cached_prefix_tokens(self, request) -> int:
        """Leading prompt tokens of ``request`` (a ``FleetRequest``) whose full blocks this replica's prefix cache
        holds now (0 when prefix caching is off)."""
        kv = self.engine.kv_cache_manager
        if not kv.enable_prefix_caching:
            return 0
        pool, n = kv.pool, 0
        for block_hash in request.block_hashes():
            if pool.get_cached_block(block_hash) is None:
                break
            n += 1
        return n * self.block_size

    def local_prefix_blocks(self, request) -> int:
        """Leading blocks of ``request``'s prompt a prefix hit here would cover now: its cached chain, at most
        ``request.max_hit_blocks`` (the engine recomputes the last prompt token)."""
        if not self.engine.kv_cache_manager.enable_prefix_caching:
            return 0
        pool, hashes, n = self.engine.kv_cache_manager.pool, request.block_hashes(), 0
        for i in range(min(len(hashes), request.max_hit_blocks)):
            if pool.get_cached_block(hashes[i]) is None:
                break
            n += 1
        return n

    def store_prefix_blocks(self, request, first: int, now: float) -> int:
        """How many blocks of ``request``'s prompt from block ``first`` the fleet's store holds at ``now`` (0
        without a store), up to ``request.max_hit_blocks``."""
        if self.store is None:
            return 0
        return self.store.prefix_blocks(request.block_hashes(), first, request.max_hit_blocks, now)

    def load_seconds(self, request, first: int, end: int, now: float) -> float:
        """Seconds from ``now`` until blocks ``[first, end)`` of ``request``'s prompt would be loaded here from the
        store (waiting for this replica's link included); inf without a store or when it lacks them."""
        plan = self.store.plan_load(self.index, request.block_hashes(), first, end, now) if self.store else None
        return plan.end_s - now if plan is not None and plan.end == end else float("inf")

    def prefill_time_s(self, num_tokens: int, context_len: int = 0) -> float:
        """Modelled seconds to prefill ``num_tokens`` tokens after ``context_len`` cached ones on this replica alone:
        the cost model's steps of ``max_num_batched_tokens``-token chunks, summed (0 for no tokens)."""
        if num_tokens <= 0:
            return 0.0
        key = (num_tokens, context_len)
        t = self._prefill_times.get(key)
        if t is None:
            if len(self._prefill_times) > 65_536:  # a bounded memo: routers ask for the same few often
                self._prefill_times.clear()
            t, done, chunk = 0.0, 0, self.max_num_batched_tokens
            while done < num_tokens:
                n = min(chunk, num_tokens - done)
                t += self.cost_model.cost(StepWork.of([(n, context_len + done, 0)])).time_s
                done += n
            self._prefill_times[key] = t
        return t

    # ---- requests in ------------------------------------------------------------------------------------
    def assign(self, request_id: str, num_prompt_tokens: int, max_tokens: int, expected_cached_tokens: int = 0,
               prefill: bool = True) -> None:
        """A router chose this replica for a request: count it as outstanding (``num_prompt_tokens + max_tokens``
        tokens), and its prompt's blocks as pending until the engine admits it (it may arrive later: a decode
        replica gets the request when its KV has crossed the link). With ``prefill``, the prompt tokens beyond
        ``expected_cached_tokens`` join ``queued_prefill_tokens`` until its prefill chunks run."""
        self._prompt_len[request_id] = num_prompt_tokens
        if prefill:
            left = max(0, num_prompt_tokens - expected_cached_tokens)
            self._prefill_left[request_id] = left
            self.queued_prefill_tokens += left
        self.outstanding_requests += 1
        self.outstanding_tokens += num_prompt_tokens + max_tokens
        self._assigned[request_id] = num_prompt_tokens + max_tokens
        blocks = cdiv(num_prompt_tokens, self.block_size)
        self._pending[request_id] = blocks
        self._pending_blocks += blocks
        self.num_requests += 1

    def add(self, request_id: str, prompt_ids: list[int], max_tokens: int, arrival_time: float,
            block_hashes: list[bytes] | None = None, first_token: int | None = None,
            now: float | None = None) -> Request:
        """Queue a request on the engine, validated by ``LLMEngine.make_request``.

        Args:
            request_id, prompt_ids, arrival_time: as ``LLMEngine.add_request`` (engine-clock seconds).
            max_tokens: tokens to generate (``ignore_eos``, greedy: exactly that many unless ``max_model_len``).
            block_hashes: the prompt's full-block hashes if already computed (saves hashing twice).
            first_token: disaggregated decode: the token the prefill replica sampled; the request then arrives
                with its prompt's KV (``num_external_computed_tokens``) and decodes from its second token.
            now: when it joins the queue (default ``arrival_time``; later after a load from the store).

        Raises:
            ValueError: as ``LLMEngine.make_request``.
        """
        # FINAL_ONLY (vLLM's output kind): the fleet reads a request's output once, when it finishes
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        self.clock.advance_to(arrival_time if now is None else now)  # an idle replica's clock catches up
        request = self.engine.make_request(request_id, {"prompt_token_ids": prompt_ids}, params,
                                           arrival_time=arrival_time)
        if block_hashes:
            request.block_hashes = list(block_hashes)
        if first_token is not None:
            request.output_token_ids = [first_token]
            request.num_external_computed_tokens = len(prompt_ids)
        self.engine.enqueue(request)
        return request

    def insert_loaded(self, request) -> tuple[int, int]:
        """The load of ``request.load_blocks`` (blocks ``[first, end)`` of its prompt) from the store has arrived:
        put the blocks into this replica's prefix cache, after its cached chain. The chain's blocks are held while
        free blocks are taken (so the insertion cannot evict them), each missing block is filled and indexed under
        its hash, and all are freed again tail first (the head is evicted last). Stops at the first block that
        finds no free block. Returns (first block inserted, end of the chain now); a chain that no longer reaches
        ``first`` (its blocks were evicted during the load) cannot be continued, and nothing is inserted."""
        first, end = request.load_blocks
        pool, hashes = self.engine.kv_cache_manager.pool, request.block_hashes()
        chain = []
        for h in hashes[:end]:
            block = pool.get_cached_block(h)
            if block is None:
                break
            chain.append(block)
        start = len(chain)
        if start < first:
            self._loads[request.request_id] = (first, first, end)
            return first, start
        pool.touch(chain)
        for i in range(start, end):
            block = pool.get_cached_block(hashes[i])
            if block is not None:
                pool.touch([block])
            elif pool.num_free_blocks:
                (block,) = pool.get_new_blocks(1)  # ref count 1: out of the free queue
                pool.cache_full_block(block, hashes[i])
            else:
                break
            chain.append(block)
        pool.free_blocks(list(reversed(chain)))
        self._loads[request.request_id] = (first, len(chain), end)
        return first, len(chain)

    def take_computed_blocks(self) -> list[tuple[str, int, int]]:
        """The prompt blocks the steps since the last call completed: (request id, first, end) block ranges."""
        out, self._computed = self._computed, []
        return out

    def finished(self, request_id: str) -> None:
        """A request assigned here finished: it is no longer outstanding."""
        self.outstanding_requests -= 1
        self.outstanding_tokens -= self._assigned.pop(request_id)
        self._pending_blocks -= self._pending.pop(request_id, 0)  # normally popped at admission already
        self.queued_prefill_tokens -= self._prefill_left.pop(request_id, 0)
        self._prompt_len.pop(request_id, None)
        self._loads.pop(request_id, None)

    @property
    def step_traces(self) -> list[StepTrace]:
        """Every ``StepTrace`` of the run (empty unless ``FleetConfig.keep_step_traces``)."""
        return self.engine.traces

    # ---- steps ------------------------------------------------------------------------------------------
    def step(self, now: float) -> list[RequestOutput]:
        """Run the engine's next step starting at ``now`` (seconds; the clock skips an idle gap up to it).
        Returns its outputs; the step ends at ``self.clock()``."""
        self.clock.advance_to(now)
        outputs = self.engine.step()
        traces = self.engine.traces
        if traces:
            self._record(traces[-1])
            if not self.keep_step_traces:
                traces.clear()
        return outputs

    def settle(self, now: float) -> None:
        """The replica went idle at ``now``: its KV use is what its pool holds now (the finished requests' blocks
        are back). The timeline records the idle state, and the next step's start."""
        self.used_blocks = self.engine.kv_cache_manager.num_used_blocks
        self.timeline.append(now, self.used_blocks, 0, 0)
        self._next_sample = now

    def _record(self, trace: StepTrace) -> None:
        self.num_steps += 1
        self.busy_time_s += trace.end_time - trace.start_time
        bs, loads = self.block_size, self._loads
        for chunk in trace.chunks:
            if not chunk.is_prefill:
                self.num_decode_tokens += chunk.num_tokens
                continue
            rid = chunk.request_id
            self.num_prefill_tokens += chunk.num_tokens
            left = self._prefill_left.get(rid)
            if left:
                done = min(left, chunk.num_tokens)
                self._prefill_left[rid] = left - done
                self.queued_prefill_tokens -= done
            start, end = chunk.start_pos, chunk.start_pos + chunk.num_tokens
            if loads and rid in loads and rid in trace.admitted_ids:  # admitted: did the loaded blocks hit?
                first, stop, loaded = loads.pop(rid)
                used = max(0, min(start // bs, stop) - first)
                self.store.stats.used_blocks += used
                self.store.stats.wasted_blocks += loaded - first - used
            if self.store is not None:
                full = min(end, self._prompt_len.get(rid, 0)) // bs
                if full > start // bs:
                    self._computed.append((rid, start // bs, full))
        self.prefix_queried_tokens += trace.prefix_queried_tokens
        self.prefix_hit_tokens += trace.prefix_hit_tokens
        self.num_preemptions += len(trace.preempted_ids)
        for rid in trace.admitted_ids:
            self._pending_blocks -= self._pending.pop(rid, 0)
        used = trace.num_total_blocks - trace.num_free_blocks
        self.used_blocks = used
        if used > self.peak_used_blocks:
            self.peak_used_blocks = used
        if trace.start_time >= self._next_sample:
            self.timeline.append(trace.start_time, used, trace.num_running, trace.num_waiting)
            self._next_sample = trace.start_time + self.timeline_interval_s
