"""Expert parallelism: a MoE layer whose E experts are split over the ranks, tokens sent to their experts' rank.

With ``enable_expert_parallel`` and ``tensor_parallel_size=N`` (vLLM's names) rank r holds experts
``[r E/N, (r+1) E/N)`` whole, instead of a slice of every expert. Attention and dense MLPs stay tensor-parallel
(``layers/linear.py``), so the hidden states entering a MoE layer are the same [T, H] on every rank. The layer:

1. **split**: rank r takes its share of the T tokens (``TensorParallelGroup.shard_range``: contiguous, the
   first T mod N ranks one more) and routes them (the router is replicated): [T_r, k] experts and weights.
2. **dispatch** (all-to-all): every (token, expert) pair's hidden row goes to the rank holding the expert. First
   one small all-to-all of counts (rank r tells rank j how many of its pairs chose each of j's experts: E/N
   int64 each), then the rows, sorted by expert, so a receiver knows which expert each row is for.
3. **experts**: each rank runs its experts on the rows it received (``layers/moe.grouped_linear``, one GEMM per
   projection and expert, as ``moe_grouped``; an expert's rows arrive in token order, as there).
4. **combine** (all-to-all): each output row goes back to the rank its token came from, which multiplies it by
   the gate weight and sums a token's k rows (the weights never travel).
5. **gather** (all-gather): every rank gets every rank's [T_r, H] outputs, the replicated [T, H] the next
   (tensor-parallel) attention needs.

A pair whose expert is on its own rank does not travel: with routing spread evenly, (N-1)/N of the T k rows of
[H] leave their rank in each direction (``timing/expert_parallel.py`` counts the bytes). Because attention is
tensor-parallel here, the receiver of a dispatched row already holds it; the dispatch is what expert parallelism
costs when each rank's tokens are its own (data-parallel attention, as DeepSeek-V3 is served), taught here on
tensor-parallel attention. vLLM with TP and EP but no data parallelism instead runs every token through the local
experts and all-reduces. ``gloo`` (CPU) and NCCL (CUDA) both run ``all_to_all_single`` with uneven splits.

Built by ``models/moe.MoeForCausalLM`` at construction when ``expert_parallel`` and the world size > 1; the
default step never enters this file.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minengine.distributed import TensorParallelGroup
from minengine.layers.moe import Experts, grouped_linear
from minengine.layers.moe_routing import route


def check_expert_split(num_experts: int, world_size: int) -> None:
    """Raise ``ValueError`` (naming ``enable_expert_parallel``) unless ``num_experts`` divides by ``world_size``."""
    if num_experts % world_size:
        raise ValueError(f"enable_expert_parallel: the model's {num_experts} experts must divide by "
                         f"tensor_parallel_size ({world_size}) (each rank holds E / N whole experts)")


class LocalExperts(Experts):
    """This rank's E/N experts, stacked as ``Experts`` (``gate_proj``, ``up_proj`` [E/N, I, H], ``down_proj``
    [E/N, H, I]); ``shard_weight`` cuts them from the checkpoint's [E, ...] tensors (``models/loader.py``).

    Raises:
        ValueError: E not divisible by the world size.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, tp: TensorParallelGroup):
        check_expert_split(num_experts, tp.world_size)
        self.num_local = num_experts // tp.world_size
        super().__init__(self.num_local, hidden_size, intermediate_size)
        self.first_expert = tp.rank * self.num_local

    def shard_weight(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's experts of the checkpoint's stacked tensor ``name`` [E, ...]."""
        return full.narrow(0, self.first_expert, self.num_local)


class ExpertParallelMoeBlock(nn.Module):
    """``SparseMoeBlock``'s x [T, H] -> [T, H] (the same arguments, plus ``tp``), with this rank's experts only
    and the tokens moved by all-to-all (the module docstring's five steps). Every rank must call it with the same
    x (replicated hidden states). ``gate`` is the router (replicated), ``experts`` a ``LocalExperts``.

    Raises:
        ValueError: E not divisible by the world size.
    """

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int, routing: str,
                 renormalize: bool, tp: TensorParallelGroup):
        super().__init__()
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = LocalExperts(num_experts, hidden_size, intermediate_size, tp)
        self.num_experts, self.top_k, self.routing, self.renormalize = num_experts, top_k, routing, renormalize
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start, end = self.tp.shard_range(x.shape[0])
        mine = x[start:end]  # this rank's tokens
        weights, ids = route(self.gate(mine), self.top_k, self.routing, self.renormalize)
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)  # the pairs by expert, so by the rank that holds it
        loads = torch.bincount(flat, minlength=self.num_experts)
        self.tp.expert_loads.append(loads.tolist())  # reported per step: they set what the all-to-alls move
        outputs = dispatch_and_combine(mine[order // self.top_k], loads, self.experts, self.tp)
        y = torch.empty_like(outputs)
        y[order] = outputs  # back to (token, slot) order, as moe_grouped
        y = y * weights.reshape(-1, 1).to(x.dtype)
        return gather_tokens(y.view(end - start, self.top_k, x.shape[1]).sum(dim=1), x.shape[0], self.tp)


def dispatch_and_combine(rows: torch.Tensor, loads: torch.Tensor, experts: LocalExperts,
                         tp: TensorParallelGroup) -> torch.Tensor:
    """rows [P, H]: this rank's (token, expert) pairs' hidden rows sorted by expert; loads [E] int64: how many
    pairs chose each expert. Returns [P, H]: each row through its expert (unweighted), in the same order."""
    ranks, local = tp.world_size, experts.num_local
    incoming = tp.all_to_all(loads, [local] * ranks, [local] * ranks)  # [N E/N]: rank j's pairs per expert of mine
    send = loads.view(ranks, local).sum(dim=1).tolist()
    recv = incoming.view(ranks, local).sum(dim=1).tolist()
    received = tp.all_to_all(rows, send, recv)
    out = run_local_experts(received, incoming.view(ranks, local), experts)
    return tp.all_to_all(out, recv, send)


def run_local_experts(rows: torch.Tensor, counts: torch.Tensor, experts: LocalExperts) -> torch.Tensor:
    """rows [R, H] received from the ranks in rank order, each rank's sorted by expert; counts [N, E/N] the rows
    from rank j for local expert e. Returns [R, H]: every row through its expert's SwiGLU, in the same order."""
    ranks, local = counts.shape
    expert_of_row = torch.arange(local, device=counts.device).repeat(ranks).repeat_interleave(counts.reshape(-1))
    order = torch.argsort(expert_of_row, stable=True)  # an expert's rows, in rank order, so in token order
    ends = counts.sum(dim=0).cumsum(0).to(torch.int32)
    sorted_rows = rows[order]
    gate = grouped_linear(sorted_rows, experts.gate_proj, ends)
    hidden = F.silu(gate) * grouped_linear(sorted_rows, experts.up_proj, ends)
    out = torch.empty_like(rows)
    out[order] = grouped_linear(hidden, experts.down_proj, ends)
    return out


def gather_tokens(mine: torch.Tensor, num_tokens: int, tp: TensorParallelGroup) -> torch.Tensor:
    """Every rank's [T_r, H] (``shard_range``'s split of ``num_tokens``) in rank order: [T, H] on every rank.
    Each rank's part is padded to the largest, ceil(T / N) rows (an all-gather takes equal shapes)."""
    width = -(-num_tokens // tp.world_size)
    parts = tp.all_gather(F.pad(mine, (0, 0, 0, width - mine.shape[0])))
    base, extra = divmod(num_tokens, tp.world_size)  # shard_range's split: the first ``extra`` ranks one more
    return torch.cat([part[:base + (rank < extra)] for rank, part in enumerate(parts)])
