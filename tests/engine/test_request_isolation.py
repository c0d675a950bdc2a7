"""Request isolation in the engine (no HTTP): every field checked against its real range at the door
(``VLLMValidationError``, vLLM's name and a ``ValueError``); ``max_tokens`` beyond what fits is clamped offline;
one request's failure (its detokenizing, its statistics) costs no other request its output; a preemption made by
a step that is rolled back counts once everywhere; numpy ids are token ids; prompt dicts do not nest."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minengine import LLM, AsyncEngineArgs, AsyncLLMEngine, EngineConfig, LLMEngine, SamplingParams
from minengine.config import available_cpu_cores
from minengine.engine.detokenizer import IncrementalDetokenizer
from minengine.exceptions import RequestError, VLLMValidationError, show
from tests.conftest import drain

GREEDY = dict(temperature=0.0, ignore_eos=True)


# the settings of this module's ``engine`` fixture (tests/conftest.py)
ENGINE_CONFIG = dict(max_model_len=64, num_kv_blocks=64)


# ---- the error class ----------------------------------------------------------------------------------------

def test_validation_error_is_vllms_name_and_a_value_error():
    with pytest.raises(VLLMValidationError) as info:
        SamplingParams(top_p=2.0)
    assert isinstance(info.value, ValueError) and info.value.parameter == "top_p"
    assert str(info.value).endswith("(parameter=top_p)") and "(parameter" not in info.value.message  # vLLM's str
    with pytest.raises(ValueError):  # code written for minengine still catches it
        EngineConfig(block_size=0)
    with pytest.raises(VLLMValidationError, match="sampling_params has 1 entries for 2 prompts"):
        LLM.generate(object.__new__(LLM), ["a", "b"], [SamplingParams()])  # vLLM raises it there too


@pytest.mark.parametrize("kwargs, field, shown", [
    (dict(sampling_params={"max_tokens": 4}), "sampling_params", "got dict"),  # was "got str" (its keys)
    (dict(sampling_params=5), "sampling_params", "got int"),  # was a TypeError from list(5)
    (dict(sampling_params=iter([SamplingParams()])), "sampling_params", "got list_iterator"),
    (dict(sampling_params=SamplingParams(), priority=1.5), "priority", "got float"),
    (dict(sampling_params=SamplingParams(), priority={"a": 1}), "priority", "got dict"),
    (dict(sampling_params=SamplingParams(), priority="0"), "priority", "got str"),
])
def test_generate_names_a_wrong_typed_argument(kwargs, field, shown):
    """``LLM.generate`` refuses a ``sampling_params`` / ``priority`` of the wrong type by its own name and type,
    before touching the engine (the dict case is what a user coming from the OpenAI API writes)."""
    with pytest.raises(VLLMValidationError) as info:
        LLM.generate(object.__new__(LLM), ["a"], **kwargs)
    assert info.value.parameter == field and shown in info.value.message


# ---- (a) every integer and float field against its real range -----------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(n=10**400), "n"), (dict(n=2**16 + 1), "n"), (dict(seed=2**64), "seed"), (dict(seed=-2), "seed"),
    (dict(max_tokens=0), "max_tokens"), (dict(top_k=-2), "top_k"), (dict(temperature=math.inf), "temperature"),
    (dict(stop=["ok", "a\ud800"]), "stop"), (dict(stop_token_ids=[True]), "stop_token_ids"),
    (dict(stop=[[[[[[[[["deep"]]]]]]]]]), "stop"), (dict(min_tokens=5, max_tokens=2), "min_tokens"),
])
def test_sampling_params_out_of_range(kwargs, field):
    with pytest.raises(VLLMValidationError) as info:
        SamplingParams(**kwargs)
    assert info.value.parameter == field and field.split("_")[0] in info.value.message
    assert len(str(info.value)) < 400  # a 400-digit or 5,000-deep value is shown shortened


@pytest.mark.parametrize("kwargs, field", [
    (dict(seed=2**64), "seed"), (dict(max_num_seqs=2**31), "max_num_seqs"),
    (dict(max_num_batched_tokens=10**400), "max_num_batched_tokens"), (dict(num_kv_blocks=2**40), "num_kv_blocks"),
    (dict(swap_space_blocks=2**31), "swap_space_blocks"), (dict(priority_aging_steps=2**40), "priority_aging_steps"),
    (dict(num_cpu_threads=available_cpu_cores() + 1), "num_cpu_threads"), (dict(extra={"max_num_seq": 4}), "extra"),
    (dict(extra=[1]), "extra"), (dict(model=[[[[[[[[]]]]]]]]), "model"),
])
def test_engine_config_out_of_range(kwargs, field):
    with pytest.raises(VLLMValidationError) as info:
        EngineConfig(**kwargs)
    assert info.value.parameter == field and len(str(info.value)) < 400


def test_show_shortens_what_repr_cannot_print():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    assert show(deep) == "[[[[...]]]]" and show(10**5000).startswith("<an integer of")
    assert show("x" * 10_000).endswith("'") and len(show("x" * 10_000)) < 80


def test_max_tokens_beyond_the_model_is_clamped_and_costs_nobody_their_output(engine):
    """max_tokens=10**400 must not pass validation only to make its metrics raise after the step committed, losing
    the other request's output: it is cut to what fits (vLLM's offline behaviour) and both finish."""
    engine.add_request("huge", "ROMEO:", SamplingParams(max_tokens=10**400, min_tokens=10**399, **GREEDY))
    engine.add_request("small", "JULIET:", SamplingParams(max_tokens=8, **GREEDY))
    outs = drain(engine)
    assert set(outs) == {"huge", "small"} and engine.num_bookkeeping_errors == 0
    huge = outs["huge"]
    assert len(huge.prompt_token_ids) + len(huge.outputs[0].token_ids) == 64  # max_model_len
    assert huge.outputs[0].finish_reason == "length" and len(outs["small"].outputs[0].token_ids) == 8
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


def test_stop_token_ids_beyond_the_vocabulary_are_refused_at_the_door(engine):
    """2**70 reached the sampler's tensor of stop ids and failed the step of every request."""
    for ids in ([2**70], [engine.hf_config.vocab_size]):
        with pytest.raises(VLLMValidationError, match="vocabulary") as info:
            engine.add_request("bad", "ROMEO:", SamplingParams(stop_token_ids=ids, min_tokens=1))
        assert info.value.parameter == "stop_token_ids"
    assert not engine.has_unfinished_requests()


