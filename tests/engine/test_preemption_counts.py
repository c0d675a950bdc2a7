"""Every count of preemptions agrees: the sum of the requests' ``num_preemptions``, the preemptions in the step
traces, ``summary().num_preemptions`` and the Prometheus counter ``vllm:num_preemptions``, with and without async
scheduling, on small random workloads (tiny KV pools and token budgets, so requests are preempted often).

With async scheduling a schedule may preempt and run nothing (its victim's blocks were needed by the step in
flight): nothing is submitted, and its preemptions must still reach a trace. The property test runs the engine's
own scheduler, step loop and recorder on a stand-in runner (no model: preemption does not depend on the tokens,
every request runs to ``max_tokens``); one test runs the real async engine, the bundled model in a worker process.
"""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine.config import EngineConfig
from minengine.engine.async_scheduling_engine import AsyncSchedulingEngine
from minengine.engine.llm_engine import LLMEngine
from minengine.sampling_params import SamplingParams

VOCAB = 64


class StandInRunner:
    """The runner's contract without a model: every sampling request gets token 7; ``submit`` / ``collect``
    (async scheduling) hand the steps back in order."""

    last_swap_time_s = 0.0
    is_alive = True

    def __init__(self):
        self.model_config = SimpleNamespace(vocab_size=VOCAB, max_position_embeddings=4096, eos_token_id=None)
        self.last_logprobs, self.last_prompt_logprobs = {}, {}
        self._submitted = deque()

    def kv_bytes_per_block(self, block_size: int) -> int:
        return block_size

    def execute(self, scheduler_output) -> dict[str, list[int]]:
        return {s.request_id: [7] for s in scheduler_output.scheduled if s.sample}

    def submit(self, scheduler_output) -> None:
        self._submitted.append(self.execute(scheduler_output))

    def collect(self) -> dict[str, list[int]]:
        return self._submitted.popleft()


def preemption_counts(engine: LLMEngine) -> dict[str, int]:
    counter = next(m for m in engine.get_metrics() if m.name == "vllm:num_preemptions")
    return {"requests": sum(m.num_preemptions for m in engine.request_metrics.values()),
            "traces": sum(len(t.preempted_ids) for t in engine.traces),
            "summary": engine.summary().num_preemptions,
            "prometheus": int(counter.value)}


def serve(engine: LLMEngine, requests: list[tuple[int, int]]) -> None:
    for i, (prompt_len, max_tokens) in enumerate(requests):
        engine.add_request(str(i), {"prompt_token_ids": [3 + (i + j) % (VOCAB - 3) for j in range(prompt_len)]},
                           SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            return
        engine.step()
    raise AssertionError("the workload did not finish")


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([1, 1, 2, 4]))
    requests = draw(st.lists(st.tuples(st.integers(1, 10), st.integers(1, 8)), min_size=2, max_size=5))
    largest = max(-(-(p + m) // block_size) for p, m in requests)  # one request alone must fit in the pool
    settings_ = dict(block_size=block_size, num_kv_blocks=largest + draw(st.integers(0, 3)),
                     max_num_batched_tokens=draw(st.integers(1, 6)), max_num_seqs=draw(st.integers(2, 4)),
                     enable_prefix_caching=draw(st.booleans()),
                     preemption_mode=draw(st.sampled_from(["recompute", "swap"])))
    return settings_, requests


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads(), async_scheduling=st.booleans())
def test_every_count_of_preemptions_agrees(workload, async_scheduling):
    config_fields, requests = workload
    config = EngineConfig(async_scheduling=async_scheduling, trace_block_tables=False, **config_fields)
    engine_class = AsyncSchedulingEngine if async_scheduling else LLMEngine
    engine = engine_class(config, runner=StandInRunner())
    serve(engine, requests)
    counts = preemption_counts(engine)
    assert len(set(counts.values())) == 1, counts
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


def test_a_schedule_that_only_preempts_is_counted():
    """The smallest workload where, with async scheduling, a schedule preempts a request and runs nothing: three
    preemptions, each in a trace, the summary and the counter."""
    config = EngineConfig(block_size=1, num_kv_blocks=11, max_num_batched_tokens=2, preemption_mode="recompute",
                          enable_prefix_caching=False, async_scheduling=True)
    engine = AsyncSchedulingEngine(config, runner=StandInRunner())
    serve(engine, [(5, 3), (5, 6), (4, 2)])
    assert preemption_counts(engine) == dict.fromkeys(("requests", "traces", "summary", "prometheus"), 3)


def test_the_async_engine_counts_it_too(bundled_model):
    """The same workload on the real engine: ``LLMEngine(config)`` builds the async-scheduling engine, the
    bundled model runs in a worker process, and the counts agree with the synchronous engine's tokens."""
    prompts = [(5, 3), (5, 6), (4, 2)]
    fields = dict(block_size=1, num_kv_blocks=11, max_num_batched_tokens=2, preemption_mode="recompute",
                  enable_prefix_caching=False)
    engine = LLMEngine(EngineConfig(async_scheduling=True, **fields))
    try:
        assert isinstance(engine, AsyncSchedulingEngine)
        serve(engine, prompts)
        assert preemption_counts(engine) == dict.fromkeys(("requests", "traces", "summary", "prometheus"), 3)
    finally:
        engine.shutdown()
    sync = LLMEngine(EngineConfig(**fields))
    assert type(sync) is LLMEngine
    serve(sync, prompts)
    assert len(set(preemption_counts(sync).values())) == 1
