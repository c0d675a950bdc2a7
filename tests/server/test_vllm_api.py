"""vLLM API parity: EngineArgs and the mapped keywords, SamplingParams' vLLM fields and meanings, n > 1,
output kinds, LLM.chat / get_metrics / reset_prefix_cache / get_default_sampling_params, prompt types."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from minengine import (
    LLM,
    EngineArgs,
    LLMEngine,
    RequestOutputKind,
    SamplingParams,
    TextPrompt,
    TokensPrompt,
)
from minengine.engine.output_processor import streamable_length
from minengine.metrics.reader import Counter, Gauge, Histogram
from minengine.worker.model_runner import kv_bytes_per_block
from tests.conftest import drain

SMALL = dict(max_model_len=256, num_kv_blocks=64)


@pytest.fixture(scope="module")
def llm(bundled_model):
    return LLM(bundled_model, disable_log_stats=False, **SMALL)  # get_metrics below: vLLM's LLM keeps none by default


def test_llm_keeps_no_prometheus_series_unless_asked(bundled_model):
    """As vLLM's ``LLM``: ``disable_log_stats`` defaults to True offline, so ``get_metrics`` says how to turn it on."""
    quiet = LLM(bundled_model, **SMALL)
    assert quiet.llm_engine.config.disable_log_stats
    with pytest.raises(RuntimeError, match="disable_log_stats"):
        quiet.get_metrics()


