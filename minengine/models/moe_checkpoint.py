"""A MoE checkpoint's per-expert tensors, stacked into the layout of ``layers/moe.py``'s ``Experts``.

Released checkpoints (and transformers' ``save_pretrained``) store every expert as its own three linear layers:

- Mixtral: ``model.layers.{l}.block_sparse_moe.experts.{e}.w1`` / ``w3`` / ``w2`` ``.weight`` (gate / up / down),
  the router ``model.layers.{l}.block_sparse_moe.gate.weight``;
- Qwen3-MoE: ``model.layers.{l}.mlp.experts.{e}.gate_proj`` / ``up_proj`` / ``down_proj`` ``.weight``, the router
  ``model.layers.{l}.mlp.gate.weight``.

minengine holds one tensor per projection per layer, the experts stacked along a first axis (so one grouped GEMM
covers them): ``model.layers.{l}.mlp.experts.gate_proj`` [E, I, H], ``up_proj`` [E, I, H], ``down_proj``
[E, H, I], and the router at ``model.layers.{l}.mlp.gate.weight`` for both architectures.
"""

from __future__ import annotations

import re
from collections import defaultdict

import torch

# Mixtral's names for the three projections of an expert (Qwen3-MoE's are already minengine's)
_PROJECTION_NAMES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
_EXPERT = re.compile(r"^(model\.layers\.\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight$")


def stack_experts(state: dict[str, torch.Tensor], num_experts: int) -> dict[str, torch.Tensor]:
    """``state`` (a Mixtral or Qwen3-MoE checkpoint's tensors by name) with each layer's per-expert weights
    replaced by the stacked ``mlp.experts.{gate_proj, up_proj, down_proj}`` and Mixtral's ``block_sparse_moe``
    renamed ``mlp``; every other tensor is kept as it is. A name this does not recognise passes through, so the
    loader reports it as unexpected.

    Raises:
        ValueError: a layer's projection whose experts are not exactly 0 .. num_experts - 1 (the first missing
            or extra ones named), or whose experts' shapes differ.
    """
    out, experts = {}, defaultdict(dict)
    for name, tensor in state.items():
        match = _EXPERT.match(name)
        if match is None:
            out[name.replace(".block_sparse_moe.", ".mlp.")] = tensor
            continue
        layer, expert, projection = match.groups()
        experts[layer, _PROJECTION_NAMES.get(projection, projection)][int(expert)] = tensor
    for (layer, projection), by_expert in experts.items():
        missing = sorted(set(range(num_experts)) - set(by_expert))
        extra = sorted(set(by_expert) - set(range(num_experts)))
        if missing or extra:
            raise ValueError(f"{layer}: the checkpoint's {projection} experts are not 0..{num_experts - 1} "
                             f"(missing {missing[:5]}, extra {extra[:5]})")
        try:
            out[f"{layer}.mlp.experts.{projection}"] = torch.stack([by_expert[e] for e in range(num_experts)])
        except RuntimeError as exc:  # experts of different shapes
            raise ValueError(f"{layer}: the {projection} experts' shapes differ ({exc})") from None
    return out