@given(n=st.integers(-2**70, 2**70), seed=st.one_of(st.none(), st.integers(-2**70, 2**70)),
       max_tokens=st.one_of(st.none(), st.integers(-2**70, 2**70)), min_tokens=st.integers(-2**70, 2**70),
       top_k=st.integers(-2**70, 2**70), stop_id=st.integers(-2**70, 2**70),
       temperature=st.floats(allow_nan=True, allow_infinity=True))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_integer_is_accepted_and_served_or_refused_at_the_door(engine, n, seed, max_tokens, min_tokens, top_k,
                                                                   stop_id, temperature):
    """The property: for any value of the integer and float fields, either SamplingParams / add_request refuse it
    with a VLLMValidationError, or the request is served to the end (no step raises, no block leaks)."""
    try:
        params = SamplingParams(n=n, seed=seed, max_tokens=max_tokens, min_tokens=min_tokens, top_k=top_k,
                                stop_token_ids=[stop_id], temperature=temperature)
        if params.n > 4:
            return  # in range, and served like any n; not worth the time here
        engine.add_request("p", {"prompt_token_ids": [5, 6, 7]}, params)
    except VLLMValidationError:
        assert not engine.has_unfinished_requests()
        return
    outs = drain(engine)
    assert outs["p"].finished and engine.num_bookkeeping_errors == 0
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


# Numbers at the edges of every representation: beyond a float (10**400), 64-bit, 32-bit, NaN, inf.
EDGE_NUMBERS = st.one_of(st.sampled_from([10**400, -10**400, 2**64, 2**63, -2**63 - 1, 2**31, -1, 0, 1, 2, 0.5,
                                          math.nan, math.inf, -math.inf, 1e308, -1e-300]),
                         st.integers(-2**70, 2**70), st.floats())
NUMERIC_PARAMS = sorted(f.name for f in dataclasses.fields(SamplingParams)
                        if f.type in ("int", "float", "int | None", "float | None"))


