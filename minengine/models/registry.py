"""The model registry: which minengine class a checkpoint's ``model_type`` (its ``config.json``) builds.

Classes are named by module path and imported when a checkpoint of theirs loads (as vLLM's model registry does),
so a dense model never imports the mixture-of-experts files. A class's parameter names are the checkpoint's, except
where ``convert_checkpoint`` names the function that renames or restacks the checkpoint's tensors first.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch

LLAMA = "minengine.models.llama:LlamaForCausalLM"
MOE = "minengine.models.moe:MoeForCausalLM"
MOE_CHECKPOINT = "minengine.models.moe:checkpoint_to_model"


@dataclass(frozen=True)
class ModelSpec:
    """How one architecture loads.

    Attributes:
        model_class: "module:Class" of the ``nn.Module`` built (its constructor takes ``(hf_config, qkv_bias=,
            qk_norm=, tp=)``, as ``LlamaForCausalLM``'s).
        qkv_bias: q/k/v projections have biases (Qwen2). qk_norm: per-head RMSNorm on q and k (Qwen3).
        convert_checkpoint: "module:function" taking (checkpoint tensors by name, the transformers config) and
            returning the tensors by the class's parameter names; None: the names are the same.
        tensor_parallel: the model can be split over ``tensor_parallel_size`` ranks tensor-parallel alone (False
            for MoE: each expert's weights are not sharded).
        expert_parallel: the model takes ``enable_expert_parallel`` (MoE: its constructor's ``expert_parallel``;
            its experts split over the ranks, ``layers/expert_parallel.py``).
        quantizable: ``quantization="int8"`` covers every large weight of the model (False for MoE: its experts
            are not ``nn.Linear`` layers, so int8 would leave most of the weights in full precision).
        windowed_attention: a sliding window in the config is honoured (``models/windowed_llama.py``); False for
            MoE, whose configs with a window are refused.
    """

    model_class: str
    qkv_bias: bool = False
    qk_norm: bool = False
    convert_checkpoint: str | None = None
    tensor_parallel: bool = True
    expert_parallel: bool = False
    quantizable: bool = True
    windowed_attention: bool = True

    def model_cls(self) -> type:
        return _named(self.model_class)

    def convert(self, state: dict[str, torch.Tensor], hf_config) -> dict[str, torch.Tensor]:
        """The checkpoint's tensors under the model's parameter names."""
        if self.convert_checkpoint is None:
            return state
        return _named(self.convert_checkpoint)(state, hf_config)


def _named(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


MODEL_REGISTRY = {
    "llama": ModelSpec(LLAMA),
    "mistral": ModelSpec(LLAMA),
    "qwen2": ModelSpec(LLAMA, qkv_bias=True),
    "qwen3": ModelSpec(LLAMA, qk_norm=True),
    "mixtral": ModelSpec(MOE, convert_checkpoint=MOE_CHECKPOINT, tensor_parallel=False, expert_parallel=True,
                         quantizable=False, windowed_attention=False),
    "qwen3_moe": ModelSpec(MOE, qk_norm=True, convert_checkpoint=MOE_CHECKPOINT, tensor_parallel=False,
                           expert_parallel=True, quantizable=False, windowed_attention=False),
}


def model_spec(hf_config) -> ModelSpec:
    """The ``ModelSpec`` of a transformers config's ``model_type``.

    Raises:
        ValueError: a ``model_type`` minengine does not run (the message lists those it does).
    """
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in MODEL_REGISTRY:
        raise ValueError(f"model_type {model_type!r} is not supported; minengine runs {sorted(MODEL_REGISTRY)}")
    return MODEL_REGISTRY[model_type]
