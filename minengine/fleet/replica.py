"""Replica: one engine of the fleet, the real ``LLMEngine`` on a ``TokenFreeRunner`` and its own ``ModelledClock``,
plus what the fleet knows about it (load for the routers, counters for the results, a sampled timeline).

The fleet calls ``step()`` at the time the replica's next step begins; the engine schedules, "runs" and updates at
once and its clock jumps to the step's end. The step's ``StepTrace`` (block use after scheduling, admissions) is
the replica's state while the step is in flight, so routers deciding meanwhile see that; the outputs (tokens,
finished requests) are handed to the fleet at the step's end time. Traces are folded into counters and dropped
(a fleet run has millions of steps) unless ``keep_step_traces``.
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
from minengine.timing.cost_model import StepCostModel


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

    # ---- requests in ------------------------------------------------------------------------------------
    def assign(self, request_id: str, num_prompt_tokens: int, max_tokens: int) -> None:
        """A router chose this replica for a request: count it as outstanding (``num_prompt_tokens + max_tokens``
        tokens), and its prompt's blocks as pending until the engine admits it (it may arrive later: a decode
        replica gets the request when its KV has crossed the link)."""
        self.outstanding_requests += 1
        self.outstanding_tokens += num_prompt_tokens + max_tokens
        self._assigned[request_id] = num_prompt_tokens + max_tokens
        blocks = cdiv(num_prompt_tokens, self.block_size)
        self._pending[request_id] = blocks
        self._pending_blocks += blocks
        self.num_requests += 1

    def add(self, request_id: str, prompt_ids: list[int], max_tokens: int, arrival_time: float,
            block_hashes: list[bytes] | None = None, first_token: int | None = None) -> Request:
        """Queue a request on the engine, validated by ``LLMEngine.make_request``.

        Args:
            request_id, prompt_ids, arrival_time: as ``LLMEngine.add_request`` (engine-clock seconds).
            max_tokens: tokens to generate (``ignore_eos``, greedy: exactly that many unless ``max_model_len``).
            block_hashes: the prompt's full-block hashes if already computed (saves hashing twice).
            first_token: disaggregated decode: the token the prefill replica sampled; the request then arrives
                with its prompt's KV (``num_external_computed_tokens``) and decodes from its second token.

        Raises:
            ValueError: as ``LLMEngine.make_request``.
        """
        # FINAL_ONLY (vLLM's output kind): the fleet reads a request's output once, when it finishes
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        self.clock.advance_to(arrival_time)  # an idle replica's clock catches up (a busy one is ahead already)
        request = self.engine.make_request(request_id, {"prompt_token_ids": prompt_ids}, params,
                                           arrival_time=arrival_time)
        if block_hashes:
            request.block_hashes = list(block_hashes)
        if first_token is not None:
            request.output_token_ids = [first_token]
            request.num_external_computed_tokens = len(prompt_ids)
        self.engine.enqueue(request)
        return request

    def finished(self, request_id: str) -> None:
        """A request assigned here finished: it is no longer outstanding."""
        self.outstanding_requests -= 1
        self.outstanding_tokens -= self._assigned.pop(request_id)
        self._pending_blocks -= self._pending.pop(request_id, 0)  # normally popped at admission already

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
        for chunk in trace.chunks:
            if chunk.is_prefill:
                self.num_prefill_tokens += chunk.num_tokens
            else:
                self.num_decode_tokens += chunk.num_tokens
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
