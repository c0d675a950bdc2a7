"""The compiled decode door (``worker/compiled_decode.py``): greedy tokens identical to transformers with
``torch.compile`` on, through prefill chunks, mixed batches and batch sizes that change every step; the graph
compiled once for all of them; the eager fallback when compiling fails; the default rule; ``enforce_eager``'s
validation."""

from __future__ import annotations

import logging

import pytest
import torch

from minengine import LLM, SamplingParams
from minengine.config import EngineConfig
from minengine.exceptions import VLLMValidationError
from minengine.layers import cpu_attention
from minengine.worker.compiled_decode import CompiledDecode, inductor_cache_dir, should_compile
from tests.conftest import generate_and_compare

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def kernel_ready():
    """The door compiles decode steps once the C++ attention kernel is ready (before, the steps run eagerly)."""
    if cpu_attention.get_kernel() is None:
        pytest.skip("the C++ attention kernel does not build here: the door never opens")


def graphs_compiled() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def compiled_door(llm: LLM) -> CompiledDecode:
    door = llm.llm_engine.runner.graphs
    assert isinstance(door, CompiledDecode) and door.failed is None
    return door


@pytest.mark.slow
def test_bundled_model_matches_transformers_compiled(bundled_model, bundled_prompts):
    """Chunks of 16 tokens mix prefill chunks with decodes (those steps run eagerly); the decode-only steps at the
    end run compiled (batches of every size: ``test_batches_of_1_to_n_compile_once``)."""
    before = graphs_compiled()
    llm = generate_and_compare(bundled_model, bundled_prompts, GREEDY, max_model_len=2048,
                               max_num_batched_tokens=16, enforce_eager=False)
    door = compiled_door(llm)
    assert door.num_replays > 0 and door.num_eager_fallbacks > 0
    traces = llm.llm_engine.traces
    assert any(t.num_prefill_tokens and t.num_decode_tokens for t in traces)  # mixed steps happened
    assert door.num_replays == sum(1 for t in traces if t.num_decode_tokens and not t.num_prefill_tokens)
    assert graphs_compiled() - before <= 1


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["random_llama", "random_qwen2"])
def test_random_models_match_transformers_compiled(request, random_prompts, arch):
    model = request.getfixturevalue(arch)
    llm = generate_and_compare(model, random_prompts, GREEDY, max_model_len=2048, max_num_seqs=3,
                               max_num_batched_tokens=128, enforce_eager=False)
    assert compiled_door(llm).num_replays > 0


@pytest.mark.slow
def test_batches_of_1_to_n_compile_once(bundled_model):
    """Batches of 1..8 decodes (each prompt set run to the end, so every size also shrinks to 1) and block tables
    growing past several blocks: at most one graph, however the sizes change."""
    llm = LLM(bundled_model, enforce_eager=False)
    eager = LLM(bundled_model, enforce_eager=True)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    before = graphs_compiled()
    for n in range(1, 9):
        prompts = [{"prompt_token_ids": [5 + i] * (3 + 7 * i)} for i in range(n)]
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert got == [o.outputs[0].token_ids for o in eager.generate(prompts, params, use_tqdm=False)]
    assert compiled_door(llm).num_replays >= 8 * 39
    assert graphs_compiled() - before <= 1


@pytest.mark.slow
def test_a_failed_compile_logs_once_and_runs_eager(bundled_model, monkeypatch, tmp_path, caplog):
    """No usable C++ compiler: the first decode step's compile fails, the door says so once, and every step runs
    the eager forward with the same tokens."""
    import torch._inductor.config as inductor_config

    torch._dynamo.reset()  # no graph compiled earlier in this process may be reused
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))  # nor one in the cache
    monkeypatch.setattr(inductor_config, "fx_graph_cache", False)
    monkeypatch.setattr(inductor_config.cpp, "cxx", (str(tmp_path / "no-such-compiler"),))
    prompts = [{"prompt_token_ids": [7] * 20}, {"prompt_token_ids": [9] * 33}]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in LLM(bundled_model, enforce_eager=True).generate(prompts, params,
                                                                                                 use_tqdm=False)]
    llm = LLM(bundled_model, enforce_eager=False)
    with caplog.at_level(logging.WARNING, logger="minengine.worker.compiled_decode"):
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    door = llm.llm_engine.runner.graphs
    assert got == expected
    assert door.failed is not None and door.num_replays == 0
    assert sum("torch.compile failed" in r.getMessage() for r in caplog.records) == 1
    torch._dynamo.reset()


def _model(config) -> torch.nn.Module:
    from transformers import LlamaConfig

    from minengine.models.llama import LlamaForCausalLM

    with torch.device("meta"):  # the parameters' sizes only, no memory
        return LlamaForCausalLM(LlamaConfig(**config))


SMOLLM_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                   num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)


def test_only_enforce_eager_false_compiles():
    big, tiny = _model(SMOLLM_135M), _model(TINY)
    f32 = torch.float32
    assert not should_compile(None, big, CPU, "cpu", f32, f32) and not should_compile(None, tiny, CPU, "cpu", f32, f32)
    assert should_compile(False, tiny, CPU, "cpu", f32, f32) and should_compile(False, big, CPU, "cpu", f32, f32)
    assert not should_compile(True, big, CPU, "cpu", f32, f32)
    # where the door does not apply: the reference attention, an FP8 cache, float16, a GPU
    assert not should_compile(False, big, CPU, "reference", f32, f32)
    assert not should_compile(False, big, CPU, "cpu", f32, torch.float8_e4m3fn)
    assert not should_compile(False, big, CPU, "cpu", torch.float16, torch.float16)
    assert not should_compile(False, big, torch.device("cuda"), "triton", f32, f32)


def test_a_default_engine_on_the_bundled_model_stays_eager(bundled_model):
    assert LLM(bundled_model).llm_engine.runner.graphs is None


def test_the_inductor_cache_is_per_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = inductor_cache_dir()
    assert path.parent == tmp_path / "minengine" / "torchinductor" and "_" in path.name
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # a user's own setting wins
    assert inductor_cache_dir() == tmp_path / "mine"


@pytest.mark.parametrize("value", ["yes", 1, 0.0])
def test_enforce_eager_must_be_a_bool_or_none(value):
    with pytest.raises(VLLMValidationError, match="enforce_eager must be True, False or None"):
        EngineConfig(enforce_eager=value).validate()
