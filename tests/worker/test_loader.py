"""Checkpoint loading: local directories, hub ids (through huggingface_hub), architectures, bad checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from minengine.models import loader
from minengine.models.loader import load_model, resolve_model_path


def test_hub_id_goes_through_snapshot_download(monkeypatch, random_llama):
    calls = {}

    def fake_download(repo_id, allow_patterns):  # stands in for the network only
        calls["repo_id"], calls["patterns"] = repo_id, allow_patterns
        return random_llama

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    model, cfg, path = load_model("Qwen/Qwen2.5-0.5B")
    assert calls["repo_id"] == "Qwen/Qwen2.5-0.5B" and "*.safetensors" in calls["patterns"]
    assert str(path) == random_llama and cfg.model_type == "llama"


def test_hub_failure_is_a_clear_error(monkeypatch):
    import huggingface_hub

    def offline(repo_id, allow_patterns):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ValueError, match="downloading it from the hub failed"):
        resolve_model_path("someone/some-model")
    with pytest.raises(ValueError, match="not a checkpoint directory"):
        resolve_model_path("/does/not/exist")


def test_weights_match_transformers(random_qwen2):
    from transformers import AutoModelForCausalLM

    ours, _, _ = load_model(random_qwen2)
    theirs = AutoModelForCausalLM.from_pretrained(random_qwen2, dtype=torch.float32)
    ref = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert torch.equal(p, ref[name]), name
    assert ours.lm_head.weight is ours.model.embed_tokens.weight  # tied


def test_unsupported_and_broken_checkpoints(random_llama, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(random_llama, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["model_type"] = "gpt2"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError):
        load_model(str(bad))
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(Path(random_llama) / "config.json", empty / "config.json")
    with pytest.raises(ValueError, match="weights"):
        loader.load_state_dict(empty)


def test_qwen3_matches_transformers(tmp_path):
    from transformers import Qwen3Config

    from minengine import LLM, SamplingParams
    from tests.conftest import _save_random_model, hf_greedy

    cfg = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                      tie_word_embeddings=False)
    path = _save_random_model(cfg, tmp_path / "qwen3", seed=3)
    prompts = [[(i * 13 + j) % 290 + 5 for j in range(n)] for i, n in enumerate([1, 17, 40, 100])]
    outs = LLM(path, max_num_batched_tokens=32).generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True),
        use_tqdm=False)
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == hf_greedy(path, tuple(p), 10)
