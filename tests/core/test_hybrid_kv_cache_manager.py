"""The hybrid KV cache manager keeps two KV cache groups: the full-attention group holds every block of a request,
the windowed group frees the blocks behind the window; a step is admitted only when both groups can allocate,
each step carries both tables, and every block of both groups is free at the end, through chunked prefill,
preemption and failed steps (the real scheduler, no model)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minengine.core.doors import make_scheduler
from minengine.core.hybrid_kv_cache_manager import HybridKVCacheManager
from minengine.core.kv_cache_manager import cdiv
from minengine.core.windowed_kv_cache_manager import RELEASED, max_blocks_held
from minengine.request import Request
from minengine.sampling_params import SamplingParams
from tests.kv_shadow import check_scheduler


def _request(rid: str, prompt_len: int, max_tokens: int = 100) -> Request:
    return Request(rid, list(range(3, 3 + prompt_len)), SamplingParams(temperature=0, max_tokens=max_tokens), 0.0)


def test_the_full_group_keeps_what_the_windowed_group_gives_back():
    kv = HybridKVCacheManager(num_blocks=32, block_size=4, enable_prefix_caching=False, sliding_window=6)
    request = _request("a", 40)
    assert kv.allocate_slots(request, 20) is not None  # a first chunk: positions 0..19, 5 blocks in each group
    assert kv.num_held_blocks("a") == (5, 5)
    request.num_computed_tokens = 20
    kv.allocate_slots(request, 4)  # the next query (20) reads keys 15..: the windowed group's blocks 0..2 are dead
    assert kv.num_held_blocks("a") == (6, 3)
    assert kv.windowed.req_to_blocks["a"][:3] == [RELEASED] * 3 and RELEASED not in kv.req_to_blocks["a"]
    assert len(kv.get_block_ids("a")) == len(kv.windowed_block_ids("a")) == 6  # the runner's tables: same length
    assert (kv.pool.num_free_blocks, kv.windowed.num_free_blocks) == (26, 29)
    assert kv.num_free_blocks == 26 and kv.num_used_blocks == 6 + 3
    kv.free(request)
    assert kv.pool.num_free_blocks == kv.windowed.num_free_blocks == 32
    assert not kv.req_to_blocks and not kv.windowed.req_to_blocks


def test_a_step_is_admitted_only_if_both_groups_can_allocate():
    """The windowed group's pool runs short first (another request holds most of it): the allocation fails and
    changes nothing in either group."""
    kv = HybridKVCacheManager(num_blocks=8, block_size=4, enable_prefix_caching=False, sliding_window=6)
    hog = _request("hog", 24)
    kv.windowed.allocate_slots(hog, 24)  # 6 of the windowed group's 8 blocks, none of the full group's
    request = _request("a", 12)
    assert kv.num_blocks_needed(request, 12) == 3 and kv.num_free_blocks == 2
    assert kv.allocate_slots(request, 12) is None
    assert kv.pool.num_free_blocks == 8 and "a" not in kv.req_to_blocks and "a" not in kv.windowed.req_to_blocks
    assert kv.allocate_slots(request, 8) is not None  # 2 blocks fit in both
    assert kv.num_held_blocks("a") == (2, 2)


def test_a_prefix_hit_needs_the_prefix_in_both_groups():
    """A second request with the first one's 24-token prefix: the full group hits every full block from the first;
    the windowed group needs only the blocks the window of the hit's end reads, so the blocks before them are
    released at once; a windowed group that lost one of those blocks cuts the hit back."""
    kv = HybridKVCacheManager(num_blocks=32, block_size=4, enable_prefix_caching=True, sliding_window=6)
    first, second = _request("a", 24), _request("b", 30)
    kv.allocate_slots(first, 24)
    kv.stage_full_blocks(first, 24)
    kv.commit_staged()
    first.num_computed_tokens = 24
    hits, num_hit = kv.get_computed_blocks(second)
    assert num_hit == 24 and hits == kv.req_to_blocks["a"]  # 6 blocks; the query at 24 reads keys 19..: blocks 4, 5
    assert kv.num_blocks_needed(second, 6, len(hits)) == 2
    assert kv.allocate_slots(second, 6, hits) is not None
    assert kv.num_held_blocks("b") == (8, 4)  # full: 6 hit + 2 new; windowed: hit blocks 4, 5 + 2 new
    assert kv.windowed.req_to_blocks["b"][:4] == [RELEASED] * 4
    assert kv.windowed.req_to_blocks["b"][4:6] == kv.windowed.req_to_blocks["a"][4:6]
    kv.free(second)
    kv.free(first)
    third = _request("c", 30)
    assert kv.get_computed_blocks(third)[1] == 24  # freed blocks stay cached in both pools
    kv.windowed.pool.get_new_blocks(kv.windowed.num_free_blocks)  # evicts every cached windowed block
    assert kv.get_computed_blocks(third) == ([], 0)  # the full group alone holds the prefix: no hit


def test_the_block_need_counts_windowed_hit_blocks_taken_back_from_the_free_queue():
    """A running request past the window still holds its full blocks but has released its windowed ones: a second
    request hitting its prefix takes no full block from the free queue but one windowed block (block 5, ref count
    0), so the one need the scheduler checks is one more than the new blocks, as many as the allocation takes."""
    kv = HybridKVCacheManager(num_blocks=16, block_size=4, enable_prefix_caching=True, sliding_window=6)
    first, second = _request("a", 40), _request("b", 30)
    for n in (24, 8, 4):  # the first request computes 36 tokens in three steps
        kv.allocate_slots(first, n)
        kv.stage_full_blocks(first, first.num_computed_tokens + n)
        kv.commit_staged()
        first.num_computed_tokens += n
    assert kv.num_held_blocks("a") == (9, 3)
    hits, num_hit = kv.get_computed_blocks(second)
    assert num_hit == 28 and all(b.ref_cnt == 1 for b in hits)  # 7 full blocks, all held by the first request
    assert [(b.block_id, b.ref_cnt) for b in kv.windowed.window_hit(second, 7)] == [(5, 0), (6, 1)]
    assert kv.full.num_blocks_needed(second, 2, 7) == 1 and kv.num_blocks_needed(second, 2, 7) == 2
    assert (kv.full.num_free_blocks, kv.windowed.num_free_blocks) == (7, 13)
    assert kv.allocate_slots(second, 2, hits) is not None
    # what the need said: 1 new block in the full group; 1 new and block 5 back in the windowed group
    assert (kv.full.num_free_blocks, kv.windowed.num_free_blocks) == (6, 11)
    assert kv.num_held_blocks("b") == (8, 3)


def test_bad_combinations_are_refused():
    for bad in (0, -3, 2.5, True, None):
        with pytest.raises(ValueError, match="sliding_window"):
            HybridKVCacheManager(8, 4, False, bad)
    kv = HybridKVCacheManager(8, 4, False, 6)
    with pytest.raises(ValueError, match="preemption_mode='recompute'"):
        kv.take_blocks(_request("a", 4), 1)


def _check_windowed_group(kv: HybridKVCacheManager, sched) -> None:
    """The windowed group's books: ref count == tables holding the block, free exactly when unreferenced, only
    running requests hold blocks, and each table as long as the full group's."""
    windowed = kv.windowed
    holders = Counter(b.block_id for blocks in windowed.req_to_blocks.values() for b in blocks if b is not RELEASED)
    for b in windowed.pool.blocks:
        assert b.ref_cnt == holders.get(b.block_id, 0), f"windowed block {b.block_id} ref count"
        assert windowed.pool.is_free(b) == (b.ref_cnt == 0)
    assert set(windowed.req_to_blocks) == set(kv.req_to_blocks) <= {r.request_id for r in sched.running}
    for rid, blocks in kv.req_to_blocks.items():
        assert len(windowed.req_to_blocks[rid]) == len(blocks)


