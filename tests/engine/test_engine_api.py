"""The public API: bad input rejected early, aborts in every state, stop strings, max_tokens=1, seeded
sampling, streaming outputs, metrics and traces."""

from __future__ import annotations

import pytest

from minengine import LLM, EngineConfig, LLMEngine, SamplingParams
from minengine.request import RequestStatus
from tests.conftest import drain

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


# the settings of this module's ``engine`` fixture (tests/conftest.py)
ENGINE_CONFIG = dict(max_model_len=512, num_kv_blocks=24, max_num_batched_tokens=64)


@pytest.mark.parametrize("prompt, params, field", [
    ("", GREEDY, "prompt is empty"),
    ({"prompt_token_ids": []}, GREEDY, "prompt is empty"),
    ({"prompt_token_ids": [5] * 600}, GREEDY, "max_model_len"),
    ({"prompt_token_ids": [5] * 380}, SamplingParams(max_tokens=10), "num_kv_blocks"),  # 25 blocks > 24
    ({"prompt_token_ids": [5, 99999]}, GREEDY, "prompt_token_ids"),
    (12, GREEDY, "prompt must be"),
])
def test_bad_prompts_rejected_while_engine_keeps_serving(engine, prompt, params, field):
    engine.add_request("good", "ROMEO:", GREEDY)
    with pytest.raises(ValueError, match=field):
        engine.add_request("bad", prompt, params)
    outs = drain(engine)
    assert outs["good"].finished and len(outs["good"].outputs[0].token_ids) == 8
    assert engine.kv_cache_manager.num_free_blocks == 24


@pytest.mark.parametrize("kwargs, field", [
    (dict(max_tokens=0), "max_tokens"), (dict(temperature=-0.1), "temperature"), (dict(top_p=0), "top_p"),
    (dict(top_p=1.5), "top_p"), (dict(top_k=-2), "top_k"), (dict(top_k=1.5), "top_k"),
    (dict(seed=-2), "seed"),  # -1 is vLLM's "no seed"
])
def test_bad_sampling_params(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("kwargs, field", [
    (dict(block_size=0), "block_size"), (dict(max_num_seqs=0), "max_num_seqs"),
    (dict(max_num_batched_tokens=-1), "max_num_batched_tokens"), (dict(num_kv_blocks=0), "num_kv_blocks"),
    (dict(dtype="int8"), "dtype"), (dict(preemption_mode="drop"), "preemption_mode"),
    (dict(long_prefill_token_threshold=-1), "long_prefill_token_threshold"),
])
def test_bad_config(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kwargs)


def test_config_checked_against_model(bundled_model):
    with pytest.raises(ValueError, match="max_model_len"):
        LLMEngine.from_config(model=bundled_model, max_model_len=10**6)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLMEngine.from_config(model=bundled_model, enable_chunked_prefill=False, max_num_batched_tokens=100,
                              max_model_len=512)


def test_duplicate_request_id(engine):
    engine.add_request("dup", "ROMEO:", GREEDY)
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("dup", "JULIET:", GREEDY)
    drain(engine)
    engine.add_request("dup", "JULIET:", GREEDY)  # free again once finished
    drain(engine)


@pytest.mark.parametrize("state", ["waiting", "mid-prefill", "running", "preempted", "finished", "unknown"])
def test_abort_in_every_state(bundled_model, state):
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=512, num_kv_blocks=12,
                                   max_num_batched_tokens=32, enable_prefix_caching=False)
    long_prompt = {"prompt_token_ids": list(range(3, 3 + 100))}
    engine.add_request("x", {"prompt_token_ids": list(range(200, 240))}, SamplingParams(temperature=0,
                       max_tokens=100, ignore_eos=True))
    engine.add_request("t", long_prompt, SamplingParams(temperature=0, max_tokens=80, ignore_eos=True))
    req = engine.scheduler.requests["t"]
    conditions = {
        "waiting": lambda: True,
        "mid-prefill": lambda: 0 < req.num_computed_tokens < req.num_prompt_tokens,
        "running": lambda: req.status is RequestStatus.RUNNING and req.num_output_tokens > 0,
        "preempted": lambda: req.status is RequestStatus.PREEMPTED,
        "finished": lambda: req.is_finished,
        "unknown": lambda: True,
    }
    while not conditions[state]():
        engine.step()
    engine.abort_request("nope" if state == "unknown" else "t")
    if state not in ("finished", "unknown"):
        assert req.status is RequestStatus.FINISHED_ABORTED
        assert engine.request_metrics["t"].finished_time is not None
    drain(engine)
    assert engine.kv_cache_manager.num_free_blocks == 12


