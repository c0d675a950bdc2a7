"""Async scheduling: step N+1 is scheduled before step N's tokens are known; outputs are the same as without it.

The property test drives the real Scheduler and KVCacheManager (no model) with a fake device that keeps a
paged KV cache of token ids and "samples" a function of everything a request reads through its block table, so
a wrong block, a wrong prefix hit or a wrong placeholder changes the output. The async driver pipelines as
``AsyncSchedulingEngine.step`` does (submit N+1, then process N), with EOS stops, max_tokens, preemption (recompute
and swap), prefix caching, chunking, aborts, request ids reused while a step is in flight, and failures while
processing a step (the in-flight step drained, both rolled back, newest first); it must give exactly the
tokens of the synchronous driver. The engine tests run the bundled model in a worker process.
"""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine.core import doors
from minengine.core.async_scheduler import has_work
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.scheduler_output import PLACEHOLDER_TOKEN_ID
from minengine.request import Request, RequestStatus
from minengine.sampling_params import SamplingParams
from tests.kv_shadow import check_scheduler

BLOCK_SIZE = 4
VOCAB = 40
EOS = 3


class FakeDevice:
    """A paged KV cache of token ids; a request's next token is a function of all the tokens it reads."""

    def __init__(self):
        self.gpu: dict[int, int] = {}
        self.cpu: dict[int, int] = {}
        self.last: dict[str, int] = {}  # the previous step's tokens: what its placeholders stand for

    def run(self, out) -> dict[str, list[int]]:
        for src, dst in out.blocks_to_swap_out:
            for i in range(BLOCK_SIZE):
                self.cpu[dst * BLOCK_SIZE + i] = self.gpu.get(src * BLOCK_SIZE + i)
        for src, dst in out.blocks_to_swap_in:
            for i in range(BLOCK_SIZE):
                self.gpu[dst * BLOCK_SIZE + i] = self.cpu.get(src * BLOCK_SIZE + i)

        def slot(s, pos):
            return s.block_ids[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE

        for s in out.scheduled:
            tokens = list(s.token_ids)
            assert PLACEHOLDER_TOKEN_ID not in tokens[:-1]
            if tokens[-1] == PLACEHOLDER_TOKEN_ID:
                tokens[-1] = self.last[s.request_id]
            for i, t in enumerate(tokens):
                self.gpu[slot(s, s.start_pos + i)] = t
        sampled = {}
        for s in out.scheduled:  # reads after every write of the step (a hit on a block this step fills)
            if s.sample:
                read = tuple(self.gpu[slot(s, p)] for p in range(s.seq_len))
                sampled[s.request_id] = [EOS + hash(read) % (VOCAB - EOS)]
        self.last = {rid: t[-1] for rid, t in sampled.items()}
        return sampled


def make_scheduler(num_blocks, budget, swap, async_scheduling):
    kv = KVCacheManager(num_blocks, BLOCK_SIZE, enable_prefix_caching=True)
    return doors.make_scheduler(kv, budget, max_num_seqs=4, max_model_len=64, long_prefill_token_threshold=0,
                     preemption_mode="swap" if swap else "recompute", swap_space_blocks=8 if swap else 0,
                     async_scheduling=async_scheduling)


class Driver:
    """Adds the workload's requests, re-adds an id when its request finished (``reuse``), aborts a request once
    it has ``abort_at`` tokens; records every finished request's tokens under (id, generation)."""

    def __init__(self, sched, workload):
        self.sched, self.device = sched, FakeDevice()
        self.prompts, self.reuse, self.abort_at = workload["prompts"], workload["reuse"], workload["abort_at"]
        self.generation: dict[str, int] = {}
        self.results: dict[tuple[str, int], tuple[list[int], RequestStatus]] = {}
        for i, (prompt, max_tokens) in enumerate(self.prompts):
            self.add(f"r{i}", prompt, max_tokens)

    def add(self, rid, prompt, max_tokens):
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        self.sched.add_request(Request(rid, list(prompt), params, 0.0, eos_token_id=EOS))
        self.generation[rid] = self.generation.get(rid, -1) + 1

    def done(self, requests):
        for r in requests:
            key = (r.request_id, self.generation[r.request_id])
            self.results[key] = (list(r.output_token_ids), r.status)
            if r.request_id in self.reuse and self.generation[r.request_id] == 0:
                prompt, max_tokens = self.prompts[int(r.request_id[1:])]
                self.add(r.request_id, prompt[::-1], max_tokens)  # the same id again, another prompt

    def after_update(self, finished):
        self.done(finished)
        abort = [rid for rid, r in self.sched.requests.items()
                 if self.abort_at.get(rid) is not None and r.num_output_tokens >= self.abort_at[rid]
                 and self.generation[rid] == 0]
        self.done(self.sched.finish_requests(abort, RequestStatus.FINISHED_ABORTED))
        check_scheduler(self.sched)

    def run_sync(self):
        for _ in range(5000):
            if not self.sched.has_unfinished_requests():
                return self
            out = self.sched.schedule()
            assert out.scheduled, "nothing scheduled"
            _, finished = self.sched.update_from_output(out, self.device.run(out))
            self.after_update(finished)
        raise AssertionError("did not finish")

    def run_async(self, fail_at: set[int]):
        in_flight: deque = deque()
        for call in range(5000):
            if not self.sched.has_unfinished_requests() and not in_flight:
                break
            out = self.sched.schedule()
            if has_work(out):
                in_flight.append((out, self.device.run(out)))  # the device runs steps in submission order
            assert in_flight, "nothing scheduled, nothing in flight"
            if has_work(out) and len(in_flight) == 1:
                continue
            out, sampled = in_flight.popleft()
            if call in fail_at:  # processing failed: the step in flight is drained, both roll back
                for later, _ in reversed(in_flight):
                    self.sched.rollback(later)
                in_flight.clear()
                self.sched.rollback(out)
                check_scheduler(self.sched)
                continue
            _, finished = self.sched.update_from_output(out, sampled)
            self.after_update(finished)
        else:
            raise AssertionError("did not finish")
        for r in self.sched.requests.values():
            assert r.num_output_placeholders == 0
        return self


workloads = st.fixed_dictionaries({
    "prompts": st.lists(st.tuples(st.lists(st.integers(EOS + 1, VOCAB - 1), min_size=1, max_size=14),
                                  st.integers(1, 12)), min_size=1, max_size=7),
    "shared": st.integers(0, 8),  # a prefix every prompt starts with (prefix-cache hits)
    "reuse": st.sets(st.sampled_from([f"r{i}" for i in range(7)]), max_size=3),
    "abort_at": st.dictionaries(st.sampled_from([f"r{i}" for i in range(7)]), st.integers(1, 6), max_size=2),
    "num_blocks": st.integers(10, 30),
    "budget": st.integers(1, 24),
    "swap": st.booleans(),
    "fail_at": st.sets(st.integers(0, 60), max_size=4),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workloads)
def test_async_scheduling_gives_the_tokens_of_sync_scheduling(w):
    prefix = list(range(EOS + 1, EOS + 1 + w["shared"]))
    w = dict(w, prompts=[(prefix + p, m) for p, m in w["prompts"]])
    if any(-(-(len(p) + m) // BLOCK_SIZE) > w["num_blocks"] for p, m in w["prompts"]):
        return  # the engine refuses a request that alone would not fit
    sync = Driver(make_scheduler(w["num_blocks"], w["budget"], w["swap"], False), w).run_sync()
    asynchronous = Driver(make_scheduler(w["num_blocks"], w["budget"], w["swap"], True), w).run_async(w["fail_at"])
    assert asynchronous.results == sync.results
    for d in (sync, asynchronous):
        assert d.sched.kv.num_free_blocks == d.sched.kv.pool.num_blocks  # every block free again
        assert not d.sched.requests
        if w["swap"]:
            assert d.sched.swap_space.num_used_blocks == 0


def test_async_scheduling_overlaps_a_decode_with_its_placeholder():
    """The mechanism itself: the decode after a sampling step is scheduled before its token is known."""
    sched = make_scheduler(20, 16, False, True)
    sched.add_request(Request("a", [5, 6, 7], SamplingParams(temperature=0, max_tokens=3), 0.0))
    first = sched.schedule()
    second = sched.schedule()  # step 1 still in flight
    assert first.scheduled[0].token_ids == [5, 6, 7] and first.scheduled[0].sample
    s = second.scheduled[0]
    assert (s.token_ids, s.start_pos, s.output_index, s.is_prefill) == ([PLACEHOLDER_TOKEN_ID], 3, 1, False)
    request = sched.requests["a"]
    assert (request.num_computed_tokens, request.num_output_placeholders) == (4, 2)
    sched.update_from_output(first, {"a": [9]})
    assert request.output_token_ids == [9] and request.num_output_placeholders == 1
    # max_tokens=3: the two steps in flight bring tokens 2 and 3 -> no third step is scheduled
    third = sched.schedule()
    assert third.scheduled[0].token_ids == [PLACEHOLDER_TOKEN_ID]
    assert sched.schedule().is_empty  # the token of ``third`` finishes it by length
    sched.update_from_output(second, {"a": [10]})
    _, finished = sched.update_from_output(third, {"a": [11]})
    assert finished == [request] and request.output_token_ids == [9, 10, 11]
    assert sched.kv.num_free_blocks == 20


def test_async_scheduling_refuses_speculative_decoding():
    kv = KVCacheManager(8, BLOCK_SIZE, True)
    with pytest.raises(ValueError, match="async_scheduling"):
        doors.make_scheduler(kv, 16, 4, 64, speculative_config={"method": "ngram", "num_speculative_tokens": 2},
                  async_scheduling=True)


# ---- the engine, the bundled model in a worker process -----------------------------------------------------------

def run_engine(model: str, prompts: list[str], params: list[SamplingParams], **config):
    """Every request to the end; ``abort-me`` is aborted once it has 4 tokens. Returns the final outputs and
    the engine (shut down)."""
    from minengine import LLMEngine
    from minengine.config import EngineConfig

    engine = LLMEngine(EngineConfig(model=model, max_num_batched_tokens=48, num_kv_blocks=10, max_num_seqs=6,
                                    max_model_len=512, **config))
    try:
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            engine.add_request("abort-me" if i == 0 else f"q{i}", prompt, p)
        final = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                c = out.outputs[0]
                if out.request_id == "abort-me" and len(c.token_ids) >= 4 and not out.finished:
                    engine.abort_request("abort-me")
                if out.finished:
                    logprobs = None if not c.logprobs else [{t: (lp.logprob, lp.rank) for t, lp in d.items()}
                                                            for d in c.logprobs]
                    final[out.request_id] = (c.token_ids, c.text, c.finish_reason, c.stop_reason, logprobs)
        return final, engine
    finally:
        engine.shutdown()


def test_engine_outputs_are_the_same_with_async_scheduling(bundled_model):
    """Greedy, stop strings, stop token ids, penalties (the worker appends the in-flight token to the output it
    penalises), min_tokens, seeded sampling, logprobs, an abort, preemptions, prefix hits and chunked prefill:
    the same outputs with and without async scheduling (the model in one worker process)."""
    shared = "ROMEO:\nBut soft, what light through yonder window breaks? It is the east, and Juliet is the sun. "
    prompts = [shared + "Arise", shared + "O", "ROMEO:\nBut soft", shared,
               "KING RICHARD:\nNow is the winter", "To be, or not to be", shared + "and"]
    params = [SamplingParams(temperature=0, max_tokens=20),
              SamplingParams(temperature=0, max_tokens=24, stop=["\n", " the"]),
              SamplingParams(temperature=0, max_tokens=30, repetition_penalty=3.0, frequency_penalty=2.0),
              SamplingParams(temperature=0.9, seed=7, max_tokens=24, logprobs=2),
              SamplingParams(temperature=0, max_tokens=16, min_tokens=12, stop_token_ids=[5, 9]),
              SamplingParams(temperature=0.7, top_p=0.9, seed=3, max_tokens=28, presence_penalty=0.5),
              SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)]
    sync, sync_engine = run_engine(bundled_model, prompts, params)
    asynchronous, async_engine = run_engine(bundled_model, prompts, params, async_scheduling=True)
    logprobs = {rid: v[4] for rid, v in sync.items()}
    async_logprobs = {rid: v[4] for rid, v in asynchronous.items()}
    assert {rid: v[:4] for rid, v in asynchronous.items()} == {rid: v[:4] for rid, v in sync.items()}
    for rid, positions in logprobs.items():  # a batch of another shape sums in another order: float noise
        if positions is None:
            assert async_logprobs[rid] is None
            continue
        for got, want in zip(async_logprobs[rid], positions, strict=True):
            assert {t: r for t, (_, r) in got.items()} == {t: r for t, (_, r) in want.items()}
            assert all(got[t][0] == pytest.approx(lp, abs=1e-4) for t, (lp, _) in want.items())
    assert set(sync) == {f"q{i}" for i in range(1, len(prompts))}
    assert any(reason == "stop" for _, _, reason, _, _ in sync.values())
    for engine in (sync_engine, async_engine):
        assert engine.summary().num_preemptions > 0
        assert any(t.prefix_hit_tokens for t in engine.traces)
        assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
    assert async_engine.model is None and sync_engine.model is not None  # the weights live in the worker


def test_the_worker_fills_placeholders_with_its_own_tokens():
    """``StepDecoder`` (worker side): a decode's placeholder becomes the token sampled in the previous step, and
    the output a penalised request's sampler reads gets that token too; SamplingParams travel once."""
    from minengine.executor.messages import StepDecoder, StepEncoder

    sched = make_scheduler(20, 16, False, True)
    params = SamplingParams(temperature=0, max_tokens=5, repetition_penalty=1.5)
    sched.add_request(Request("a", [5, 6, 7], params, 0.0))
    sched.add_request(Request("b", [8, 9], SamplingParams(temperature=0, max_tokens=5), 0.0))
    encoder, decoder = StepEncoder(), StepDecoder()
    first, second = sched.schedule(), sched.schedule()
    _, data = encoder.encode(first)
    _, step = decoder.decode(data)
    assert [s.token_ids for s in step.scheduled] == [[5, 6, 7], [8, 9]]
    assert step.scheduled[0].sampling_params == params and step.scheduled[0].prompt_token_ids == [5, 6, 7]
    assert step.scheduled[1].prompt_token_ids == ()  # its sampler needs no history
    decoder.record({"a": [11], "b": [12]})
    step_id, data = encoder.encode(second)  # encoded before step 1's tokens reached the scheduler
    assert b"repetition_penalty" not in data  # the params were sent with step 0
    _, step = decoder.decode(data)
    assert step_id == 1
    assert [(s.token_ids, s.output_index) for s in step.scheduled] == [([11], 1), ([12], 1)]
    assert list(step.scheduled[0].output_token_ids) == [11]