@pytest.mark.parametrize("kwargs, field", [
    (dict(n=0), "n"), (dict(presence_penalty=2.5), "presence_penalty"), (dict(frequency_penalty=-3),
                                                                         "frequency_penalty"),
    (dict(repetition_penalty=0), "repetition_penalty"), (dict(min_p=1.5), "min_p"), (dict(min_tokens=-1), "min_tokens"),
    (dict(min_tokens=20, max_tokens=10), "min_tokens"), (dict(logprobs=-2), "logprobs"),
    (dict(prompt_logprobs=-1), "prompt_logprobs"), (dict(include_stop_str_in_output=1), "include_stop_str_in_output"),
    (dict(output_kind="delta"), "output_kind"), (dict(max_tokens=0), "max_tokens"), (dict(top_k=-3), "top_k"),
])
def test_bad_vllm_sampling_fields(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_vllm_defaults_and_meanings(llm):
    p = SamplingParams()
    assert (p.n, p.top_k, p.max_tokens, p.min_p, p.repetition_penalty, p.output_kind) == \
        (1, 0, 16, 0.0, 1.0, RequestOutputKind.CUMULATIVE)
    assert SamplingParams(output_kind=1).output_kind is RequestOutputKind.DELTA
    base = dict(temperature=1.0, seed=5, max_tokens=12)
    a, b, c, d = llm.generate(["ROMEO:"] * 4, [SamplingParams(top_k=k, **base) for k in (0, -1, 2048, 5000)],
                              use_tqdm=False)  # the bundled vocabulary: 2,048 tokens
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == c.outputs[0].token_ids == d.outputs[0].token_ids
    (full,) = llm.generate({"prompt_token_ids": [5] * 200}, SamplingParams(max_tokens=None, ignore_eos=True),
                           use_tqdm=False)
    assert len(full.outputs[0].token_ids) == 56 and full.outputs[0].finish_reason == "length"  # to max_model_len


def test_n_fans_out_into_seeded_children(llm):
    engine = llm.llm_engine
    (par,) = llm.generate("HAMLET:", SamplingParams(n=3, temperature=0.9, seed=11, max_tokens=10), use_tqdm=False)
    assert [c.index for c in par.outputs] == [0, 1, 2] and par.finished
    singles = llm.generate(["HAMLET:"] * 3, [SamplingParams(temperature=0.9, seed=11 + i, max_tokens=10)
                                             for i in range(3)], use_tqdm=False)
    assert [c.token_ids for c in par.outputs] == [s.outputs[0].token_ids for s in singles]  # vLLM: seed + index
    assert len({tuple(c.token_ids) for c in par.outputs}) > 1
    (greedy,) = llm.generate("HAMLET:\n" * 5, SamplingParams(n=2, temperature=0, max_tokens=8), use_tqdm=False)
    assert greedy.outputs[0].token_ids == greedy.outputs[1].token_ids
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
    assert not engine.output_processor.states and not engine.output_processor.parents


def test_output_kinds_and_parent_abort(bundled_model):
    engine = LLMEngine.from_config(model=bundled_model, **SMALL)
    kinds = {"cum": RequestOutputKind.CUMULATIVE, "delta": RequestOutputKind.DELTA,
             "final": RequestOutputKind.FINAL_ONLY}
    for rid, kind in kinds.items():
        assert engine.add_request(rid, "ROMEO:", SamplingParams(temperature=0, max_tokens=10, output_kind=kind)) == rid
    assert engine.add_request("pair", TextPrompt(prompt="ROMEO:"), SamplingParams(
        n=2, temperature=0, max_tokens=10, output_kind=RequestOutputKind.DELTA)) == "pair"
    seen = {rid: [] for rid in (*kinds, "pair")}
    while engine.has_unfinished_requests():
        for out in engine.step():
            seen[out.request_id].append(out)
    cum, delta, final, pair = (seen[k] for k in ("cum", "delta", "final", "pair"))
    assert len(cum) == len(delta) == 10 and len(final) == 1 and final[0].finished
    text = cum[-1].outputs[0].text
    assert "".join(o.outputs[0].text for o in delta) == text == final[0].outputs[0].text
    assert sum((o.outputs[0].token_ids for o in delta), []) == cum[-1].outputs[0].token_ids
    assert all(len(o.outputs) == 2 for o in pair) and pair[-1].finished
    assert "".join(o.outputs[1].text for o in pair) == text
    engine.add_request("gone", TokensPrompt(prompt_token_ids=[5, 6, 7]), SamplingParams(n=3, max_tokens=50))
    engine.step()
    engine.abort_request("gone")  # the parent id aborts every child
    assert not engine.has_unfinished_requests() and not engine.output_processor.parents
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("pair2", "x", SamplingParams(n=2))
        engine.add_request("pair2", "y", SamplingParams())


@pytest.mark.parametrize("text, stop, want", [
    ("hello wor", ["world"], 6), ("hello", ["lo!"], 3), ("abc\ufffd", [], 3), ("abc", ["x"], 3),
    ("end\n\n", ["\n\nROMEO"], 3), ("aaa", ["ab"], 2),
])
def test_streamable_length_holds_back_what_could_still_change(text, stop, want):
    assert streamable_length(text, stop) == want


def test_engine_args_cli_round_trip_and_mapping(bundled_model):
    parser = EngineArgs.add_cli_args(argparse.ArgumentParser())
    args = parser.parse_args(["--model", bundled_model, "--max-model-len", "256", "--num-gpu-blocks-override", "48",
                              "--enforce-eager", "--tensor-parallel-size", "1", "--no-enable-prefix-caching",
                              "--scheduling-policy", "fcfs", "--dtype", "auto", "--gpu-memory-utilization", "0.5"])
    ea = EngineArgs.from_cli_args(args)
    assert ea.max_model_len == 256 and ea.enforce_eager and ea.enable_prefix_caching is False
    config = ea.create_engine_config()
    assert (config.num_kv_blocks, config.scheduling_policy, config.dtype, config.gpu_memory_utilization) == \
        (48, "decode-first", "float32", 0.5)
    engine = LLMEngine.from_engine_args(ea)
    assert engine.num_kv_blocks == 48
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        EngineArgs(model=bundled_model, pipeline_parallel_size=2).create_engine_config()
    assert EngineArgs(model=bundled_model, tensor_parallel_size=2).create_engine_config().tensor_parallel_size == 2
    with pytest.raises(ValueError, match="quantization"):
        EngineArgs(model=bundled_model, quantization="awq").create_engine_config()
    with pytest.raises(TypeError, match="EngineArgs"):
        LLM(bundled_model, no_such_option=1)


def test_gpu_memory_utilization_and_swap_space(bundled_model):
    from minengine.worker.kv_pool import available_bytes

    fraction = 100 * 32768 / available_bytes("cpu")  # about 100 blocks of 32 KiB (the bundled model)
    small = LLM(bundled_model, max_model_len=256, gpu_memory_utilization=fraction)
    assert 50 <= small.llm_engine.num_kv_blocks <= 200  # free memory moves a little between the two reads
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        LLM(bundled_model, gpu_memory_utilization=1e-15)
    swap = LLM(bundled_model, max_model_len=256, preemption_mode="swap", swap_space=0.01, num_kv_blocks=32)
    engine = swap.llm_engine
    bpb = kv_bytes_per_block(engine.model, 16, engine.runner.dtype)
    assert engine.num_swap_blocks == int(0.01 * 2**30) // bpb
    llm = LLM(bundled_model, max_model_len=256, tensor_parallel_size=1, enforce_eager=True, disable_log_stats=False,
              trust_remote_code=False, dtype="auto", seed=0)
    assert llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)[0].finished


