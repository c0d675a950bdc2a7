"""A model-free harness around the real Scheduler and KVCacheManager (core/ never imports torch), with
deterministic fake "sampling" and the invariant checks used by the property tests.

Stand-in for the KV cache: every slot holds what its K/V would stand for, ``(token id, hash of the block
before)`` (``gpu`` / ``cpu`` dicts): K/V depend on the token and on everything before it, and the chained hash
of the previous block names that. Each step applies the scheduler's swap-outs, swap-ins and writes like the
model runner, then checks that every scheduled request's block table really holds its tokens 0..seq_len, so
wrong prefix hits, swaps into the wrong block, or a block reused while still needed all fail. After every step
it also checks that every running (or swapped) request's computed tokens are in its blocks and that every
block indexed in the prefix cache holds the tokens its hash names: an index entry pointing at K/V that was
never written (an interrupted step, ``step(fail=True)``) fails there.
"""

from __future__ import annotations

from minengine.core.doors import make_scheduler
from minengine.core.kv_cache_manager import KVCacheManager
from minengine.core.policies import PolicySettings
from minengine.request import Request
from minengine.sampling_params import SamplingParams
from tests.kv_shadow import KVShadow, check_scheduler


def fake_token(request_id: str, index: int) -> int:
    return (hash((request_id, index)) % 997) + 3


def content_token(held: list) -> int:
    """A fake "model": the next token is a function of the K/V the request reads, so a wrong cache content
    changes the output, as it would with a real model."""
    return (hash(tuple(held)) % 997) + 3


def markov_token(held: list) -> int:
    """A fake "model" that repeats itself: the next token is a function of the last token the request reads
    (7 values), so outputs cycle within a few tokens and prompt-lookup proposals are often right (speculative
    decoding gets accepted and rejected tokens). The K/V it reads is still checked by ``KVShadow.apply``."""
    return 3 + (5 * held[-1][0] + 1) % 7 if held else 3


MODELS = {"hash": content_token, "markov": markov_token}


class FakeEngine:
    def __init__(self, num_blocks=64, block_size=4, budget=32, max_num_seqs=8, max_model_len=256,
                 chunked=True, threshold=0, prefix=True, policy="decode-first", settings: PolicySettings | None = None,
                 preemption_mode="recompute", swap_blocks=0, shrink=False, content_sampling=False,
                 speculative_config=None, predictor=None, reserve_predicted_kv=False):
        """``content_sampling``: False (tokens from the request id and index), True or "hash" (from the whole
        K/V read), "markov" (from the last two tokens read; repetitive). ``speculative_config`` etc. as
        ``Scheduler``."""
        self.kv = KVCacheManager(num_blocks, block_size, prefix)
        self.sched = make_scheduler(self.kv, budget, max_num_seqs, max_model_len, chunked, threshold, policy=policy,
                               policy_settings=settings, preemption_mode=preemption_mode,
                               swap_space_blocks=swap_blocks, shrink_prefill_chunks=shrink,
                               speculative_config=speculative_config, predictor=predictor,
                               reserve_predicted_kv=reserve_predicted_kv)
        self.budget, self.max_num_seqs = budget, max_num_seqs
        self.content_sampling = "hash" if content_sampling is True else content_sampling
        self.num_draft_tokens = self.num_accepted_tokens = 0
        self.steps = 0
        self.finished: list[Request] = []
        self.shadow = KVShadow(block_size)  # what every GPU / CPU slot holds
        self.outputs: list = []  # every SchedulerOutput, for the ordering tests
        self.token_steps: dict[str, list[int]] = {}  # request id -> steps in which it got a token
        self.arrival: dict[str, int] = {}  # request id -> step it was added in

    def add(self, rid: str, prompt: list[int], max_tokens: int, eos: int | None = None, priority: int = 0) -> Request:
        # the engine's admission check: one request alone must fit in the pool
        longest = min(len(prompt) + max_tokens, self.sched.config.max_model_len)
        assert -(-longest // self.kv.block_size) <= self.kv.pool.num_blocks
        req = Request(rid, list(prompt), SamplingParams(temperature=0, max_tokens=max_tokens), 0.0, eos_token_id=eos,
                      priority=priority)
        self.sched.add_request(req)
        self.arrival[rid] = self.steps
        return req

    @property
    def gpu(self) -> dict:
        return self.shadow.gpu

    @property
    def cpu(self) -> dict:
        return self.shadow.cpu

    # ---- one step ---------------------------------------------------------------------------------------
    def step(self, fail: bool = False):
        """One engine step. ``fail=True``: the "forward" dies halfway (every slot the step would copy or write
        holds garbage) and the scheduler rolls the step back, as ``LLMEngine.step`` does on an exception."""
        out = self.sched.schedule()
        self.check_invariants(out)
        if fail:
            self.apply_garbage(out)
            rollback = getattr(self.sched, "rollback", None)  # a scheduler without rollback abandons a failed step
            if rollback is not None:
                rollback(out)
            self.outputs.append(out)
            self.check_invariants()
            return out
        held = self.apply_kv(out)
        sampled = {}
        for s in out.scheduled:
            if s.sample:
                sampled[s.request_id] = self.verify(s, held[s.request_id])
        got_token, finished = self.sched.update_from_output(out, sampled)
        for r in got_token:
            self.token_steps.setdefault(r.request_id, []).append(self.steps)
        self.finished += finished
        self.outputs.append(out)
        self.steps += 1
        self.check_invariants()
        return out

    def model_token(self, s, held: list, offset: int) -> int:
        """The fake model's token after position ``s.start_pos + s.num_new_tokens - num_sampled + offset``
        (it reads the K/V up to and including that position)."""
        if not self.content_sampling:
            return fake_token(s.request_id, s.output_index + offset)
        end = s.seq_len - s.num_sampled + 1 + offset
        return MODELS[self.content_sampling](held[:end])

    def verify(self, s, held: list) -> list[int]:
        """What the sampler does: one token, or for proposals the accepted ones plus the model's own."""
        spec, tokens = s.spec_token_ids, []
        for i in range(len(spec) + 1):
            tokens.append(self.model_token(s, held, i))
            if i == len(spec) or tokens[-1] != spec[i]:
                break
        self.num_draft_tokens += len(spec)
        self.num_accepted_tokens += len(tokens) - 1
        return tokens

    def apply_garbage(self, out):
        """A runner that failed after starting the step: any slot it would copy into or write is garbage."""
        self.shadow.garbage(out)

    def apply_kv(self, out) -> dict[str, list]:
        """What the model runner does to the cache: swap out, swap in, write the new tokens; then check
        that each scheduled request's block table holds all its tokens up to ``seq_len``. Returns what each
        scheduled request reads (its slots 0..seq_len)."""
        return self.shadow.apply(out, self.sched.requests)

    def run(self, max_steps=100_000):
        while self.sched.has_unfinished_requests():
            assert self.steps < max_steps, "engine did not finish"
            self.step()

    def check_invariants(self, out=None):
        """The scheduler's books (``check_scheduler``), and between steps what the cache holds."""
        check_scheduler(self.sched, out)
        if out is None:  # mid-step, the step's prefix hits and swap-ins are not written yet
            self.shadow.check(self.sched)


class StepClock:
    """A virtual clock for ``LLMEngine(clock=...)``: 1 second per call, so deadlines fall at reproducible points."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now
