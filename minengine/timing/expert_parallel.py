"""What expert parallelism moves per MoE layer: the bytes of the dispatch, the combine and the gather.

``layers/expert_parallel.py`` runs a MoE layer over N ranks in three collectives (its module docstring): an
all-to-all that dispatches each (token, expert) pair's hidden row [H] to the rank holding the expert (after a small
all-to-all of counts: E / N int64 to every other rank), an all-to-all that combines the outputs back, and an
all-gather of every rank's [ceil(T / N), H] outputs. A pair whose expert is on its own rank stays there. So for
one layer of T tokens, k experts each, over N ranks, with ``b`` bytes per activation element:

    dispatch (rank r)  rows of r's tokens whose expert is on another rank  x H x b  +  (N - 1) x E / N x 8
    combine  (rank r)  rows of other ranks' tokens whose expert is on r    x H x b
    gather             N x ceil(T / N) x H x b  (the gathered result, as ``TensorParallelGroup`` counts it)

``traffic_of_routing`` gives these exactly from a layer's routing (how many pairs each rank sent to each expert:
``TensorParallelGroup.expert_loads``), ``traffic_of_step`` summed over a step's MoE layers;
``expected_all_to_all_bytes`` the model's count when routing is spread
evenly over the experts: a fraction (N - 1) / N of the T k rows leaves its rank, T k H b (N - 1) / N bytes per
direction over all ranks (the counts not included). An unbalanced routing moves more or less than that and, worse,
makes the rank with the hottest experts set the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

COUNT_BYTES = 8  # the dispatch's counts are int64


@dataclass(frozen=True)
class ExpertParallelTraffic:
    """One rank's bytes for one MoE layer: ``dispatch_bytes`` and ``combine_bytes`` sent to the other ranks by
    its two all-to-alls (the dispatch's include the counts), ``gather_bytes`` of the all-gather's result."""

    dispatch_bytes: int
    combine_bytes: int
    gather_bytes: int

    @property
    def all_to_all_bytes(self) -> int:
        """Every all-to-all byte this rank sent (what ``TensorParallelGroup.all_to_all_bytes`` counts)."""
        return self.dispatch_bytes + self.combine_bytes


def traffic_of_routing(loads: Sequence[Sequence[int]], num_tokens: int, hidden_size: int,
                       dtype_bytes: int) -> list[ExpertParallelTraffic]:
    """Each rank's ``ExpertParallelTraffic`` for one MoE layer.

    Args:
        loads: N rows of E counts: ``loads[r][e]`` (token, expert) pairs of rank r's tokens routed to expert e
            (rank r holds experts ``[r E/N, (r+1) E/N)``).
        num_tokens: T, the layer's tokens over all ranks. hidden_size: H. dtype_bytes: bytes per activation.

    Returns:
        N ``ExpertParallelTraffic``, rank 0's first.
    Raises:
        ValueError: rows of different lengths, or E not divisible by N.
    """
    ranks, experts = len(loads), len(loads[0])
    if any(len(row) != experts for row in loads) or experts % ranks:
        raise ValueError(f"loads must be N rows of E counts with E divisible by N, got {[len(r) for r in loads]}")
    local = experts // ranks
    row_bytes = hidden_size * dtype_bytes
    gather = ranks * -(-num_tokens // ranks) * row_bytes
    out = []
    for r in range(ranks):
        mine = range(r * local, (r + 1) * local)
        sent = sum(n for e, n in enumerate(loads[r]) if e not in mine)
        returned = sum(loads[s][e] for s in range(ranks) if s != r for e in mine)
        out.append(ExpertParallelTraffic(sent * row_bytes + (ranks - 1) * local * COUNT_BYTES,
                                         returned * row_bytes, gather))
    return out


def traffic_of_step(loads_by_rank: Sequence[Sequence[Sequence[int]]], num_tokens: int, hidden_size: int,
                    dtype_bytes: int) -> list[ExpertParallelTraffic]:
    """Each rank's ``ExpertParallelTraffic`` summed over one step's MoE layers: ``loads_by_rank[r]`` is rank r's
    ``expert_loads`` of the step (one row of E counts per MoE layer, as its ``WorkerReply`` reports them); the
    other arguments as ``traffic_of_routing``'s. What each rank's all-to-all and MoE all-gather bytes of the step
    must equal. Raises ``ValueError`` as ``traffic_of_routing``, or when the ranks ran different numbers of layers."""
    layers = {len(loads) for loads in loads_by_rank}
    if len(layers) != 1:
        raise ValueError(f"every rank must report the same MoE layers, got {sorted(layers)} layers")
    per_layer = [traffic_of_routing([loads[i] for loads in loads_by_rank], num_tokens, hidden_size, dtype_bytes)
                 for i in range(layers.pop())]
    return [ExpertParallelTraffic(*(sum(getattr(t[r], name) for t in per_layer)
                                    for name in ("dispatch_bytes", "combine_bytes", "gather_bytes")))
            for r in range(len(loads_by_rank))]


def expected_all_to_all_bytes(num_tokens: int, top_k: int, hidden_size: int, dtype_bytes: int,
                              world_size: int) -> float:
    """The model's dispatch (or combine) bytes of one MoE layer, all ranks together, for routing spread evenly:
    ``T k H b (N - 1) / N`` (without the dispatch's counts). 0 at one rank."""
    return num_tokens * top_k * hidden_size * dtype_bytes * (world_size - 1) / world_size
