"""A sparse mixture-of-experts feed-forward layer (Shazeer et al. 2017; Mixtral, Jiang et al. 2024).

In place of one MLP, E expert MLPs (each the SwiGLU of ``models/llama.py``'s ``MLP``, smaller) and a router. Each
token runs through only the k experts the router picks for it (``layers/moe_routing.py``), and its output is the
sum of their outputs, each times its gate weight. A layer holds E experts' weights but a token pays for k.

Two implementations compute the same sum:

- ``moe_reference``: the definition, to step through. For each expert: find the tokens that chose it, run them
  through it, add the outputs, times their gate weights, back into those tokens' rows.
- ``moe_grouped``: what serving engines do (vLLM's fused MoE, transformers' ``grouped_mm`` experts). Sort the T*k
  (token, expert) pairs by expert once, so every expert's tokens are one contiguous run of rows; run the experts
  as one grouped GEMM per projection (on a GPU ``torch._grouped_mm``: one call for all E matrices instead of E
  launches; on the CPU one GEMM per non-empty run); undo the sort and sum each token's k rows. The sort replaces
  the reference's E scans of the routing table, which is what costs most when experts are many and tokens few
  (a decode step); the GEMMs themselves are the same.

``SparseMoeBlock.implementation`` names which one a layer runs ("grouped" unless set; ``tests/worker/
test_moe_layer.py`` checks they agree).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from minengine.layers.moe_routing import route


def expert_mlp(x: torch.Tensor, gate_proj: torch.Tensor, up_proj: torch.Tensor,
               down_proj: torch.Tensor) -> torch.Tensor:
    """One expert's SwiGLU on x [n, H]: down(silu(gate(x)) * up(x)); weights as ``nn.Linear``'s, [out, in]."""
    return F.linear(F.silu(F.linear(x, gate_proj)) * F.linear(x, up_proj), down_proj)


def moe_reference(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_proj: torch.Tensor,
                  up_proj: torch.Tensor, down_proj: torch.Tensor) -> torch.Tensor:
    """The MoE sum by its definition, one expert at a time.

    Args:
        x: [T, H] the tokens' hidden states.
        weights: [T, k] gate weights (float32); ids: [T, k] int64 expert ids (``route``'s output).
        gate_proj, up_proj: [E, I, H]; down_proj: [E, H, I]: expert e's weights are ``[e]``.

    Returns:
        [T, H] in x's dtype: row t = sum over its k slots j of weights[t, j] * expert_{ids[t, j]}(x[t]).
    """
    out = torch.zeros_like(x)
    for e in range(gate_proj.shape[0]):
        token, slot = torch.nonzero(ids == e, as_tuple=True)  # the tokens that chose e, and in which slot
        if token.numel() == 0:
            continue  # an expert no token chose costs nothing this step
        y = expert_mlp(x[token], gate_proj[e], up_proj[e], down_proj[e])
        out.index_add_(0, token, y * weights[token, slot, None].to(x.dtype))
    return out


def moe_grouped(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_proj: torch.Tensor,
                up_proj: torch.Tensor, down_proj: torch.Tensor) -> torch.Tensor:
    """The same sum as ``moe_reference`` (same arguments, same result up to float rounding), with the (token,
    expert) pairs sorted by expert so each projection is one grouped GEMM over all experts (``grouped_linear``)."""
    num_tokens, top_k = ids.shape
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)  # the T*k pairs, expert 0's first
    ends = torch.bincount(flat_ids, minlength=gate_proj.shape[0]).cumsum(0).to(torch.int32)
    rows = x[order // top_k]  # [T*k, H]: each pair's token, in expert order
    hidden = F.silu(grouped_linear(rows, gate_proj, ends)) * grouped_linear(rows, up_proj, ends)
    y = grouped_linear(hidden, down_proj, ends) * weights.reshape(-1)[order, None].to(x.dtype)
    unsorted = torch.empty_like(y)
    unsorted[order] = y  # back to (token, slot) order: row t*k + j is token t's j-th expert
    return unsorted.view(num_tokens, top_k, -1).sum(dim=1)


def grouped_linear(rows: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """rows [N, in] sorted by expert, weight [E, out, in], ends [E] int32 (expert e's rows end at ends[e]) ->
    [N, out]: each run of rows times its expert's weight, as ``F.linear``."""
    aligned = all(n * rows.element_size() % 16 == 0 for n in weight.shape[1:])  # its rows: 16-byte multiples
    if aligned and _use_grouped_mm(rows.device.type, rows.dtype):
        return torch._grouped_mm(rows, weight.transpose(1, 2), offs=ends)
    out = rows.new_empty(rows.shape[0], weight.shape[1])
    start = 0
    for e, end in enumerate(ends.tolist()):
        if end > start:  # an idle expert's empty run costs no call
            out[start:end] = F.linear(rows[start:end], weight[e])
        start = end
    return out


@functools.cache
def _use_grouped_mm(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``grouped_linear`` calls ``torch._grouped_mm``: not on the CPU, where torch's grouped GEMM is no
    faster than one GEMM per run; elsewhere where it gives the right numbers (``grouped_mm_works``)."""
    return device_type != "cpu" and grouped_mm_works(device_type, dtype)


def grouped_mm_works(device_type: str, dtype: torch.dtype) -> bool:
    """Whether this torch has ``torch._grouped_mm`` and it computes a tiny grouped product right on this device
    and dtype (older torch has no CPU kernel; on CUDA it depends on the GPU and the dtype)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    rows = torch.arange(32, dtype=torch.float32, device=device_type).view(4, 8).to(dtype)
    weight = torch.ones(2, 8, 8, dtype=dtype, device=device_type)  # rows of 16-byte multiples, as it requires
    ends = torch.tensor([1, 4], dtype=torch.int32, device=device_type)
    try:
        got = torch._grouped_mm(rows, weight.transpose(1, 2), offs=ends)
    except (RuntimeError, NotImplementedError):
        return False
    return bool(torch.equal(got.float().cpu(), rows.float().sum(1, keepdim=True).expand(4, 8).cpu()))


MOE_IMPLEMENTATIONS = {"reference": moe_reference, "grouped": moe_grouped}


class Experts(nn.Module):
    """E SwiGLU experts' weights, stacked: ``gate_proj``, ``up_proj`` [E, I, H], ``down_proj`` [E, H, I] (expert
    e's ``[e]`` is the [out, in] weight of its ``nn.Linear``)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.up_proj = nn.Parameter(torch.empty(num_experts, intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))


class SparseMoeBlock(nn.Module):
    """The MoE feed-forward of one decoder layer: x [T, H] -> [T, H].

    Args:
        hidden_size, intermediate_size: H, and I of each expert.
        num_experts, top_k: E experts, k of them per token.
        routing, renormalize: how router logits become gate weights (``layers/moe_routing.route``).

    ``gate`` is the router (the checkpoints' name), ``experts`` the stacked expert weights.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int, routing: str,
                 renormalize: bool = True):
        super().__init__()
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden_size, intermediate_size)
        self.top_k, self.routing, self.renormalize = top_k, routing, renormalize
        self.implementation = "grouped"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = route(self.gate(x), self.top_k, self.routing, self.renormalize)
        experts = self.experts
        return MOE_IMPLEMENTATIONS[self.implementation](x, weights, ids, experts.gate_proj, experts.up_proj,
                                                        experts.down_proj)
