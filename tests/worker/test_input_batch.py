"""Input preparation: the persistent BlockTable and ForwardBatch equal a naive per-request rebuild, step after
step, on random workloads through the real scheduler (chunked prefill, preemption, prefix hits, aborts, reused
request ids); and the decode-group planner's invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine.core.doors import make_scheduler
from minengine.core.kv_cache_manager import KVCacheManager, cdiv
from minengine.request import Request, RequestStatus
from minengine.sampling_params import SamplingParams
from minengine.worker.block_table import BlockTable
from minengine.worker.forward_batch import ForwardBatch, plan_decode_groups

BS = 4  # a small block size: many block boundaries


def backend(for_triton: bool) -> str:
    """The backend a batch is built for: the Triton kernel's block tables, or the CPU backends' groups."""
    return "triton" if for_triton else "cpu"


def check_batch(out, batch: ForwardBatch, for_triton: bool) -> None:
    """Every field of ``batch`` against the scheduler output's own lists."""
    scheduled = out.scheduled
    qsl = batch.query_start_loc.tolist()
    order = batch.batch_order.tolist()
    assert sorted(order) == list(range(len(scheduled)))
    where = {i: j for j, i in enumerate(order)}
    ids, pos, slots = batch.input_ids.tolist(), batch.positions.tolist(), batch.slot_mapping.tolist()
    for i, s in enumerate(scheduled):
        j = where[i]
        a, b = qsl[j], qsl[j + 1]
        assert ids[a:b] == s.token_ids
        assert pos[a:b] == list(range(s.start_pos, s.seq_len))
        assert slots[a:b] == [s.block_ids[p // BS] * BS + p % BS for p in range(s.start_pos, s.seq_len)]
        assert batch.seq_lens[j] == s.seq_len
        if for_triton:
            need = cdiv(s.seq_len, BS)
            assert batch.block_tables[j, :need].tolist() == s.block_ids[:need]
    sampling = [i for i, s in enumerate(scheduled) if s.sample]
    assert batch.logits_indices.tolist() == [qsl[where[i] + 1] - 1 for i in sampling]
    # Batch order: decodes first (longest first), then prefill chunks.
    q_lens = [qsl[j + 1] - qsl[j] for j in range(len(order))]
    assert batch.num_decodes == sum(q == 1 for q in q_lens)
    assert all(q == 1 for q in q_lens[:batch.num_decodes]) and all(q > 1 for q in q_lens[batch.num_decodes:])
    if for_triton:
        assert not batch.decode_groups and not batch.prefill_groups
        return
    by_row = {j: scheduled[i] for j, i in enumerate(order)}
    covered = []
    for g in batch.decode_groups:
        for r in range(g.num_requests):
            s = by_row[g.first_row + r]
            need = cdiv(s.seq_len, BS)
            assert g.num_blocks >= need
            assert g.block_ids[r * g.num_blocks: r * g.num_blocks + need].tolist() == s.block_ids[:need]
            assert g.key_mask[r, 0, 0].tolist() == [k < s.seq_len for k in range(g.num_blocks * BS)]
            covered.append(g.first_row + r)
    assert covered == list(range(batch.num_decodes))
    row = qsl[batch.num_decodes]
    for g in batch.prefill_groups:
        assert g.first_row == row
        for r in range(g.num_requests):
            j = qsl.index(row)
            s = by_row[j]
            assert (s.num_new_tokens, s.seq_len) == (g.q_len, g.seq_len)
            need = cdiv(s.seq_len, BS)
            assert g.block_ids[r * need:(r + 1) * need].tolist() == s.block_ids[:need]
            assert g.from_start == (s.start_pos == 0)
            assert (g.mask is None) == g.from_start
            if not g.from_start:
                assert g.mask.shape == (g.q_len, g.seq_len)
            row += g.q_len
    assert row == qsl[-1]


workloads = st.lists(st.tuples(st.integers(1, 30), st.integers(1, 12), st.booleans()), min_size=1, max_size=10)


@settings(max_examples=60, deadline=None)
@given(workloads, st.integers(14, 40), st.integers(4, 24), st.booleans(), st.randoms(use_true_random=False))
def test_forward_batch_matches_a_naive_rebuild(work, num_blocks, budget, prefix_caching, rng):
    """Random prompts (some sharing a prefix), a small pool (preemption), random aborts and a reused id."""
    kv = KVCacheManager(num_blocks, BS, prefix_caching)
    sched = make_scheduler(kv, max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=64)
    shared = [7, 8, 9, 10, 11, 12, 13, 14]
    for i, (prompt_len, max_tokens, share) in enumerate(work):
        prompt = (shared if share else []) + [3 + (i * 7 + j) % 50 for j in range(prompt_len)]
        sched.add_request(Request(str(i), prompt[:40], SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                      ignore_eos=True), arrival_time=0.0))
    tables = {False: BlockTable(max_rows=2, max_blocks=2), True: BlockTable(max_rows=2, max_blocks=2)}
    reused = False
    for _ in range(400):
        if not sched.has_unfinished_requests():
            if reused:
                break
            reused = True  # the same id again, after it finished: its row must be rebuilt
            sched.add_request(Request("0", [3, 4, 5, 6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=3),
                                      arrival_time=0.0))
        out = sched.schedule()
        for for_triton, table in tables.items():
            batch = ForwardBatch.build(out, BS, "cpu", table, attention_backend=backend(for_triton))
            check_batch(out, batch, for_triton)
        sched.update_from_output(out, {s.request_id: [3 + rng.randrange(40)] for s in out.scheduled if s.sample})
        if rng.random() < 0.05 and sched.running:
            sched.finish_requests([rng.choice(sched.running).request_id], RequestStatus.FINISHED_ABORTED)
    assert not sched.has_unfinished_requests()
    assert kv.num_free_blocks == num_blocks


def test_block_table_grows_and_reclaims_rows():
    """More requests over time than rows: finished requests' rows are reclaimed, live ones rebuilt."""
    from minengine.core.scheduler_output import ScheduledRequest, SchedulerOutput

    def step(ids, blocks, admitted=()):
        sched = [ScheduledRequest(r, [1], len(b) * BS - 1, b, True, False, SamplingParams(), 0)
                 for r, b in zip(ids, blocks)]
        return SchedulerOutput(scheduled=sched, admitted_ids=list(admitted))

    table = BlockTable(max_rows=2, max_blocks=1)
    rows = table.update(step(["a", "b"], [[1], [2, 3]], admitted=["a", "b"]))
    assert table.table[rows[0], :1].tolist() == [1] and table.table[rows[1], :2].tolist() == [2, 3]
    for k in range(10):  # a new request each step while "a" keeps running; "b" and older ones finished
        rid = f"n{k}"
        rows = table.update(step(["a", rid], [[1, 4], [5 + k]], admitted=[rid]))
        assert table.table[rows[0], :2].tolist() == [1, 4]
        assert table.table[rows[1], :1].tolist() == [5 + k]
    assert table.num_rows <= 4
    # A preempted request's row is released; when it comes back (admitted) its new table is written whole.
    table.update(SchedulerOutput(preempted_ids=["a"]))
    assert table.row_of("a") is None
    rows = table.update(step(["a"], [[9, 8, 7]], admitted=["a"]))
    assert table.table[rows[0], :3].tolist() == [9, 8, 7]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 600), min_size=1, max_size=80), st.sampled_from([0.5, 0.75, 0.9]),
       st.sampled_from([64, 1024, 16384]))
