"""The windowed KV cache manager frees the blocks behind the sliding window: a request holds at most
``max_blocks_held`` blocks whatever its length, the keys its queries read are still in its blocks, and every
block is free at the end, through chunked prefill, prefix hits, preemption and failed steps (the real scheduler,
no model)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine.core.doors import make_scheduler
from minengine.core.kv_cache_manager import cdiv
from minengine.core.windowed_kv_cache_manager import RELEASED, WindowedKVCacheManager, max_blocks_held
from minengine.request import Request
from minengine.sampling_params import SamplingParams
from tests.kv_shadow import check_scheduler


def held_by_formula(computed: int, new: int, window: int, block_size: int) -> int:
    """Blocks a request holds once a step of ``new`` tokens after ``computed`` ones is allocated: from the block
    of its oldest key read (position ``computed - window + 1``) to the block of its last new token."""
    return cdiv(computed + new, block_size) - max(0, computed - window + 1) // block_size


@pytest.mark.parametrize("block_size", [1, 2, 4, 16])
@pytest.mark.parametrize("new", [1, 3, 16])
def test_the_bound_is_the_most_blocks_a_step_holds(block_size, new):
    for window in range(1, 40):
        counts = [held_by_formula(c, new, window, block_size) for c in range(0, 200)]
        assert max(counts) == max_blocks_held(window, block_size, new), (window, block_size, new)


def test_decode_bound_is_reached_when_the_new_token_opens_a_block():
    # window 21, block 8: the window's 21 keys straddle 1 + ceil(20 / 8) = 4 blocks when the query opens one
    assert max_blocks_held(21, 8) == 4
    assert held_by_formula(64, 1, 21, 8) == 4  # query 64 opens block 8; keys 44..64: blocks 5..8
    assert held_by_formula(68, 1, 21, 8) == 3  # keys 48..68: blocks 6..8


def _request(rid: str, prompt_len: int, max_tokens: int = 100) -> Request:
    return Request(rid, list(range(3, 3 + prompt_len)), SamplingParams(temperature=0, max_tokens=max_tokens), 0.0)


def test_blocks_behind_the_window_go_back_to_the_pool():
    kv = WindowedKVCacheManager(num_blocks=32, block_size=4, enable_prefix_caching=False, sliding_window=6)
    request = _request("a", 40)
    assert kv.allocate_slots(request, 20) is not None  # a first chunk: positions 0..19, 5 blocks
    assert kv.num_held_blocks("a") == 5
    request.num_computed_tokens = 20
    kv.allocate_slots(request, 4)  # the next query (20) reads keys 15..: blocks 0..2 are dead
    assert kv.num_held_blocks("a") == 3 and kv.req_to_blocks["a"][:3] == [RELEASED] * 3
    assert len(kv.get_block_ids("a")) == 6  # the runner's table keeps its length (and the old ids)
    assert kv.num_free_blocks == 32 - 3
    kv.free(request)
    assert kv.num_free_blocks == 32 and not kv.req_to_blocks


def test_a_window_that_is_not_a_positive_integer_is_refused():
    for bad in (0, -3, 2.5, True, None):
        with pytest.raises(ValueError, match="sliding_window"):
            WindowedKVCacheManager(8, 4, True, bad)


def _content(tokens: list[int], pos: int) -> int:
    """What a slot's K/V stands for: the token at ``pos`` and everything before it (so shared prefixes share it)."""
    return hash(tuple(tokens[:pos + 1]))


def _run_step(sched, kv, slots: dict, window: int, fail: bool) -> None:
    """One step: schedule; write each scheduled token's K/V; check every key its queries read is in a block the
    request holds, with the right content, and the blocks it holds within the bound; then commit (a fake token
    from what it read) or roll back (the written slots become garbage)."""
    out = sched.schedule()
    check_scheduler(sched, out)
    bs, sampled = kv.block_size, {}
    for s in out.scheduled:
        tokens = sched.requests[s.request_id].all_token_ids
        assert kv.num_held_blocks(s.request_id) <= max_blocks_held(window, bs, s.num_new_tokens)
        for pos in range(s.start_pos, s.seq_len):
            slots[s.block_ids[pos // bs] * bs + pos % bs] = "garbage" if fail else _content(tokens, pos)
        if fail:
            continue
        held = kv.req_to_blocks[s.request_id]
        read = range(max(0, s.start_pos - window + 1), s.seq_len)
        for pos in read:
            assert held[pos // bs] is not RELEASED and held[pos // bs].block_id == s.block_ids[pos // bs]
            assert slots.get(s.block_ids[pos // bs] * bs + pos % bs) == _content(tokens, pos), (s.request_id, pos)
        if s.sample:
            sampled[s.request_id] = [3 + _content(tokens, s.seq_len - 1) % 50]
    if fail:
        sched.rollback(out)
    else:
        sched.update_from_output(out, sampled)
    check_scheduler(sched)


@settings(max_examples=40, deadline=None)
@given(window=st.integers(1, 24), block_size=st.sampled_from([1, 2, 4, 8]), num_blocks=st.integers(48, 80),
       budget=st.integers(4, 48), prefix=st.booleans(), seed=st.integers(0, 2**16),
       prompts=st.lists(st.tuples(st.integers(1, 60), st.integers(1, 40)), min_size=1, max_size=6))
def test_random_workloads_hold_the_window_only(window, block_size, num_blocks, budget, prefix, seed, prompts):
    kv = WindowedKVCacheManager(num_blocks, block_size, prefix, window)
    sched = make_scheduler(kv, budget, 4, 256)
    for i, (prompt_len, max_tokens) in enumerate(prompts):
        # the prompts share their first 20 tokens (prefix hits); each one alone fits the pool (the engine's check)
        prompt_len = min(prompt_len, num_blocks * block_size - max_tokens)
        prompt = [3 + (seed + j * (1 if j < 20 else i + 2)) % 50 for j in range(prompt_len)]
        sched.add_request(Request(f"r{i}", prompt, SamplingParams(temperature=0, max_tokens=max_tokens), 0.0))
    slots, steps = {}, 0
    while sched.has_unfinished_requests():
        steps += 1
        assert steps < 2000, "no progress"
        _run_step(sched, kv, slots, window, fail=(seed + steps) % 11 == 0)
    assert kv.num_free_blocks == num_blocks and not kv.req_to_blocks
