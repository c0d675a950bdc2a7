"""minengine.viz.step_story: one sentence per step, from hand-built ``StepTrace``s whose sentence is known exactly,
in English and 中文, plus a property over random steps (every id and number the sentence must carry is there)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minengine.metrics.trace import ScheduledChunk, StepTrace
from minengine.viz.step_story import MAX_IDS, step_sentence, step_sentences


def step(n, chunks, *, waiting=0, preempted=(), admitted=(), finished=(), timed_out=(), out_blocks=0, in_blocks=0):
    return StepTrace(n, 0.0, 0.01, 512, list(chunks), len(chunks), waiting, 10, 0, 64, list(preempted),
                     list(admitted), list(finished), 0, 0, num_swapped_out_blocks=out_blocks,
                     num_swapped_in_blocks=in_blocks, timed_out_ids=list(timed_out))


def decode(rid, pos=40, spec=0, accepted=0):
    return ScheduledChunk(rid, 1 + spec, pos, False, True, spec, accepted)


def test_a_busy_step_with_a_preemption_in_both_languages():
    chunks = [decode(f"r{i}") for i in range(10)] + [ScheduledChunk("r10", 502, 0, True, False)]
    tr = step(12, chunks, waiting=4, preempted=["r3"])
    assert step_sentence(tr, "en") == ("step 12: 10 decodes + a 502-token chunk of r10; r3 preempted (no free block; "
                                       "its K/V to be recomputed); 4 waiting")
    assert step_sentence(tr, "zh") == ("第 12 步：10 个解码 + r10 的一个 502 词元分块；"
                                       "r3 被抢占（没有空闲块；其 K/V 之后重算）；4 个等待")


def test_each_kind_of_prefill_chunk():
    chunks = [ScheduledChunk("a", 300, 0, True, True),  # the whole prompt in one step
              ScheduledChunk("b", 200, 256, True, True),  # the end of a chunked prompt
              ScheduledChunk("c", 40, 256, True, True),  # admitted now, 256 tokens from the prefix cache
              ScheduledChunk("d", 64, 128, True, False)]  # admitted now, a hit, and more chunks to come
    tr = step(3, chunks, admitted=["c", "d"], waiting=1)
    assert step_sentence(tr) == (
        "step 3: a's whole 300-token prefill + the last 200-token chunk of b + c's 40-token prefill after a "
        "256-token prefix-cache hit + a 64-token chunk of d after a 128-token prefix-cache hit; c, d admitted; "
        "1 waiting")
    assert step_sentence(tr, "zh") == (
        "第 3 步：a 的完整 300 词元预填充 + b 的最后一个 200 词元分块 + c 在前缀缓存命中 256 词元之后的 40 词元预填充 "
        "+ d 在前缀缓存命中 128 词元之后的一个 64 词元分块；c、d 被准入；1 个等待")


def test_speculation_swaps_finishes_and_timeouts():
    tr = step(7, [decode("r0", spec=4, accepted=3), decode("r1", spec=2, accepted=0), decode("r2")],
              preempted=["r5", "r6"], out_blocks=6, in_blocks=2, finished=["r1", "r9"], timed_out=["r9"])
    assert step_sentence(tr) == (
        "step 7: 3 decodes (2 verifying 6 proposals, 3 accepted); r5, r6 preempted (no free block; 6 blocks swapped "
        "out to the CPU); 2 blocks swapped back in; r1 finished; r9 timed out; 0 waiting")
    assert step_sentence(step(0, [decode("r0")])) == "step 0: 1 decode; 0 waiting"


def test_an_empty_step_and_a_long_list():
    ids = [f"r{i}" for i in range(MAX_IDS + 5)]
    assert step_sentence(step(9, [], waiting=2, finished=ids)) == (
        "step 9: nothing scheduled; r0, r1, r2, r3 and 5 more finished; 2 waiting")
    assert "等另外 5 个" in step_sentence(step(9, [], finished=ids), "zh")
    with pytest.raises(ValueError, match="lang"):
        step_sentence(step(0, []), "fr")


_ids = st.lists(st.sampled_from([f"r{i}" for i in range(12)]), unique=True, max_size=6)


@settings(max_examples=200, deadline=None)
@given(decodes=st.integers(0, 20), prefills=st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 4096),
                                                               st.booleans()), max_size=4),
       preempted=_ids, admitted=_ids, waiting=st.integers(0, 500), lang=st.sampled_from(["en", "zh"]))
def test_every_sentence_carries_the_step_s_numbers(decodes, prefills, preempted, admitted, waiting, lang):
    chunks = [decode(f"d{i}") for i in range(decodes)]
    chunks += [ScheduledChunk(f"p{i}", n, pos, True, sampled) for i, (n, pos, sampled) in enumerate(prefills)]
    sentence = step_sentence(step(5, chunks, waiting=waiting, preempted=preempted, admitted=admitted), lang)
    assert sentence.startswith("step 5: " if lang == "en" else "第 5 步：")
    numbers = [int(x.replace(",", "")) for x in re.findall(r"\d[\d,]*", sentence)]
    assert waiting in numbers
    if decodes:
        assert decodes in numbers
    for i, (n, _, _) in enumerate(prefills):
        assert f"p{i}" in sentence and n in numbers
    for rid in preempted[:MAX_IDS] + admitted[:MAX_IDS]:
        assert re.search(rf"\b{rid}\b", sentence)
    assert ("preempted" in sentence or "被抢占" in sentence) == bool(preempted)


def test_sentences_of_a_real_run_name_its_preemptions(pressure_traces):
    sentences = step_sentences(pressure_traces)
    assert len(sentences) == len(pressure_traces)
    for tr, s in zip(pressure_traces, sentences):
        assert s.startswith(f"step {tr.step}: ") and s.endswith(f"; {tr.num_waiting} waiting")
        for rid in tr.preempted_ids[:MAX_IDS]:
            assert rid in s


@pytest.fixture(scope="module")
def pressure_traces():
    """A real engine run under memory pressure (bundled model): some steps preempt."""
    from minengine.viz import presets
    from minengine.viz.runner import DashboardConfig, run_workload
    from tests.dashboard_model import dashboard_model

    res = run_workload(DashboardConfig(num_kv_blocks=12, max_num_seqs=6, enable_prefix_caching=False,
                                       model=dashboard_model()), presets.memory_pressure(6, 32, 32))
    assert any(tr.preempted_ids for tr in res.traces)
    return res.traces


@settings(max_examples=60, deadline=None)
@given(preempted=st.lists(st.sampled_from([f"r{i}" for i in range(12)]), unique=True, min_size=1, max_size=6),
       out_blocks=st.sampled_from([0, 1, 2, 37]), in_blocks=st.sampled_from([0, 1, 5]))
def test_preemption_words_agree_with_how_many(preempted, out_blocks, in_blocks):
    """One request preempted: "its K/V"; several: "their K/V" (and 它们的 in Chinese); one block is "1 block"."""
    en = step_sentence(step(3, [], preempted=preempted, out_blocks=out_blocks, in_blocks=in_blocks), "en")
    zh = step_sentence(step(3, [], preempted=preempted, out_blocks=out_blocks, in_blocks=in_blocks), "zh")
    one = len(preempted) == 1
    if out_blocks == 0:
        assert ("its K/V" in en) == one and ("their K/V" in en) == (not one)
        assert ("其 K/V" in zh) == one and ("它们的 K/V" in zh) == (not one)
    else:
        assert "K/V" not in en and "K/V" not in zh
    for n, what in ((out_blocks, "swapped out"), (in_blocks, "swapped back in")):
        if n:
            assert (f"{n} block {what}" if n == 1 else f"{n} blocks {what}") in en
    assert not re.search(r"\b1 blocks\b", en)
