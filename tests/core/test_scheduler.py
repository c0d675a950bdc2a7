"""Scheduler and KV cache manager without a model: budgets, chunking, prefix hits, preemption, stops."""

from __future__ import annotations

import pytest

from minengine.core.kv_cache_manager import KVCacheManager, hash_block
from minengine.request import Request, RequestStatus
from minengine.sampling_params import SamplingParams
from tests.fake_engine import FakeEngine


def test_decode_first_then_chunked_prefill_in_one_step():
    eng = FakeEngine(num_blocks=128, block_size=4, budget=16)
    eng.add("a", list(range(10, 14)), max_tokens=5)
    eng.step()  # a prefills its 4 tokens and samples
    eng.add("b", list(range(100, 140)), max_tokens=2)  # 40-token prompt
    out = eng.step()
    assert [(s.request_id, s.num_new_tokens, s.is_prefill) for s in out.scheduled] == [("a", 1, False),
                                                                                        ("b", 15, True)]
    assert not out.scheduled[1].sample  # intermediate chunk: no sampling
    out = eng.step()
    assert [(s.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 15)]
    out = eng.step()
    assert [(s.request_id, s.num_new_tokens, s.sample) for s in out.scheduled] == [("a", 1, True),
                                                                                    ("b", 10, True)]
    eng.run()
    assert eng.kv.num_free_blocks == 128


def test_long_prefill_token_threshold_caps_chunks():
    eng = FakeEngine(budget=64, threshold=8)
    eng.add("a", list(range(30)), max_tokens=1)
    eng.add("b", list(range(50, 60)), max_tokens=1)
    out = eng.step()
    assert [s.num_new_tokens for s in out.scheduled] == [8, 8]


def test_no_chunking_waits_for_room_in_budget():
    eng = FakeEngine(budget=32, chunked=False, max_model_len=32)
    eng.add("a", list(range(20)), max_tokens=3)
    eng.add("b", list(range(100, 120)), max_tokens=3)
    out = eng.step()
    assert [(s.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 20)]
    out = eng.step()
    assert [(s.request_id, s.num_new_tokens) for s in out.scheduled] == [("a", 1), ("b", 20)]


def test_max_num_seqs_limits_running():
    eng = FakeEngine(max_num_seqs=2, budget=100)
    for i in range(5):
        eng.add(str(i), [i + 3] * 5, max_tokens=3)
    out = eng.step()
    assert len(out.scheduled) == 2 and eng.sched.num_waiting == 3
    eng.run()
    assert len(eng.finished) == 5


def test_preemption_victim_is_latest_admitted_and_goes_to_front():
    # 8 blocks of 4 tokens. a, b, c each hold 2 blocks after prefill; decoding needs more.
    eng = FakeEngine(num_blocks=7, block_size=4, budget=64, prefix=False)
    a = eng.add("a", [1] * 8, max_tokens=20)
    eng.add("b", [2] * 8, max_tokens=20)
    c = eng.add("c", [3] * 8, max_tokens=20)
    eng.step()  # all three prefilled: 6 blocks used, one free
    out = eng.step()  # a takes the free block for token 9; b needs one -> c (latest) is preempted
    assert out.preempted_ids == ["c"]
    assert c.status is RequestStatus.PREEMPTED and c.num_computed_tokens == 0 and c.num_output_tokens == 1
    assert eng.sched.waiting[0] is c and c.num_preemptions == 1
    assert [s.request_id for s in out.scheduled] == ["a", "b"]
    eng.run()
    assert {r.request_id for r in eng.finished} == {"a", "b", "c"} and eng.kv.num_free_blocks == 7
    assert a.num_output_tokens == 20 and c.num_output_tokens == 20


def test_request_preempts_itself_when_alone_at_tail():
    eng = FakeEngine(num_blocks=4, block_size=4, budget=64, prefix=False)
    eng.add("a", [1] * 8, max_tokens=8)
    b = eng.add("b", [2] * 8, max_tokens=8)
    eng.step()
    out = eng.step()  # a needs block 5 of 4 -> b preempted; then a fits
    assert out.preempted_ids == ["b"] and b.status is RequestStatus.PREEMPTED
    eng.run()
    assert len(eng.finished) == 2


def test_prefix_hit_skips_cached_blocks_but_recomputes_last_token():
    eng = FakeEngine(num_blocks=32, block_size=4, budget=64)
    eng.add("a", list(range(3, 15)), max_tokens=1)  # 12 tokens = 3 full blocks
    eng.run()
    b = eng.add("b", list(range(3, 15)), max_tokens=1)  # identical prompt
    out = eng.step()
    assert out.prefix_hit_tokens == 8  # 2 blocks; the block with the last token is recomputed
    assert out.scheduled[0].start_pos == 8 and out.scheduled[0].num_new_tokens == 4
    assert b.num_cached_tokens == 8


def test_prefix_hit_within_the_same_step():
    eng = FakeEngine(num_blocks=32, block_size=4, budget=64)
    eng.add("a", list(range(3, 20)), max_tokens=1)
    eng.add("b", list(range(3, 20)), max_tokens=1)
    out = eng.step()
    assert out.prefix_hit_tokens == 16
    shared = set(out.scheduled[0].block_ids) & set(out.scheduled[1].block_ids)
    assert len(shared) == 4


