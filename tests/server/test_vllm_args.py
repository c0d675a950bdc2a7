"""``serve`` flags and ``EngineArgs`` defaults as vLLM's: one flag definition (``EngineArgs.add_cli_args``) for
every command, vLLM's ``None`` defaults, ``seed`` None / -1, ``dtype`` "half" / "float", a wall-clock
``arrival_time``, ``use_tqdm=<callable>``, and vLLM 0.33's import paths."""

from __future__ import annotations

import argparse
import dataclasses
import time

import pytest

from minengine import LLM, EngineArgs, EngineConfig, LLMEngine, SamplingParams
from minengine.__main__ import _config, build_parser
from minengine.engine.input_processor import wall_to_engine_clock
from minengine.timing import make_clock
from tests.conftest import drain

SMALL = dict(max_model_len=256, num_kv_blocks=64)


def _serve_args(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def _engine_dests(parser: argparse.ArgumentParser) -> set[str]:
    return {a.dest for a in parser._actions if a.dest not in ("help",)}


def test_serve_takes_every_engine_args_flag_from_one_definition(bundled_model):
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    engine_flags = _engine_dests(EngineArgs.add_cli_args(argparse.ArgumentParser()))
    for command in ("run", "generate", "serve", "bench-serve"):
        assert engine_flags <= _engine_dests(sub.choices[command]), command
    # the flags vLLM users pass that serve once refused
    a = _serve_args([bundled_model, "--dtype", "auto", "--tensor-parallel-size", "1", "--enforce-eager",
                     "--num-gpu-blocks-override", "40", "--generation-config", "vllm", "--max-model-len", "256",
                     "--api-key", "k1", "k2", "--chat-template", "{{ messages }}",
                     "--enable-tokenizer-info-endpoint", "--seed", "-1", "--block-size", "none"])
    assert a.api_key == ["k1", "k2"] and a.chat_template == "{{ messages }}" and a.enable_tokenizer_info_endpoint
    a.model = a.model_tag
    config = _config(a)
    assert (config.num_kv_blocks, config.dtype, config.seed, config.block_size, config.max_model_len) == \
        (40, "float32", 0, 16, 256)
    assert _serve_args([]).api_key is None and _serve_args([]).chat_template is None
    with pytest.raises(SystemExit):
        _serve_args(["--dtype", "float64"])


def test_vllm_none_defaults_seed_and_dtype_aliases():
    defaults = EngineConfig()
    none_args = EngineArgs(block_size=None, max_num_batched_tokens=None, max_num_seqs=None,
                           enable_chunked_prefill=None, enable_prefix_caching=None, seed=None)
    c = none_args.create_engine_config()
    for name in ("block_size", "max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill",
                 "enable_prefix_caching", "seed"):
        assert getattr(c, name) == getattr(defaults, name), name
    assert EngineArgs(seed=-1).create_engine_config().seed == 0
    assert EngineArgs(seed=7).create_engine_config().seed == 7
    assert EngineArgs(dtype="half").create_engine_config().dtype == "float16"
    assert EngineArgs(dtype="float").create_engine_config().dtype == "float32"
    with pytest.raises(ValueError, match="dtype"):
        EngineArgs(dtype="float64").create_engine_config()
    with pytest.raises(ValueError, match="block_size"):  # None means the default; a bad value is still bad
        EngineArgs(block_size=0).create_engine_config()
    assert SamplingParams(seed=-1).seed is None and SamplingParams(seed=3).seed == 3
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=-2)