@given(fields=st.dictionaries(st.sampled_from(NUMERIC_PARAMS), EDGE_NUMBERS, min_size=1, max_size=3),
       request=st.dictionaries(st.sampled_from(["priority", "deadline", "arrival_time"]), EDGE_NUMBERS, max_size=2),
       bias=st.one_of(st.none(), EDGE_NUMBERS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_number_in_any_numeric_field_is_served_or_refused_at_the_door(engine, fields, request, bias):
    """The property over every numeric field of SamplingParams (found from its annotations, so a new field is
    covered), add_request's priority / deadline / arrival_time and a logit_bias value: a VLLMValidationError
    naming a field, or the request served to the end. 10**400 was an OverflowError (float fields, logit_bias,
    deadline, arrival_time) and a 1,329-bit priority was accepted."""
    fields = {**fields, "max_tokens": 2} if "max_tokens" not in fields else fields
    if bias is not None:
        fields["logit_bias"] = {5: bias}
    try:
        params = SamplingParams(**fields)
        if params.n > 2 or params.max_tokens is None or params.max_tokens > 4:
            return  # in range, and served like any value; not worth the time here
        engine.add_request("p", {"prompt_token_ids": [5, 6, 7]}, params, **request)
    except VLLMValidationError as exc:
        assert exc.parameter in {*fields, *request}, exc
        assert not engine.has_unfinished_requests()
        return
    outs = drain(engine)
    assert outs["p"].finished and engine.num_bookkeeping_errors == 0
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


@pytest.mark.parametrize("kwargs", [dict(bad_words=["ok", "a\ud800"]), dict(structured_outputs={"regex": "a\ud800"}),
                                    dict(structured_outputs={"choice": ["yes", "n\udc80o"]}),
                                    dict(structured_outputs={"grammar": 'root ::= "\ud800"'})])
def test_lone_surrogates_are_refused_in_every_text_field(engine, kwargs):
    """As in stop strings and prompts: bad_words and grammar texts were a TypeError or a bare codec error."""
    with pytest.raises(VLLMValidationError, match="lone surrogate") as info:
        engine.add_request("s", "ROMEO:", SamplingParams(max_tokens=2, **kwargs))
    assert info.value.parameter == next(iter(kwargs)) and not engine.has_unfinished_requests()


# ---- numpy ids, nested prompts ------------------------------------------------------------------------------

def test_numpy_integer_ids_are_token_ids(engine):
    want = engine.prompt_to_token_ids([5, 6, 7])
    for prompt in (np.array([5, 6, 7]), [np.int64(5), np.int32(6), 7], {"prompt_token_ids": np.array([5, 6, 7])},
                   {"prompt_token_ids": [np.uint16(5), 6, 7]}):
        text, ids = engine.prompt_to_token_ids(prompt)
        assert (text, ids) == want and all(type(t) is int for t in ids)
    params = SamplingParams(stop_token_ids=np.array([7, 8]), max_tokens=2)
    assert params.stop_token_ids == [7, 8] and all(type(t) is int for t in params.stop_token_ids)
    for bad in ([True, 5], [np.bool_(True), 5], [5.0, 6], np.array([[5, 6]])):
        with pytest.raises(VLLMValidationError, match="prompt_token_ids"):
            engine.prompt_to_token_ids(bad)


def test_a_deeply_nested_prompt_dict_is_a_clear_error(engine):
    """Section 4: {"prompt": {"prompt": ...}} 5,000 deep was a RecursionError."""
    prompt: object = "ROMEO:"
    for _ in range(5000):
        prompt = {"prompt": prompt}
    with pytest.raises(VLLMValidationError, match="does not nest") as info:
        engine.add_request("deep", prompt)
    assert info.value.parameter == "prompt"
    with pytest.raises(VLLMValidationError, match="does not nest"):
        engine.add_request("deep", {"prompt": {"prompt_token_ids": [5, 6]}})
    assert engine.prompt_to_token_ids({"prompt": "ROMEO:"}) == engine.prompt_to_token_ids("ROMEO:")
    assert not engine.has_unfinished_requests()


# ---- (b) one request's failure is its own -------------------------------------------------------------------

def _poison_detokenizer(monkeypatch, poisoned_prompt: list[int]) -> None:
    """Make the detokenizer of the request with ``poisoned_prompt`` raise on every token."""
    advanced = IncrementalDetokenizer.advanced

    def failing(self, token_id):
        if list(self.prompt_token_ids) == poisoned_prompt:
            raise UnicodeError("poisoned detokenizer")
        return advanced(self, token_id)

    monkeypatch.setattr(IncrementalDetokenizer, "advanced", failing)


def test_a_failing_detokenizer_names_its_request_and_the_step_rolls_back(bundled_model, monkeypatch):
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=128, num_kv_blocks=64)
    _poison_detokenizer(monkeypatch, [5, 6, 7])
    engine.add_request("ok", {"prompt_token_ids": [9, 10, 11]}, SamplingParams(max_tokens=6, **GREEDY))
    engine.add_request("bad", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(n=2, max_tokens=6, **GREEDY))
    with pytest.raises(RequestError) as info:
        engine.step()
    assert info.value.request_ids == ["bad"] and isinstance(info.value.__cause__, UnicodeError)  # the parent's id
    assert engine.traces[-1].rolled_back and not engine.traces[-1].chunks
    engine.abort_request(info.value.request_ids)  # what the server does: the culprit alone
    outs = drain(engine)
    (want,) = LLM(bundled_model, max_model_len=128).generate({"prompt_token_ids": [9, 10, 11]},
                                                           SamplingParams(max_tokens=6, **GREEDY), use_tqdm=False)
    assert outs["ok"].outputs[0].token_ids == want.outputs[0].token_ids
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks


def test_a_failing_statistic_after_the_commit_loses_no_output(bundled_model, monkeypatch):
    """After update_from_output the step is committed: a statistic that raises (what max_tokens=10**400 did) is
    logged and counted, and every output of the step still arrives, the culprit's too."""
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=128, num_kv_blocks=64)
    record = engine.stat_logger.record_finished

    def failing(finished):
        finished = list(finished)
        if any(m.num_prompt_tokens == 3 for m, *_ in finished):
            raise OverflowError("int too large to convert to float")
        record(finished)

    monkeypatch.setattr(engine.stat_logger, "record_finished", failing)
    engine.add_request("culprit", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4, **GREEDY))
    engine.add_request("other", {"prompt_token_ids": [9, 10, 11, 12]}, SamplingParams(max_tokens=4, **GREEDY))
    outs = drain(engine)
    assert {r: len(o.outputs[0].token_ids) for r, o in outs.items()} == {"culprit": 4, "other": 4}
    assert engine.num_bookkeeping_errors == 1
    successes = {m.labels["finished_reason"]: m.value for m in engine.get_metrics()
                 if m.name == "vllm:request_success"}
    assert successes["length"] == 1  # the other request's statistics were recorded
    engine.add_request("aborted", {"prompt_token_ids": [5, 6, 7]}, SamplingParams(max_tokens=4, **GREEDY))
    engine.abort_request("aborted")  # aborting records statistics too (the server's loop aborts on failures)
    assert engine.num_bookkeeping_errors == 2 and not engine.has_unfinished_requests()


