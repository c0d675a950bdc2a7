"""KVShadow: what each KV slot really holds, recomputed from the steps that ran, to check the engine's books.

Every slot holds what its K/V stands for, ``(token id, chained hash of the block before)``: K/V depend on the
token and on everything before it, and the hash of the previous block names that. A step that completes
(swap-outs, swap-ins, then the forward's writes, as ``ModelRunner.execute``) updates the shadow; a step that
fails after it started (``garbage``) leaves every slot it would have copied into or written as GARBAGE, the
worst a forward interrupted halfway can do. ``check`` then verifies, between steps:
- every running request's computed tokens are in its blocks (a swapped-out one's in its CPU swap blocks);
- every block findable in the prefix cache holds the tokens its hash names, so no index entry points at
  K/V that was never written.
Used by ``FakeEngine`` and, around the real ``ModelRunner``, by the engine tests.
"""

from __future__ import annotations

from collections import Counter

from minengine.core.kv_cache_manager import hash_block
from minengine.core.scheduler import Scheduler
from minengine.request import Request, RequestStatus

GARBAGE = ("garbage",)


class KVShadow:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self.gpu: dict[int, tuple] = {}  # GPU slot -> what its K/V stands for
        self.cpu: dict[int, tuple] = {}  # CPU swap slot -> the same
        self._chains: dict[int, list[bytes]] = {}  # id(request) -> chained hashes of its full blocks
        self._requests: dict[int, Request] = {}
        self._known: dict[bytes, tuple] = {}  # block hash -> the slot contents it stands for

    def _parent(self, request: Request, block_index: int) -> bytes | None:
        """The chained hash of the block before ``block_index`` (None for the first block)."""
        bs = self.block_size
        self._requests[id(request)] = request
        chain = self._chains.setdefault(id(request), [])
        while len(chain) < block_index and (len(chain) + 1) * bs <= request.num_tokens:
            i = len(chain)
            tokens = request.token_ids_slice(i * bs, (i + 1) * bs)
            chain.append(hash_block(chain[-1] if chain else None, tokens))
            self._known[chain[-1]] = tuple((t, chain[-2] if i else None) for t in tokens)
        return chain[block_index - 1] if block_index else None

    def expected(self, request: Request, end: int) -> list[tuple]:
        """What slots 0..end of ``request``'s block table must hold."""
        bs = self.block_size
        return [(t, self._parent(request, p // bs)) for p, t in enumerate(request.token_ids_slice(0, end))]

    def expected_with(self, tokens: list[int]) -> list[tuple]:
        """What the slots of a request whose tokens so far are ``tokens`` (its own plus this step's proposals,
        speculative decoding) hold once written: a proposal's K/V depends on the proposals before it too."""
        bs, chain, out = self.block_size, [], []
        for p, t in enumerate(tokens):
            b = p // bs
            while len(chain) < b:
                i = len(chain)
                chain.append(hash_block(chain[-1] if chain else None, tokens[i * bs:(i + 1) * bs]))
            out.append((t, chain[b - 1] if b else None))
        return out

    def held(self, block_ids: list[int], end: int, cache: dict | None = None) -> list:
        bs = self.block_size
        cache = self.gpu if cache is None else cache
        return [cache.get(block_ids[p // bs] * bs + p % bs) for p in range(end)]

    def apply(self, out, requests: dict[str, Request]) -> dict[str, list]:
        """A step that ran: swap out, swap in, write the new tokens. Returns what each scheduled request reads
        (its slots 0..seq_len) and checks that it is the request's own prefix."""
        bs = self.block_size
        for gpu_block, cpu_block in out.blocks_to_swap_out:
            for o in range(bs):
                self.cpu[cpu_block * bs + o] = self.gpu.get(gpu_block * bs + o)
        for cpu_block, gpu_block in out.blocks_to_swap_in:
            for o in range(bs):
                self.gpu[gpu_block * bs + o] = self.cpu.get(cpu_block * bs + o)
        wanted = {}
        for s in out.scheduled:
            request = requests[s.request_id]
            if s.spec_token_ids:  # positions past the request's known tokens hold this step's proposals
                assert s.seq_len == request.num_tokens + len(s.spec_token_ids)
                wanted[s.request_id] = self.expected_with(request.all_token_ids + list(s.spec_token_ids))
            else:
                wanted[s.request_id] = self.expected(request, s.seq_len)
            for pos, token in zip(range(s.start_pos, s.seq_len), s.token_ids):  # what the step really sent
                self.gpu[s.block_ids[pos // bs] * bs + pos % bs] = (token, wanted[s.request_id][pos][1])
        reads = {}
        for s in out.scheduled:
            reads[s.request_id] = self.held(s.block_ids, s.seq_len)
            assert reads[s.request_id] == wanted[s.request_id], f"{s.request_id}: KV cache content wrong"
        return reads

    def garbage(self, out) -> None:
        """A step that failed after it started: every slot it would copy into or write is garbage."""
        bs = self.block_size
        for _, cpu_block in out.blocks_to_swap_out:
            for o in range(bs):
                self.cpu[cpu_block * bs + o] = GARBAGE
        for _, gpu_block in out.blocks_to_swap_in:
            for o in range(bs):
                self.gpu[gpu_block * bs + o] = GARBAGE
        for s in out.scheduled:
            for pos in range(s.start_pos, s.seq_len):
                self.gpu[s.block_ids[pos // bs] * bs + pos % bs] = GARBAGE

    def check(self, sched: Scheduler) -> None:
        """Between steps: computed tokens are where the books say, and the prefix cache holds what it names."""
        kv, bs = sched.kv, self.block_size
        for r in sched.running:
            blocks = kv.get_block_ids(r.request_id)
            assert len(blocks) * bs >= r.num_computed_tokens
            assert self.held(blocks, r.num_computed_tokens) == self.expected(r, r.num_computed_tokens), \
                f"{r.request_id}: computed tokens not in its blocks"
        for r in sched.waiting:
            if r.status is RequestStatus.SWAPPED:
                assert self.held(r.swapped_block_ids, r.num_computed_tokens, self.cpu) == \
                    self.expected(r, r.num_computed_tokens), f"{r.request_id}: swapped-out KV wrong"
            else:
                assert r.num_computed_tokens == 0, f"{r.request_id}: waiting with computed tokens"
        for r in list(sched.requests.values()) + list(self._requests.values()):
            self._parent(r, len(r.block_hashes))
        for block_hash, block in kv.pool._cached.items():
            assert block.block_hash == block_hash
            assert block_hash in self._known, f"block {block.block_id}: indexed under an unknown hash"
            assert tuple(self.held([block.block_id], bs)) == self._known[block_hash], \
                f"block {block.block_id}: indexed in the prefix cache but holds other K/V (never written?)"


def check_scheduler(sched: Scheduler, out=None) -> None:
    """The scheduler's books: a step (``out``) within the token budget and sequence slots; the ref count of
    every block == the block tables holding it; no block both free and referenced; only running requests hold
    blocks; swap blocks held once, by swapped requests; every unfinished request in exactly one queue."""
    kv, pool = sched.kv, sched.kv.pool
    if out is not None:
        assert out.num_scheduled_tokens <= sched.config.max_num_batched_tokens
        assert len(out.scheduled) <= sched.config.max_num_seqs
        assert len({s.request_id for s in out.scheduled}) == len(out.scheduled)
        for s in out.scheduled:
            assert s.num_new_tokens >= 1
            assert len(s.block_ids) * kv.block_size >= s.seq_len  # the table covers every token written
    assert len(sched.running) <= sched.config.max_num_seqs
    holders = Counter(b.block_id for blocks in kv.req_to_blocks.values() for b in blocks)
    for b in pool.blocks:
        assert b.ref_cnt == holders.get(b.block_id, 0), f"block {b.block_id} ref count"
        assert not (pool.is_free(b) and b.ref_cnt > 0), f"block {b.block_id} free and referenced"
        assert pool.is_free(b) or b.ref_cnt > 0
    assert set(kv.req_to_blocks) <= {r.request_id for r in sched.running}
    if out is None:  # between steps: a running request holds the blocks of its computed tokens, no more (a
        # block that only rejected speculative tokens used is given back)
        for r in sched.running:
            held = len(kv.req_to_blocks.get(r.request_id, ()))
            assert held == -(-r.num_computed_tokens // kv.block_size), \
                f"{r.request_id}: holds {held} blocks for {r.num_computed_tokens} computed tokens"
    swapped = [b for r in sched.requests.values() for b in r.swapped_block_ids]
    swap_space = getattr(sched, "swap_space", None)  # the swap door's, when open
    assert len(swapped) == len(set(swapped)) == (swap_space.num_used_blocks if swap_space else 0)
    for r in sched.requests.values():
        assert bool(r.swapped_block_ids) == (r.status is RequestStatus.SWAPPED)
        assert r.status is not RequestStatus.SWAPPED or r in sched.waiting
        assert r.status is not RequestStatus.RUNNING or r in sched.running
    assert len(sched.waiting) + len(sched.running) == len(sched.requests)


def watch_runner(engine) -> KVShadow:
    """Wrap ``engine.runner.execute`` so a ``KVShadow`` follows every step of a real ``LLMEngine``: a step
    whose execute returns updated it, one that raises leaves garbage. Returns the shadow."""
    shadow = KVShadow(engine.config.block_size)
    execute = engine.runner.execute

    def watched(scheduler_output):
        try:
            sampled = execute(scheduler_output)
        except BaseException:
            shadow.garbage(scheduler_output)
            raise
        shadow.apply(scheduler_output, engine.scheduler.requests)
        return sampled

    engine.runner.execute = watched
    return shadow