def test_a_wall_clock_arrival_time_maps_onto_the_engine_clock_by_its_age(bundled_model):
    assert wall_to_engine_clock(5.0, now=10.0) == 5.0  # already the engine's
    assert wall_to_engine_clock(1.7e9, now=10.0, wall_now=1.7e9 + 2.0) == pytest.approx(8.0)  # 2 s old
    assert wall_to_engine_clock(1.7e9, now=10.0, wall_now=1.7e9 - 10) == 1.7e9  # the wall clock's future: not one
    assert wall_to_engine_clock(20.0, now=10.0) == 20.0  # a plain future engine time stays (and is refused)
    for clock in (time.perf_counter, make_clock("modelled", hardware="h100", model="llama-3-8b")):
        engine = LLMEngine(EngineConfig(model=bundled_model, **SMALL), clock=clock)
        engine.add_request("now", "ROMEO:", SamplingParams(max_tokens=2), arrival_time=time.time())
        engine.add_request("earlier", "ROMEO:", SamplingParams(max_tokens=2), arrival_time=time.time() - 0.5)
        m_now, m_earlier = engine.request_metrics["now"], engine.request_metrics["earlier"]
        assert m_now.arrival_time <= engine.clock() and engine.clock() - m_now.arrival_time < 0.25
        assert m_now.arrival_time - m_earlier.arrival_time == pytest.approx(0.5, abs=0.25)
        drain(engine)
        assert 0 <= m_now.ttft < m_earlier.ttft
        with pytest.raises(ValueError, match="arrival_time"):
            engine.add_request("future", "ROMEO:", SamplingParams(max_tokens=2), arrival_time=engine.clock() + 60)


def test_use_tqdm_callable_is_called_as_vllm_calls_it(bundled_model):
    calls = []

    class Bar:
        def __init__(self, **kwargs):
            calls.append(("init", kwargs))

        def update(self, n):
            calls.append(("update", n))

        def close(self):
            calls.append(("close",))

    llm = LLM(bundled_model, **SMALL)
    outs = llm.generate(["ROMEO:", "JULIET:"], SamplingParams(max_tokens=3), use_tqdm=Bar)
    assert len(outs) == 2
    assert calls[0] == ("init", {"total": 2, "desc": "Processed prompts", "dynamic_ncols": True})
    assert calls[1:] == [("update", 1), ("update", 1), ("close",)]
    calls.clear()
    llm.generate("ROMEO:", SamplingParams(max_tokens=2), use_tqdm=False)
    assert calls == []


def test_vllm_033_import_paths():
    from minengine.logprobs import Logprob, PromptLogprobs, SampleLogprobs
    from minengine.outputs import Logprob as OutputsLogprob
    from minengine.utils import FlexibleArgumentParser as Old
    from minengine.utils.argparse_utils import FlexibleArgumentParser

    assert Logprob is OutputsLogprob and Old is FlexibleArgumentParser
    assert PromptLogprobs and SampleLogprobs
    p = FlexibleArgumentParser()
    EngineArgs.add_cli_args(p)
    assert p.parse_args(["--max_num_seqs", "3"]).max_num_seqs == 3
    assert dataclasses.is_dataclass(EngineArgs)


def test_reset_prefix_cache_with_running_requests_preempts_them_by_recompute(bundled_model):
    def run(reset: bool):
        engine = LLMEngine(EngineConfig(model=bundled_model, preemption_mode="swap", **SMALL))
        for i in range(3):
            engine.add_request(str(i), "ROMEO:\nBut, soft! what light " * 4, SamplingParams(temperature=0.0,
                                                                                            max_tokens=20))
        for _ in range(3):
            engine.step()
        running = engine.scheduler.num_running
        if reset:
            assert not engine.reset_prefix_cache()  # requests hold blocks: refused, as before
            assert engine.reset_prefix_cache(reset_running_requests=True)
            assert engine.kv_cache_manager.num_used_blocks == 0 and engine.scheduler.num_running == 0
            assert engine.kv_cache_manager.pool.num_cached_free_blocks == 0  # the cache is empty
            assert engine.stat_logger.registry.get_sample_value(
                "vllm:num_preemptions_total", {"model_name": "tiny-shakespeare-llama", "engine": "0"}) == running
        outs = {rid: out.outputs[0].token_ids for rid, out in drain(engine).items()}
        assert engine.kv_cache_manager.num_used_blocks == 0
        return outs, [m.num_preemptions for m in engine.request_metrics.values()], running

    plain, _, _ = run(False)
    reset, preemptions, running = run(True)
    assert running > 0 and sum(preemptions) == running  # recompute even in swap mode: nothing was swapped
    assert reset == plain  # greedy output unchanged by the recompute