def test_evicted_block_loses_its_hash():
    kv = KVCacheManager(num_blocks=2, block_size=2, enable_prefix_caching=True)
    r = Request("r", [5, 6, 7], SamplingParams(), 0.0)
    kv.allocate_slots(r, 3)
    kv.stage_full_blocks(r, 3)
    kv.commit_staged()  # the step ran: its full block is indexed
    r.num_computed_tokens = 3
    h = hash_block(None, [5, 6])
    assert kv.pool.get_cached_block(h) is not None
    kv.free(r)
    other = Request("o", [9, 9, 9, 9], SamplingParams(), 0.0)
    assert kv.allocate_slots(other, 4) is not None  # takes both blocks, evicting the cached one
    assert kv.pool.get_cached_block(h) is None


def test_chained_hash_depends_on_parent():
    assert hash_block(None, [1, 2]) != hash_block(hash_block(None, [0, 0]), [1, 2])
    assert hash_block(None, [1, 2]) == hash_block(None, [1, 2])


def test_stop_token_and_eos():
    eng = FakeEngine()
    from tests.fake_engine import fake_token
    eos = fake_token("a", 2)
    eng.add("a", [1, 2, 3], max_tokens=10, eos=eos)
    eng.run()
    (a,) = eng.finished
    assert a.status is RequestStatus.FINISHED_STOPPED and a.num_output_tokens == 3


def test_max_model_len_finishes_with_length():
    eng = FakeEngine(max_model_len=10)
    eng.add("a", [1] * 8, max_tokens=100)
    eng.run()
    assert eng.finished[0].status is RequestStatus.FINISHED_LENGTH and eng.finished[0].num_tokens == 10


@pytest.mark.parametrize("state", ["waiting", "mid-prefill", "running", "preempted", "finished", "unknown"])
def test_abort_in_every_state_frees_blocks(state):
    eng = FakeEngine(num_blocks=8, block_size=4, budget=8, prefix=False)
    eng.add("x", [7] * 8, max_tokens=20)
    target = eng.add("t", [1] * 12, max_tokens=20)
    if state == "mid-prefill":
        while not 0 < target.num_computed_tokens < target.num_prompt_tokens:
            eng.step()
    elif state == "running":
        while target.num_output_tokens == 0:
            eng.step()
    elif state == "preempted":
        while target.status is not RequestStatus.PREEMPTED:
            eng.step()
    elif state == "finished":
        eng.run()
    rid = "nope" if state == "unknown" else "t"
    eng.sched.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
    eng.check_invariants()
    eng.run()
    assert eng.kv.num_free_blocks == 8


# ---- per-step work proportional to what changed: counted, never timed ------------------------------------

def running_decodes(num: int, policy: str = "decode-first") -> FakeEngine:
    eng = FakeEngine(num_blocks=num * 4 + 64, block_size=4, budget=num * 4, max_num_seqs=num + 16, policy=policy)
    for i in range(num):
        eng.add(f"d{i}", [i % 50 + 3, i // 50 + 3], max_tokens=50)
    eng.step()  # all prefilled: every request now decodes
    return eng


@pytest.mark.parametrize("policy", ["prefill-first", "balanced"])
def test_admissions_do_not_rescan_the_running_requests(policy, monkeypatch):
    """Admitting k requests beside N running ones asks the KV manager for blocks O(N + k) times: the next-token
    reservation is summed once per step and kept up to date, not summed again over N for every admission."""
    eng = running_decodes(64, policy)
    for i in range(16):
        eng.add(f"w{i}", [7, i + 3], max_tokens=4)
    calls = []
    needed = eng.kv.num_blocks_needed
    monkeypatch.setattr(eng.kv, "num_blocks_needed", lambda *a: calls.append(1) or needed(*a))
    out = eng.step()
    assert len(out.admitted_ids) == 16
    assert len(calls) <= 2 * (64 + 16)  # was 64 x 16 + ...


def test_requests_compare_by_identity_and_finishing_one_is_o1():
    """Two requests with the same fields are different requests (a value ``==`` made ``list.remove`` over N
    running requests compare field by field); the running set finds and removes one without a scan."""
    params = SamplingParams(max_tokens=2)
    a, b = Request("x", [3], params, 0.0), Request("x", [3], params, 0.0)
    assert a != b and a == a and len({a, b}) == 2
    eng = running_decodes(32)
    running = eng.sched.running
    assert [r.request_id for r in running][:2] == ["d0", "d1"] and running[-1].request_id == "d31"
    assert eng.sched.finish_requests(["d5", "d31"], RequestStatus.FINISHED_ABORTED)[0].request_id == "d5"
    assert len(running) == 30 and "d5" not in {r.request_id for r in running} and running[-1].request_id == "d30"
    with pytest.raises(ValueError):
        running.remove(a)
    with pytest.raises(ValueError):
        running.append(running[0])


def test_past_deadline_costs_what_expired_and_keeps_arrival_order():
    sched = FakeEngine().sched
    for rid, deadline in (("late", 9.0), ("a", 5.0), ("none", None), ("b", 2.0), ("c", 5.0)):
        sched.add_request(Request(rid, [3, 4], SamplingParams(max_tokens=4), 0.0, deadline=deadline))
    sched.finish_requests(["c"], RequestStatus.FINISHED_ABORTED)
    assert sched.past_deadline(1.0) == []
    assert sched.past_deadline(5.0) == ["a", "b"]  # in the order they were added; "c" finished already
    sched.finish_requests(["a", "b"], RequestStatus.FINISHED_TIMEOUT)
    assert sched.past_deadline(100.0) == ["late"]
