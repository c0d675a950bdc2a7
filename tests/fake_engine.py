"""A model-free harness around the real Scheduler and KVCacheManager (core/ never imports torch), with
deterministic fake "sampling" and the invariant checks used by the property tests.

Stand-in for the KV cache: every slot holds the token id whose K/V it would hold (``gpu`` / ``cpu`` dicts).
Each step applies the scheduler's swap-outs, swap-ins and writes like the model runner, then checks that every
scheduled request's block table really holds its tokens 0..seq_len, so wrong prefix hits, swaps into the
wrong block, or a block reused while still needed all fail."""

from __future__ import annotations

from collections import Counter

from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.policies import PolicySettings
from minengine.core.scheduler import Scheduler
from minengine.request import Request, RequestStatus
from minengine.sampling_params import SamplingParams


def fake_token(request_id: str, index: int) -> int:
    return (hash((request_id, index)) % 997) + 3


class FakeEngine:
    def __init__(self, num_blocks=64, block_size=4, budget=32, max_num_seqs=8, max_model_len=256,
                 chunked=True, threshold=0, prefix=True, policy="decode-first", settings: PolicySettings | None = None,
                 preemption_mode="recompute", swap_blocks=0, shrink=False):
        self.kv = KVCacheManager(num_blocks, block_size, prefix)
        self.sched = Scheduler(self.kv, budget, max_num_seqs, max_model_len, chunked, threshold, policy=policy,
                               policy_settings=settings, preemption_mode=preemption_mode,
                               swap_space_blocks=swap_blocks, shrink_prefill_chunks=shrink)
        self.budget, self.max_num_seqs = budget, max_num_seqs
        self.steps = 0
        self.finished: list[Request] = []
        self.gpu: dict[int, int] = {}  # slot -> token id whose K/V the slot holds
        self.cpu: dict[int, int] = {}  # swap-space slot -> token id
        self.outputs: list = []  # every SchedulerOutput, for the ordering tests
        self.token_steps: dict[str, list[int]] = {}  # request id -> steps in which it got a token
        self.arrival: dict[str, int] = {}  # request id -> step it was added in

    def add(self, rid: str, prompt: list[int], max_tokens: int, eos: int | None = None, priority: int = 0) -> Request:
        # the engine's admission check: one request alone must fit in the pool
        longest = min(len(prompt) + max_tokens, self.sched.max_model_len)
        assert -(-longest // self.kv.block_size) <= self.kv.pool.num_blocks
        req = Request(rid, list(prompt), SamplingParams(temperature=0, max_tokens=max_tokens), 0.0, eos_token_id=eos,
                      priority=priority)
        self.sched.add_request(req)
        self.arrival[rid] = self.steps
        return req

    def step(self):
        out = self.sched.schedule()
        self.check_invariants(out)
        self.apply_kv(out)
        sampled = {s.request_id: fake_token(s.request_id, s.output_index) for s in out.scheduled if s.sample}
        got_token, finished = self.sched.update_from_output(out, sampled)
        for r in got_token:
            self.token_steps.setdefault(r.request_id, []).append(self.steps)
        self.finished += finished
        self.outputs.append(out)
        self.steps += 1
        self.check_invariants()
        return out

    def apply_kv(self, out):
        """What the model runner does to the cache: swap out, swap in, write the new tokens; then check
        that each scheduled request's block table holds all its tokens up to ``seq_len``."""
        bs = self.kv.block_size
        for gpu_block, cpu_block in out.blocks_to_swap_out:
            for o in range(bs):
                self.cpu[cpu_block * bs + o] = self.gpu.get(gpu_block * bs + o)
        for cpu_block, gpu_block in out.blocks_to_swap_in:
            for o in range(bs):
                self.gpu[gpu_block * bs + o] = self.cpu.get(cpu_block * bs + o)
        for s in out.scheduled:
            for pos, token in zip(range(s.start_pos, s.seq_len), s.token_ids):
                self.gpu[s.block_ids[pos // bs] * bs + pos % bs] = token
        for s in out.scheduled:
            request = self.sched.requests[s.request_id]
            held = [self.gpu.get(s.block_ids[p // bs] * bs + p % bs) for p in range(s.seq_len)]
            assert held == request.token_ids_slice(0, s.seq_len), f"{s.request_id}: KV cache content wrong"

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
        # swap space: only swapped, waiting requests hold CPU blocks, each block by one request
        swapped = [b for r in self.sched.requests.values() for b in r.swapped_block_ids]
        assert len(swapped) == len(set(swapped)) == self.sched.swap_space.num_used_blocks
        for r in self.sched.requests.values():
            assert bool(r.swapped_block_ids) == (r.status is RequestStatus.SWAPPED)
            assert r.status is not RequestStatus.SWAPPED or r in self.sched.waiting
