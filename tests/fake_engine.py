"""A model-free harness around the real Scheduler and KVCacheManager (core/ never imports torch), with
deterministic fake "sampling" and the invariant checks used by the property tests."""

from __future__ import annotations

from collections import Counter

from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.scheduler import Scheduler
from minengine.request import Request
from minengine.sampling_params import SamplingParams


def fake_token(request_id: str, index: int) -> int:
    return (hash((request_id, index)) % 997) + 3


class FakeEngine:
    def __init__(self, num_blocks=64, block_size=4, budget=32, max_num_seqs=8, max_model_len=256,
                 chunked=True, threshold=0, prefix=True):
        self.kv = KVCacheManager(num_blocks, block_size, prefix)
        self.sched = Scheduler(self.kv, budget, max_num_seqs, max_model_len, chunked, threshold)
        self.budget, self.max_num_seqs = budget, max_num_seqs
        self.steps = 0
        self.finished: list[Request] = []

    def add(self, rid: str, prompt: list[int], max_tokens: int, eos: int | None = None) -> Request:
        # the engine's admission check: one request alone must fit in the pool
        longest = min(len(prompt) + max_tokens, self.sched.max_model_len)
        assert -(-longest // self.kv.block_size) <= self.kv.pool.num_blocks
        req = Request(rid, list(prompt), SamplingParams(temperature=0, max_tokens=max_tokens), 0.0, eos_token_id=eos)
        self.sched.add_request(req)
        return req

    def step(self):
        out = self.sched.schedule()
        self.check_invariants(out)
        sampled = {s.request_id: fake_token(s.request_id, s.output_index) for s in out.scheduled if s.sample}
        _, finished = self.sched.update_from_output(out, sampled)
        self.finished += finished
        self.steps += 1
        self.check_invariants()
        return out

    def run(self, max_steps=100_000):
        while self.sched.has_unfinished_requests():
            assert self.steps < max_steps, "engine did not finish"
            self.step()

    def check_invariants(self, out=None):
        pool = self.kv.pool
        if out is not None:
            assert out.num_scheduled_tokens <= self.budget
            assert len(out.scheduled) <= self.max_num_seqs
            assert len(self.sched.running) <= self.max_num_seqs
            assert len({s.request_id for s in out.scheduled}) == len(out.scheduled)
            for s in out.scheduled:
                assert s.num_new_tokens >= 1
                # the block table covers every token the step writes
                assert len(s.block_ids) * self.kv.block_size >= s.seq_len
        holders = Counter(b.block_id for blocks in self.kv.req_to_blocks.values() for b in blocks)
        for b in pool.blocks:
            assert b.ref_cnt == holders.get(b.block_id, 0), f"block {b.block_id} ref count"
            assert not (pool.is_free(b) and b.ref_cnt > 0), f"block {b.block_id} free and referenced"
            assert pool.is_free(b) or b.ref_cnt > 0
        # only running requests hold blocks
        assert set(self.kv.req_to_blocks) <= {r.request_id for r in self.sched.running}