def _run_step(sched, kv: HybridKVCacheManager, slots: dict, window: int, fail: bool) -> None:
    """One step: schedule; write each scheduled token's K/V into both groups (a slot is (group, block, offset));
    check the full group's queries find every key before them in blocks the request holds, the windowed group's
    every key of their window, with the right content, and the windowed blocks held within the bound; then
    commit (a fake token from what was read) or roll back (the written slots become garbage)."""
    out = sched.schedule()
    check_scheduler(sched, out)
    _check_windowed_group(kv, sched)
    bs, sampled = kv.block_size, {}
    assert set(out.windowed_block_ids) == {s.request_id for s in out.scheduled}
    for s in out.scheduled:
        tables = {"full": s.block_ids, "windowed": out.windowed_block_ids[s.request_id]}
        assert len(tables["windowed"]) == len(tables["full"]) == cdiv(s.seq_len, bs)
        full_held, windowed_held = kv.num_held_blocks(s.request_id)
        assert full_held == cdiv(s.seq_len, bs)
        assert windowed_held <= max_blocks_held(window, bs, s.num_new_tokens)
        tokens = sched.requests[s.request_id].all_token_ids
        for group, table in tables.items():
            for pos in range(s.start_pos, s.seq_len):
                slots[group, table[pos // bs], pos % bs] = "garbage" if fail else hash(tuple(tokens[:pos + 1]))
        if fail:
            continue
        reads = {"full": (kv.req_to_blocks, range(0, s.seq_len)),
                 "windowed": (kv.windowed.req_to_blocks, range(max(0, s.start_pos - window + 1), s.seq_len))}
        for group, (held, read) in reads.items():
            blocks = held[s.request_id]
            for pos in read:
                assert blocks[pos // bs] is not RELEASED and blocks[pos // bs].block_id == tables[group][pos // bs]
                assert slots.get((group, tables[group][pos // bs], pos % bs)) == hash(tuple(tokens[:pos + 1]))
        if s.sample:
            sampled[s.request_id] = [3 + hash(tuple(tokens[:s.seq_len])) % 50]
    if fail:
        sched.rollback(out)
    else:
        sched.update_from_output(out, sampled)
    check_scheduler(sched)
    _check_windowed_group(kv, sched)


# a prompt of 1 token, 23 new ones
@example(window=1, block_size=1, num_blocks=24, budget=4, prefix=False, seed=0, prompts=[(1, 24)])
@settings(max_examples=100, deadline=None)
@given(window=st.integers(1, 24), block_size=st.sampled_from([1, 2, 4, 8]), num_blocks=st.integers(24, 80),
       budget=st.integers(4, 48), prefix=st.booleans(), seed=st.integers(0, 2**16),
       prompts=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 40)), min_size=1, max_size=6))
def test_random_workloads_leak_no_block_and_hold_the_window_only(window, block_size, num_blocks, budget, prefix,
                                                                  seed, prompts):
    kv = HybridKVCacheManager(num_blocks, block_size, prefix, window)
    sched = make_scheduler(kv, budget, 4, 256)
    for i, (prompt_len, max_tokens) in enumerate(prompts):
        # each one alone fits the pool (the engine's check), with a prompt of at least one token
        max_tokens = min(max_tokens, num_blocks * block_size - 1)
        prompt_len = min(prompt_len, num_blocks * block_size - max_tokens)
        # the prompts share their first 20 tokens (prefix hits)
        prompt = [3 + (seed + j * (1 if j < 20 else i + 2)) % 50 for j in range(prompt_len)]
        sched.add_request(Request(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens), 0.0))
    slots, steps = {}, 0
    while sched.has_unfinished_requests():
        steps += 1
        assert steps < 2000, "no progress"
        _run_step(sched, kv, slots, window, fail=(seed + steps) % 11 == 0)
    assert kv.pool.num_free_blocks == kv.windowed.num_free_blocks == num_blocks
    assert not kv.req_to_blocks and not kv.windowed.req_to_blocks
