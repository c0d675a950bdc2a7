"""Tensor parallelism across machines: ``distributed_executor_backend="external_launcher"`` joins the group through
torch.distributed's env:// rendezvous (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``: torchrun's
contract), so a rank may run on another host. Here two rank processes are started by hand on loopback with
exactly those variables (what ``torchrun`` or a person on each machine does); each runs the whole engine on its
shard, and their greedy tokens (float32, bundled model) equal TP 1's in this process. Missing or inconsistent
variables are ValueErrors naming them, before any weight is loaded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from minengine import LLM, SamplingParams
from minengine.config import EngineConfig
from minengine.entrypoints.server_process import child_env, free_port

PROMPTS = ["To be, or not to be, that is the question:", "Now is the winter of our discontent",
           "Friends, Romans, countrymen, lend me your ears;"]
SETTINGS = dict(max_model_len=256, num_kv_blocks=64, dtype="float32")
MAX_NEW = 16

RANK_SCRIPT = """
import json, sys
import torch.distributed as dist
from minengine import LLM, SamplingParams
llm = LLM(sys.argv[1], tensor_parallel_size=2, distributed_executor_backend="external_launcher",
          execute_model_timeout_s=60, **json.loads(sys.argv[2]))
attn = llm.llm_engine.model.model.layers[0].self_attn
outs = llm.generate(json.loads(sys.argv[3]), SamplingParams(temperature=0, max_tokens=int(sys.argv[4]),
                    ignore_eos=True), use_tqdm=False)
print(json.dumps({"rank": dist.get_rank(), "world_size": dist.get_world_size(), "num_heads": attn.num_heads,
                  "tokens": [o.outputs[0].token_ids for o in outs]}))
"""


def test_two_ranks_through_env_rendezvous_match_tp1(bundled_model):
    port = free_port()
    ranks = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, bundled_model, json.dumps(SETTINGS),
                               json.dumps(PROMPTS), str(MAX_NEW)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**child_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                                              "WORLD_SIZE": "2", "RANK": str(rank)})
             for rank in range(2)]
    results = []
    for proc in ranks:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-3000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    llm = LLM(bundled_model, **SETTINGS)
    total_heads = llm.llm_engine.hf_config.num_attention_heads
    expected = [o.outputs[0].token_ids for o in llm.generate(
        PROMPTS, SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True), use_tqdm=False)]
    for rank, result in enumerate(results):
        assert (result["rank"], result["world_size"]) == (rank, 2)
        assert result["num_heads"] == total_heads // 2  # a shard, not the whole model
        assert result["tokens"] == expected


def test_missing_or_inconsistent_rendezvous_variables_are_value_errors(bundled_model, monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="set MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK"):
        LLM(bundled_model, tensor_parallel_size=2, distributed_executor_backend="external_launcher")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ValueError, match=r"WORLD_SIZE \(4\) must equal tensor_parallel_size \(2\)"):
        LLM(bundled_model, tensor_parallel_size=2, distributed_executor_backend="external_launcher")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ValueError, match=r"RANK must be in 0..1, got 2"):
        LLM(bundled_model, tensor_parallel_size=2, distributed_executor_backend="external_launcher")
    with pytest.raises(ValueError, match="async_scheduling needs worker processes"):
        EngineConfig(tensor_parallel_size=2, distributed_executor_backend="external_launcher", async_scheduling=True)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(distributed_executor_backend="external_launcher", gpu_memory_utilization=0.5)


def test_serve_refuses_external_launcher(bundled_model, capsys):
    from minengine.__main__ import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve", bundled_model, "--tensor-parallel-size", "2", "--distributed-executor-backend",
              "external_launcher"])
    assert exit_info.value.code == 2
    assert "external_launcher is for offline runs" in capsys.readouterr().err