def test_decode_groups_cover_in_order_and_bound_padding(blocks, min_fill, max_keys):
    desc = np.array(sorted(blocks, reverse=True))
    groups = plan_decode_groups(desc, BS, min_fill, max_keys)
    assert groups[0][0] == 0 and groups[-1][1] == len(desc)
    assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))
    for start, end in groups:
        assert end > start
        longest = desc[start]
        assert all(desc[i] >= min_fill * longest for i in range(start, end))  # padding bounded
        assert end - start == 1 or (end - start) * longest * BS <= max_keys
        # Maximal: the next request would break the fill rule or the key cap.
        if end < len(desc):
            assert desc[end] < min_fill * longest or (end - start + 1) * longest * BS > max_keys


def test_empty_request_list_is_rejected_by_build():
    from minengine.core.scheduler_output import SchedulerOutput

    with pytest.raises(ValueError):
        ForwardBatch.build(SchedulerOutput(), BS)


def test_prompt_logprobs_rows_follow_the_scheduler_order(bundled_model, bundled_prompts):
    """A long prompt with prompt_logprobs prefills in chunks while a short request decodes in the same steps:
    the decode goes first in batch order, so the chunk's rows must be mapped back (ForwardBatch.first_rows)."""
    import torch

    from minengine import LLM
    from tests.conftest import hf_model

    short, long = bundled_prompts[0][:3], bundled_prompts[-1][:60]
    # The long prompt is admitted first and gets 8 tokens a step, so the short one is admitted beside it and
    # decodes while the long one is still in its chunks: scheduler order [long chunk, short decode].
    llm = LLM(bundled_model, max_model_len=256, max_num_batched_tokens=16, long_prefill_token_threshold=8,
              enable_prefix_caching=False)
    outs = llm.generate([{"prompt_token_ids": long}, {"prompt_token_ids": short}],
                        [SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1),
                         SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)], use_tqdm=False)
    outs = outs[::-1]
    assert any(t.chunks[0].num_tokens > 1 and t.num_decode_tokens for t in llm.llm_engine.traces)
    with torch.no_grad():
        logits = hf_model(bundled_model)(torch.tensor([long])).logits[0].float()
    ref = torch.log_softmax(logits, -1)
    pl = outs[1].prompt_logprobs
    for i in range(1, len(long)):
        assert pl[i][long[i]].logprob == pytest.approx(ref[i - 1, long[i]].item(), abs=1e-4)