def test_stop_string_across_tokens(bundled_model):
    llm = LLM(bundled_model, max_model_len=512)
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    (full,) = llm.generate("KING RICHARD III:\n", params, use_tqdm=False)
    ids = full.outputs[0].token_ids
    text = full.outputs[0].text
    # A stop string from the middle of token 5 to the middle of token 7 (token texts of >= 2 chars).
    pieces = [tok.decode(ids[:i]) for i in range(len(ids) + 1)]
    i = next(i for i in range(5, 30) if len(pieces[i + 1]) - len(pieces[i]) >= 2
             and len(pieces[i + 3]) - len(pieces[i + 2]) >= 2)
    start, end = len(pieces[i]) + 1, len(pieces[i + 3]) - 1
    stop = text[start:end]
    assert text.find(stop) == start, "pick a stop string that first occurs there"
    (cut,) = llm.generate("KING RICHARD III:\n", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True,
                                                               stop=[stop]), use_tqdm=False)
    c = cut.outputs[0]
    assert c.text == text[:start] and c.finish_reason == "stop" and c.stop_reason == stop
    assert len(c.token_ids) == i + 3  # stopped as soon as the token completing the string arrived
    assert llm.llm_engine.kv_cache_manager.num_free_blocks == llm.llm_engine.num_kv_blocks


def test_stop_token_ids_and_max_tokens_one(bundled_model):
    llm = LLM(bundled_model, max_model_len=512)
    (one,) = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)
    assert len(one.outputs[0].token_ids) == 1 and one.outputs[0].finish_reason == "length"
    assert one.metrics.tpot is None and one.metrics.ttft is not None
    (ref,) = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=10, ignore_eos=True), use_tqdm=False)
    third = ref.outputs[0].token_ids[2]
    (cut,) = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[third]),
                          use_tqdm=False)
    assert cut.outputs[0].token_ids == ref.outputs[0].token_ids[:ref.outputs[0].token_ids.index(third) + 1]
    assert cut.outputs[0].stop_reason == third


def test_seeded_sampling_independent_of_batch_and_chunking(bundled_model):
    seeded = SamplingParams(temperature=0.9, top_p=0.9, top_k=50, max_tokens=24, seed=1234, ignore_eos=True)
    other = SamplingParams(temperature=1.0, max_tokens=30, ignore_eos=True)
    prompt = "HAMLET:\nTo be, or not to be"
    alone = LLM(bundled_model, max_model_len=512).generate(prompt, seeded, use_tqdm=False)[0]
    mixed_llm = LLM(bundled_model, max_model_len=512, max_num_batched_tokens=8, seed=99)
    batch = ["ROMEO:", prompt * 3, "JULIET:\nO Romeo", prompt]
    mixed = mixed_llm.generate(batch, [other, other, other, seeded], use_tqdm=False)[3]
    assert alone.outputs[0].token_ids == mixed.outputs[0].token_ids
    different = LLM(bundled_model, max_model_len=512).generate(
        prompt, SamplingParams(temperature=0.9, top_p=0.9, top_k=50, max_tokens=24, seed=4321, ignore_eos=True),
        use_tqdm=False)[0]
    assert different.outputs[0].token_ids != alone.outputs[0].token_ids