def test_revision_goes_to_the_hub_download(monkeypatch, tmp_path):
    import huggingface_hub

    from minengine.models import loader

    seen = {}

    def fake_download(repo_id, allow_patterns, revision=None):
        seen.update(repo_id=repo_id, revision=revision)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert loader.resolve_model_path("org/model", revision="abc123") == tmp_path
    assert seen == {"repo_id": "org/model", "revision": "abc123"}


def test_chat_metrics_reset_and_default_params(bundled_model, llm, tmp_path):
    tok = llm.get_tokenizer()
    conv = [{"role": "user", "content": "Good morrow."}]
    (out,) = llm.chat(conv, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert out.prompt == "ROMEO:\nGood morrow.\n\nJULIET:\n" and out.prompt_token_ids == tok(out.prompt)["input_ids"]
    two = llm.chat([conv, conv + [{"role": "assistant", "content": "Sir?"}, {"role": "user", "content": "Aye."}]],
                   SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    assert two[0].outputs[0].text == out.outputs[0].text and "JULIET:\nSir?" in two[1].prompt
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"content": "no role"}], use_tqdm=False)
    metrics = {m.name: m for m in llm.get_metrics()}
    assert isinstance(metrics["vllm:num_requests_running"], Gauge)
    assert isinstance(metrics["vllm:generation_tokens"], Counter) and metrics["vllm:generation_tokens"].value > 0
    ttft = metrics["vllm:time_to_first_token_seconds"]
    assert isinstance(ttft, Histogram) and ttft.count > 0 and ttft.buckets["+Inf"] == ttft.count
    engine = llm.llm_engine
    engine.add_request("busy", "ROMEO:", SamplingParams(max_tokens=5))
    engine.step()
    assert llm.reset_prefix_cache() is False  # a request holds blocks
    drain(engine)
    assert llm.reset_prefix_cache() is True and engine.kv_cache_manager.pool.num_cached_free_blocks == 0
    assert llm.get_default_sampling_params() == SamplingParams()
    model = tmp_path / "model"
    shutil.copytree(bundled_model, model)
    (model / "generation_config.json").write_text(json.dumps({"temperature": 0.6, "top_k": 20,
                                                              "max_new_tokens": 7, "eos_token_id": 0}))
    custom = LLM(str(model), **SMALL)
    d = custom.get_default_sampling_params()
    assert (d.temperature, d.top_k, d.max_tokens) == (0.6, 20, 7)
    (o,) = custom.generate("ROMEO:", use_tqdm=False)  # no params: the model's defaults
    assert len(o.outputs[0].token_ids) <= 7


def test_priority_ints_and_prompt_types(bundled_model):
    llm = LLM(bundled_model, **SMALL, scheduling_policy="priority", max_num_seqs=1)
    tok = llm.get_tokenizer()
    outs = llm.generate([TextPrompt(prompt="ROMEO:"), TokensPrompt(prompt_token_ids=tok("ROMEO:")["input_ids"])],
                        SamplingParams(temperature=0, max_tokens=6), priority=[3, 1], use_tqdm=False)
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    assert outs[1].metrics.first_token_time < outs[0].metrics.first_token_time
    (one,) = llm.generate("ROMEO:", SamplingParams(temperature=0, max_tokens=6), priority=2, use_tqdm=False)
    assert one.outputs[0].token_ids == outs[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="priority"):
        llm.generate("ROMEO:", SamplingParams(max_tokens=2), priority=["high"], use_tqdm=False)


def test_include_stop_str_in_output(llm):
    base = dict(temperature=0, max_tokens=30, ignore_eos=True)
    (full,) = llm.generate("KING RICHARD III:\n", SamplingParams(**base), use_tqdm=False)
    text = full.outputs[0].text
    stop = text[8:12]
    assert text.find(stop) == 8
    cut, kept = llm.generate(["KING RICHARD III:\n"] * 2, [SamplingParams(stop=[stop], **base), SamplingParams(
        stop=[stop], include_stop_str_in_output=True, **base)], use_tqdm=False)
    assert cut.outputs[0].text == text[:8] and kept.outputs[0].text == text[:12]
    assert kept.outputs[0].stop_reason == stop and kept.outputs[0].finish_reason == "stop"
