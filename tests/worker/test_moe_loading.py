"""Loading mixture-of-experts checkpoints: per-expert tensors stacked into the model's experts, the sparse and dense
layers where transformers puts them, and what the loader refuses, each with a clear error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from minengine.layers.moe import SparseMoeBlock
from minengine.models.loader import check_model_config, load_model
from minengine.models.moe import MoeForCausalLM, moe_settings
from minengine.models.moe_checkpoint import stack_experts


@pytest.mark.parametrize("arch", ["random_mixtral", "random_qwen3_moe"])
def test_weights_match_transformers(request, arch):
    from tests.conftest import hf_model

    path = request.getfixturevalue(arch)
    ours, cfg, _ = load_model(path)
    theirs = dict(hf_model(path).named_parameters())
    experts_seen = 0
    for name, p in ours.named_parameters():
        if ".experts." not in name:
            assert torch.equal(p, theirs[name]), name
            continue
        layer = name.rpartition(".experts.")[0]
        gate, up = theirs[f"{layer}.experts.gate_up_proj"].chunk(2, dim=1)  # transformers' [E, 2I, H]
        want = {"gate_proj": gate, "up_proj": up, "down_proj": theirs[f"{layer}.experts.down_proj"]}
        assert torch.equal(p, want[name.rpartition(".")[2]]), name
        experts_seen += 1
    assert experts_seen == 3 * sum(isinstance(m, SparseMoeBlock) for m in ours.modules()) > 0


def test_qwen3_moe_sparse_layers_are_where_transformers_puts_them():
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=16, intermediate_size=32, moe_intermediate_size=8,
                         num_hidden_layers=6, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                         num_experts=4, num_experts_per_tok=2, decoder_sparse_step=2, mlp_only_layers=[3])
    theirs = AutoModelForCausalLM.from_config(cfg)
    ours = MoeForCausalLM(cfg, qk_norm=True)
    want = [isinstance(layer.mlp, Qwen3MoeSparseMoeBlock) for layer in theirs.model.layers]
    assert [isinstance(layer.mlp, SparseMoeBlock) for layer in ours.model.layers] == want
    assert want == [False, True, False, False, False, True]
    assert moe_settings(cfg).sparse_layers == {1, 5}


def test_stacking_names_the_layer_whose_experts_are_incomplete():
    experts = {f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight": torch.full((3, 2), float(e))
               for e in range(3) for w in ("w1", "w2", "w3")}
    router = {"model.layers.0.block_sparse_moe.gate.weight": torch.zeros(3, 2)}
    out = stack_experts({**experts, **router}, 3)
    assert set(out) == {"model.layers.0.mlp.gate.weight"} | {
        f"model.layers.0.mlp.experts.{p}" for p in ("gate_proj", "up_proj", "down_proj")}
    assert out["model.layers.0.mlp.experts.up_proj"][:, 0, 0].tolist() == [0.0, 1.0, 2.0]
    del experts["model.layers.0.block_sparse_moe.experts.1.w2.weight"]
    with pytest.raises(ValueError, match=r"model\.layers\.0: the checkpoint's down_proj experts .*missing \[1\]"):
        stack_experts(experts, 3)
    with pytest.raises(ValueError, match=r"extra \[3\]"):
        stack_experts({**experts, "model.layers.0.mlp.experts.3.gate_proj.weight": torch.zeros(3, 2)}, 3)


def _copy_with_config(path: str, out: Path, **changes) -> str:
    shutil.copytree(path, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(changes)
    (out / "config.json").write_text(json.dumps(cfg))
    return str(out)


def test_what_the_loader_refuses(random_mixtral, tmp_path):
    with pytest.raises(ValueError, match="quantization='int8' is not supported for mixtral"):
        load_model(random_mixtral, quantization="int8")
    from minengine.models.loader import load_config

    cfg = load_config(Path(random_mixtral))
    with pytest.raises(ValueError, match="tensor_parallel_size=2 on a mixtral model needs enable_expert_parallel=True"):
        check_model_config(cfg, Path(random_mixtral), tensor_parallel_size=2)
    windowed = _copy_with_config(random_mixtral, tmp_path / "windowed", sliding_window=32)
    with pytest.raises(ValueError, match="sliding-window"):
        load_model(windowed)
    too_many = _copy_with_config(random_mixtral, tmp_path / "top5", num_experts_per_tok=5)
    with pytest.raises(ValueError, match="num_experts_per_tok must be between 1 and the number of experts"):
        load_model(too_many)
    gelu = _copy_with_config(random_mixtral, tmp_path / "gelu", hidden_act="gelu")
    with pytest.raises(ValueError, match="hidden_act 'gelu'"):
        load_model(gelu)


def test_a_qwen3_moe_sparse_step_below_one_is_refused(random_qwen3_moe, tmp_path):
    zero = _copy_with_config(random_qwen3_moe, tmp_path / "step0", decoder_sparse_step=0)
    with pytest.raises(ValueError, match="decoder_sparse_step must be an integer >= 1"):
        load_model(zero)


def test_a_tensor_parallel_moe_engine_without_expert_parallel_is_refused_before_workers_start(random_mixtral):
    from minengine import LLM

    with pytest.raises(ValueError, match="tensor_parallel_size=2 on a mixtral model needs enable_expert_parallel=True"):
        LLM(random_mixtral, tensor_parallel_size=2, allow_cpu_oversubscription=True)


def test_a_checkpoint_missing_an_expert_is_a_clear_error(random_qwen3_moe, tmp_path):
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "broken"
    shutil.copytree(random_qwen3_moe, broken)
    state = load_file(str(broken / "model.safetensors"))
    del state["model.layers.2.mlp.experts.7.up_proj.weight"]
    save_file(state, str(broken / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model\.layers\.2: the checkpoint's up_proj experts .*missing \[7\]"):
        load_model(str(broken))


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_published_shapes_build_with_transformers_parameter_count(arch):
    """Mixtral-8x7B (transformers' default ``MixtralConfig``) and Qwen3-30B-A3B (its published config.json), built
    on the meta device: the same number of parameters as transformers' models, 46.7 B and 30.5 B."""
    from transformers import AutoModelForCausalLM, MixtralConfig, Qwen3MoeConfig

    from minengine.models.loader import _build_on_meta
    from minengine.models.registry import model_spec

    if arch == "mixtral":
        cfg, billions = MixtralConfig(), 46.7
    else:
        cfg, billions = Qwen3MoeConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                       moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                                       num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                                       norm_topk_prob=True, tie_word_embeddings=False), 30.5
    ours = _build_on_meta(cfg, Path("."), model_spec(cfg), None)
    with torch.device("meta"):
        theirs = AutoModelForCausalLM.from_config(cfg)
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    assert round(count / 1e9, 1) == billions
