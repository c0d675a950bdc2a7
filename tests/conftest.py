"""Shared fixtures and helpers: the bundled model, random-weight Llama/Qwen2/Mixtral/Qwen3-MoE checkpoints,
transformers references, a module's engine on the bundled model (``engine``, settings from the module's
``ENGINE_CONFIG``), a module's server (``server``) and ``drain``."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch

from minengine.config import BUNDLED_MODEL
from tests.prompts import TEXT, make_prompts

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def _save_random_model(config, out: Path, seed: int) -> str:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # larger-than-default init so outputs are not a flat distribution
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
            elif p.dim() == 1 and p.shape[0] != config.hidden_size and p.shape[0] != getattr(config, "head_dim", 0):
                p.normal_(0, 0.05)  # biases
    model.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def bundled_model() -> str:
    if not (Path(BUNDLED_MODEL) / "config.json").exists():
        pytest.fail("bundled model missing: run scripts/train_tiny_model.py")
    return BUNDLED_MODEL


@pytest.fixture(scope="module")
def engine(request, bundled_model):
    """One ``LLMEngine`` on the bundled model per test module, shared by its tests (each test leaves it idle).

    Its settings are the module's ``ENGINE_CONFIG`` dict of ``EngineConfig`` fields (``{}`` when absent): the pool
    size, context length and token budget a module's assertions count on are written in that module."""
    from minengine import LLMEngine

    return LLMEngine.from_config(model=bundled_model, **getattr(request.module, "ENGINE_CONFIG", {}))


@pytest.fixture(scope="module")
def server(request, bundled_model):
    """A server on the bundled model in this process, on a free loopback port, shared by a module's tests
    (``tests.server_helpers.running_server``): the module's ``SERVER_FRONTEND`` (``FrontendArgs``; None: the
    defaults) and ``SERVER_ENGINE_CONFIG`` (engine settings over ``SERVER_CONFIG``; absent: ``{}``)."""
    from tests.server_helpers import running_server

    frontend = getattr(request.module, "SERVER_FRONTEND", None)
    with running_server(bundled_model, frontend, **getattr(request.module, "SERVER_ENGINE_CONFIG", {})) as running:
        yield running


def drain(engine) -> dict:
    """Step ``engine`` until no request is unfinished; returns {request id: its finished ``RequestOutput``} for
    each request that finished during these steps."""
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({out.request_id: out for out in engine.step() if out.finished})
    return finished


@pytest.fixture(scope="session")
def random_llama(tmp_path_factory) -> str:
    """A random-weight Llama with grouped-query attention (4 query heads, 2 KV heads), no tokenizer."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    return _save_random_model(cfg, tmp_path_factory.mktemp("llama"), seed=1)


@pytest.fixture(scope="session")
def random_qwen2(tmp_path_factory) -> str:
    """A random-weight Qwen2 (q/k/v biases, GQA, tied embeddings), no tokenizer."""
    from transformers import Qwen2Config

    cfg = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=2048,
                      tie_word_embeddings=True, use_sliding_window=False, bos_token_id=1, eos_token_id=2)
    return _save_random_model(cfg, tmp_path_factory.mktemp("qwen2"), seed=2)


@pytest.fixture(scope="session")
def random_mixtral(tmp_path_factory) -> str:
    """A random-weight Mixtral: 2 layers, 4 experts, top-2 (softmax over the top-2 logits), GQA, no tokenizer."""
    from transformers import MixtralConfig

    cfg = MixtralConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    return _save_random_model(cfg, tmp_path_factory.mktemp("mixtral"), seed=4)


@pytest.fixture(scope="session")
def random_qwen3_moe(tmp_path_factory) -> str:
    """A random-weight Qwen3-MoE: 3 layers (the middle one dense, ``mlp_only_layers``), 8 experts, top-2
    renormalised (``norm_topk_prob``), q/k norms, GQA, no tokenizer."""
    from transformers import Qwen3MoeConfig

    cfg = Qwen3MoeConfig(vocab_size=512, hidden_size=64, intermediate_size=128, moe_intermediate_size=48,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
                         max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    return _save_random_model(cfg, tmp_path_factory.mktemp("qwen3_moe"), seed=5)


@functools.lru_cache(maxsize=4)
def hf_model(path: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@functools.cache
def hf_greedy(path: str, prompt: tuple[int, ...], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate`` (EOS ignored), the reference every engine run must match."""
    model = hf_model(path)
    ids = torch.tensor([list(prompt)])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def generate_and_compare(model: str, prompts: list[list[int]], greedy, **config):
    """Run ``LLM(model, **config)`` on ``prompts`` with ``greedy`` (``SamplingParams``, temperature 0, EOS
    ignored) and check each output equals transformers' greedy tokens and every KV block is free again; the LLM."""
    from minengine import LLM

    llm = LLM(model, **config)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        assert out.outputs[0].token_ids == hf_greedy(model, tuple(prompt), greedy.max_tokens), (
            f"prompt of {len(prompt)} tokens")
    engine = llm.llm_engine
    assert engine.kv_cache_manager.num_free_blocks == engine.num_kv_blocks  # every block is free again
    return llm


@pytest.fixture(scope="session")
def bundled_prompts(bundled_model) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bundled_model)
    return make_prompts(tok(TEXT)["input_ids"])


@pytest.fixture(scope="session")
def random_prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    stream = torch.randint(3, 512, (1200,), generator=g).tolist()
    return make_prompts(stream)