def test_block_table_follows_a_rolled_back_step():
    """Scheduler.rollback truncates the blocks a failed step appended; the next step may append other ones,
    even ending on the same block id: the row must follow."""
    from minengine.core.scheduler_output import ScheduledRequest, SchedulerOutput

    def step(blocks, admitted=()):
        s = ScheduledRequest("a", [1] * 5, 3, blocks, True, True, SamplingParams(), 0)
        return SchedulerOutput(scheduled=[s], admitted_ids=list(admitted))

    table = BlockTable()
    table.update(step([4], admitted=["a"]))
    row = table.update(step([4, 7, 9]))[0]  # the failed step appended 7 and 9; it is rolled back
    assert table.table[row, :3].tolist() == [4, 7, 9]
    row = table.update(step([4, 8, 9]))[0]  # rescheduled: other blocks, the same last one
    assert table.table[row, :3].tolist() == [4, 8, 9]
    row = table.update(step([4, 8]))[0]  # rolled back again and rescheduled shorter
    assert table.table[row, :2].tolist() == [4, 8] and table.num_blocks[row] == 2


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 24), st.integers(1, 16)), min_size=1, max_size=6), st.integers(0, 12),
       st.integers(1, 8), st.sampled_from([1, 2, 4]), st.booleans(), st.randoms(use_true_random=False))
def test_forward_batch_matches_a_naive_rebuild_with_speculative_decoding(work, num_blocks, k, block_size,
                                                                          prefix_caching, rng):
    """Property: with proposals verified and rejected at random, the persistent BlockTable still equals each
    request's block list and the slot mapping follows it. A rejection frees the blocks that held only rejected
    proposals (``KVCacheManager.truncate``) and a later step allocates blocks at the same indices again, so a row
    can change without changing its length."""
    num_blocks += max(cdiv(p + m + k, block_size) for p, m in work)  # each request fits alone
    kv = KVCacheManager(num_blocks, block_size, prefix_caching)
    sched = make_scheduler(kv, max_num_batched_tokens=64, max_num_seqs=4, max_model_len=80,
                      speculative_config={"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1,
                                          "prompt_lookup_max": 2})
    for i, (prompt_len, max_tokens) in enumerate(work):
        pattern = [3 + (i + j) % 5 for j in range(1 + i % 3)]  # repetitive: the n-gram proposer proposes
        prompt = (pattern * prompt_len)[:prompt_len]
        sched.add_request(Request(str(i), prompt, SamplingParams(temperature=0, max_tokens=max_tokens,
                                                                 ignore_eos=True), arrival_time=0.0))
    tables = {False: BlockTable(max_rows=2, max_blocks=2), True: BlockTable(max_rows=2, max_blocks=2)}
    verified = 0
    for _ in range(2000):
        if not sched.has_unfinished_requests():
            break
        out = sched.schedule()
        if not out.scheduled:
            continue
        for for_triton, table in tables.items():
            batch = ForwardBatch.build(out, block_size, "cpu", table, attention_backend=backend(for_triton))
            slots = batch.slot_mapping.tolist()
            for j, i in enumerate(batch.batch_order.tolist()):
                s = out.scheduled[i]
                row = table.row_of(s.request_id)
                assert table.table[row, :len(s.block_ids)].tolist() == list(s.block_ids), s.request_id
                a = batch.query_start_loc[j].item()
                assert slots[a:a + len(s.token_ids)] == [s.block_ids[p // block_size] * block_size + p % block_size
                                                         for p in range(s.start_pos, s.start_pos + len(s.token_ids))]
        sampled = {}
        for s in out.scheduled:
            if s.sample:
                spec = list(s.spec_token_ids)
                verified += bool(spec)
                accepted = rng.randint(0, len(spec))  # a random prefix of the proposals survives
                sampled[s.request_id] = spec[:accepted] + [3 + rng.randrange(5)]
        sched.update_from_output(out, sampled)
    assert not sched.has_unfinished_requests()
    assert kv.num_free_blocks == num_blocks