def test_the_async_loop_fails_only_the_culprit(bundled_model, monkeypatch):
    aengine = AsyncLLMEngine.from_engine_args(AsyncEngineArgs(model=bundled_model, max_model_len=128,
                                                              num_kv_blocks=64))
    engine = aengine.engine
    _poison_detokenizer(monkeypatch, [5, 6, 7])

    async def collect(prompt, rid, n=1):
        params = SamplingParams(n=n, max_tokens=8, **GREEDY)
        return [o async for o in aengine.generate({"prompt_token_ids": prompt}, params, rid)]

    async def main():
        return await asyncio.gather(collect([9, 10, 11], "a"), collect([5, 6, 7], "bad", n=3),
                                    collect([12, 13, 14, 15], "b"), return_exceptions=True)

    try:
        a, bad, b = asyncio.run(asyncio.wait_for(main(), 60))
    finally:
        aengine.shutdown()
    assert isinstance(bad, RequestError) and bad.request_ids == ["bad"]
    ref = LLM(bundled_model, max_model_len=128).generate(
        [{"prompt_token_ids": [9, 10, 11]}, {"prompt_token_ids": [12, 13, 14, 15]}],
        SamplingParams(max_tokens=8, **GREEDY), use_tqdm=False)
    assert [a[-1].outputs[0].token_ids, b[-1].outputs[0].token_ids] == [o.outputs[0].token_ids for o in ref]
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
    assert {engine.request_metrics[f"{i}_bad"].finish_reason for i in range(3)} == {"abort"}


# ---- counters: a preemption of a rolled-back step counts once everywhere -------------------------------------

def _preemption_counts(engine) -> tuple[int, int, int, int]:
    metrics = sum(m.num_preemptions for m in engine.request_metrics.values())
    traces = sum(len(t.preempted_ids) for t in engine.traces)
    prometheus = next(m.value for m in engine.get_metrics() if m.name == "vllm:num_preemptions")
    return metrics, traces, engine.summary().num_preemptions, prometheus


def test_a_preemption_of_a_failed_step_counts_once_everywhere(bundled_model, monkeypatch):
    """Decision: the preemption stands (the victim's blocks are gone), so it counts everywhere: the request's
    metrics, a rolled-back StepTrace, summary() and vllm:num_preemptions."""
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=128, block_size=4, num_kv_blocks=12,
                                   max_num_batched_tokens=64)
    execute, failed = engine.runner.execute, []

    def fail_when_preempting(sched):
        if sched.preempted_ids and not failed:
            failed.append(list(sched.preempted_ids))
            raise RuntimeError("injected fault in a step that preempted")
        return execute(sched)

    monkeypatch.setattr(engine.runner, "execute", fail_when_preempting)
    for i in range(3):
        engine.add_request(str(i), {"prompt_token_ids": list(range(5 + i, 15 + i))},
                           SamplingParams(max_tokens=20, **GREEDY))
    outs = {}
    while engine.has_unfinished_requests():
        try:
            outs.update({o.request_id: o for o in engine.step() if o.finished})
        except RuntimeError:
            counts = _preemption_counts(engine)
            assert len(set(counts)) == 1 and counts[0] >= len(failed[0]), counts  # agree at once
            assert engine.traces[-1].rolled_back and engine.traces[-1].preempted_ids == failed[0]
    assert failed and len(outs) == 3
    counts = _preemption_counts(engine)
    assert len(set(counts)) == 1, counts
    assert engine.summary().num_steps == sum(not t.rolled_back for t in engine.traces)
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