def test_streaming_outputs_metrics_and_trace(bundled_model):
    engine = LLMEngine.from_config(model=bundled_model, max_model_len=512, max_num_batched_tokens=32)
    engine.add_request("a", "ROMEO:\n" * 20, SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))
    engine.add_request("b", "JULIET:", SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    seen = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            seen.append((o.request_id, len(o.outputs[0].token_ids), o.finished))
    a_counts = [n for rid, n, _ in seen if rid == "a"]
    assert a_counts == [1, 2, 3, 4, 5]
    assert [f for rid, _, f in seen if rid == "b"] == [False, False, True]
    m = engine.request_metrics["a"]
    assert m.ttft > 0 and m.tpot > 0 and len(m.itls) == 4 and m.time_in_queue >= 0
    assert abs(m.tpot - sum(m.itls) / 4) < 1e-9
    steps = engine.traces
    assert steps[0].admitted_ids == ["a"] and steps[0].num_prefill_tokens == 32  # a budget-limited chunk of a
    assert any(s.num_decode_tokens for s in steps)
    assert steps[0].block_tables["a"] and sum(steps[0].block_ref_counts) == sum(
        len(t) for t in steps[0].block_tables.values())
    s = engine.summary()
    assert s.num_requests == 2 and s.output_tokens == 8 and s.output_tok_s > 0 and s.ttft_p99 >= s.ttft_p50
    assert "TTFT" in s.as_table()


def test_token_ids_only_model(random_llama):
    llm = LLM(random_llama, max_model_len=256)
    assert llm.get_tokenizer() is None
    (out,) = llm.generate({"prompt_token_ids": [5, 6, 7]}, GREEDY, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 8 and out.outputs[0].text == ""
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate("text prompt", GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate({"prompt_token_ids": [5]}, SamplingParams(stop=["x"]), use_tqdm=False)


def test_generate_validates_whole_batch_first(bundled_model):
    llm = LLM(bundled_model, max_model_len=256)
    with pytest.raises(ValueError):
        llm.generate(["ROMEO:", ""], GREEDY, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_hf_loading_of_bundled_model(bundled_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(bundled_model)
    tok = AutoTokenizer.from_pretrained(bundled_model)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert model.config.max_position_embeddings >= 8192 and len(tok) == model.config.vocab_size


def test_generate_priority_argument(bundled_model):
    llm = LLM(bundled_model, max_model_len=256, scheduling_policy="priority", max_num_seqs=1)
    outs = llm.generate(["ROMEO:", "JULIET:"], GREEDY, use_tqdm=False, priority=[5, 0])
    m = [o.metrics for o in outs]
    assert m[1].first_token_time < m[0].first_token_time  # the more urgent (smaller) one ran first
    with pytest.raises(ValueError, match="priority"):
        llm.generate(["ROMEO:"], GREEDY, use_tqdm=False, priority=[1, 2])


@pytest.mark.parametrize("kwargs, field", [
    (dict(temperature=float("nan")), "temperature"), (dict(temperature=float("inf")), "temperature"),
    (dict(temperature=True), "temperature"), (dict(top_p=float("nan")), "top_p"), (dict(stop=123), "stop"),
    (dict(stop_token_ids=5), "stop_token_ids"), (dict(stop_token_ids=[True]), "stop_token_ids"),
    (dict(ignore_eos="no"), "ignore_eos"), (dict(seed=True), "seed"),
])
def test_more_bad_sampling_params(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_tiny_temperature_is_greedy(bundled_model):
    llm = LLM(bundled_model, max_model_len=256)
    tiny, greedy = llm.generate(["ROMEO:", "ROMEO:"], [SamplingParams(temperature=1e-40, max_tokens=8),
                                                        SamplingParams(temperature=0, max_tokens=8)], use_tqdm=False)
    assert tiny.outputs[0].token_ids == greedy.outputs[0].token_ids


@pytest.mark.parametrize("kwargs, field", [
    (dict(seed="x"), "seed"), (dict(seed=-1), "seed"), (dict(model=123), "model"), (dict(model=""), "model"),
    (dict(enable_chunked_prefill="no"), "enable_chunked_prefill"), (dict(enable_prefix_caching=1), "enable_prefix"),
    (dict(long_prefill_token_threshold=True), "long_prefill_token_threshold"), (dict(block_size=10**9), "block_size"),
    (dict(scheduling_policy="balanced", prefill_decode_ratio=1e308), "prefill_decode_ratio"),
])
def test_more_bad_config(kwargs, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**kwargs)


@pytest.mark.parametrize("kwargs, field", [
    (dict(num_kv_blocks=10**12), "num_kv_blocks"), (dict(kv_cache_memory_bytes=10**18), "kv_cache_memory_bytes"),
    (dict(preemption_mode="swap", swap_space_blocks=10**12), "swap_space_blocks"),
    (dict(tokenizer="/no/such/tokenizer"), "tokenizer"),
])
def test_impossible_sizes_and_paths_fail_early(bundled_model, kwargs, field):
    with pytest.raises(ValueError, match=field):
        LLMEngine.from_config(model=bundled_model, max_model_len=256, **kwargs)


def test_bad_request_fields_are_value_errors(engine):
    for prompt in ({"prompt_token_ids": 5}, {"prompt_token_ids": None}, {"prompt_token_ids": {1: 2}}):
        with pytest.raises(ValueError, match="prompt_token_ids"):
            engine.add_request("x", prompt, GREEDY)
    for when in ([1], "abc", float("nan"), float("inf")):
        with pytest.raises(ValueError, match="arrival_time"):
            engine.add_request("x", "ROMEO:", GREEDY, arrival_time=when)
    for rid in (None, 123, [1]):
        with pytest.raises(ValueError, match="request_id"):
            engine.abort_request(rid)
    assert not engine.has_unfinished_requests()


def test_generate_ids_do_not_collide_and_failures_leave_nothing_behind(bundled_model):
    llm = LLM(bundled_model, max_model_len=256)
    engine = llm.llm_engine
    engine.add_request("0", "ROMEO:", GREEDY)  # the user's own id "0"
    (out,) = llm.generate(["JULIET:"], GREEDY, use_tqdm=False)
    assert out.request_id != "0" and len(out.outputs[0].token_ids) == 8
    with pytest.raises(ValueError, match="prompts"):
        llm.generate(None, use_tqdm=False)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
