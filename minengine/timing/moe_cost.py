"""What a mixture-of-experts layer costs a step: the experts its tokens hit, the hottest one, and the all-to-all.

A sparse layer holds ``E`` experts but a token runs through ``k``. So a decode step of a few tokens reads only the
experts those tokens chose, not all ``E``: a step of ``T`` tokens hits ``E (1 - (1 - k / E)^T)`` distinct experts
on average under uniform routing (``ModelShape.expected_experts_hit``), or exactly the experts with a token when
the step's routing is known (``expert_loads``: tokens per expert, one tuple per sparse layer). Each expert hit is
one GEMM of its own tokens: it reads the expert's weights once and computes ``2 x tokens x weights`` FLOPs, at the
same soft roofline as the dense GEMMs. So the bytes grow with the experts hit (a decode step's cost) and the FLOPs
with ``T x k`` (a prefill's).

Expert parallelism (EP; vLLM's ``enable_expert_parallel``) places whole experts on the ``tp`` ranks, ``E / tp``
each in contiguous ranges, instead of sharding every expert's width over them. A rank then runs only the tokens
routed to its experts, and the step waits for the busiest rank: when routing is unbalanced, the rank of the hottest
experts sets the layer's time (DeepSeek-V3's EPLB replicates hot experts for this reason). Tokens reach their
experts' ranks with an all-to-all (dispatch) and come back with another (combine): ``alltoall_bytes`` counts them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minengine.timing.expert_parallel import expected_all_to_all_bytes
from minengine.timing.model_shape import ModelShape


@dataclass(frozen=True)
class ExpertCost:
    """The expert GEMMs of one step over all sparse layers, on one GPU (under EP: the busiest rank, layer by layer).

    Attributes:
        flops: FLOPs; weight_bytes: expert weights read; act_bytes: activations in and out of the expert GEMMs.
        compute_time_s, memory_time_s: the two roofs alone (seconds).
        time_s: the soft-roofline time of every expert GEMM run, summed (seconds; no kernel floors).
        experts_hit: distinct experts run per sparse layer on that GPU, averaged over the layers.
        hottest_tokens: the most (token, expert) pairs one GPU ran in one layer.
    """

    flops: float = 0.0
    weight_bytes: float = 0.0
    act_bytes: float = 0.0
    compute_time_s: float = 0.0
    memory_time_s: float = 0.0
    time_s: float = 0.0
    experts_hit: float = 0.0
    hottest_tokens: float = 0.0


class ExpertPricer:
    """Prices ``ExpertCost``s for ``shape`` on one GPU of ``tp`` (the ``StepCostModel``'s rates, passed in).

    Args:
        shape: a MoE ``ModelShape``.
        tp: ranks; with ``expert_parallel`` the experts are placed whole, ``E / tp`` per rank, else each expert's
            width is split ``tp`` ways.
        peak, mfu, half_tokens: the GEMM peak (FLOP/s) and ``e(T) = mfu x T / (T + half_tokens)``.
        memory_rate: bytes/s the GEMMs stream weights at; weight_bytes, act_bytes: bytes per weight / activation.
        soft: the cost model's ``(compute, memory) -> seconds`` of one kernel.

    Raises:
        ValueError: a dense shape; ``expert_parallel`` with ``E`` not a multiple of ``tp``.
    """

    def __init__(self, shape: ModelShape, tp: int, expert_parallel: bool, peak: float, mfu: float,
                 half_tokens: float, memory_rate: float, weight_bytes: int, act_bytes: int, soft):
        if not shape.is_moe:
            raise ValueError(f"{shape.name} is not a mixture of experts (num_experts = 0)")
        self.ep = tp if expert_parallel else 1
        if shape.num_experts % self.ep:
            raise ValueError(f"expert parallelism over {tp} ranks needs num_experts ({shape.num_experts}) to be a "
                             "multiple of tp")
        self.shape, self._layers = shape, shape.sparse_layers
        mats = shape.expert_linear_shapes(1 if expert_parallel else tp)
        self._params = float(sum(k * n for k, n in mats))  # one expert on one GPU
        self._act = float(sum(k + n for k, n in mats) * act_bytes)  # per (token, expert) pair
        self._wb, self._peak, self._mfu, self._half = weight_bytes, peak, mfu, half_tokens
        self._rate, self._soft = memory_rate, soft

    def _run(self, hit: float, pairs: float) -> tuple[float, float, float]:
        """(compute s, memory s, soft s) of ``hit`` experts sharing ``pairs`` (token, expert) pairs equally."""
        if not hit or not pairs:
            return 0.0, 0.0, 0.0
        n = pairs / hit
        eff = self._mfu * n / (n + self._half) if self._half else self._mfu
        c = 2.0 * n * self._params / (self._peak * eff)
        m = (self._params * self._wb + n * self._act) / self._rate
        return hit * c, hit * m, hit * self._soft(c, m)

    def cost(self, num_tokens: int, expert_loads: Sequence[Sequence[int]] | None = None) -> ExpertCost:
        """The ``ExpertCost`` of a step of ``num_tokens`` tokens.

        Args:
            num_tokens: the step's new tokens (each routed to ``top_k`` experts in every sparse layer).
            expert_loads: the step's routing, when known: one sequence per sparse layer of ``num_experts`` token
                counts (tokens routed to each expert); ``None`` = uniform routing in expectation.

        Raises:
            ValueError: ``expert_loads`` of the wrong number of layers or experts, a negative count, or a layer
                whose counts do not add up to ``num_tokens x top_k`` (each named).
        """
        if expert_loads is None:
            per_layer = [self._uniform(num_tokens)] * self._layers
        else:
            self._check(num_tokens, expert_loads)
            per_layer = [self._busiest(layer) for layer in expert_loads]
        pairs = [r[4] for r in per_layer]
        hit = sum(r[3] for r in per_layer)
        return ExpertCost(flops=2.0 * self._params * sum(pairs), weight_bytes=hit * self._params * self._wb,
                          act_bytes=sum(pairs) * self._act, compute_time_s=sum(r[0] for r in per_layer),
                          memory_time_s=sum(r[1] for r in per_layer), time_s=sum(r[2] for r in per_layer),
                          experts_hit=hit / max(1, len(per_layer)), hottest_tokens=max(pairs, default=0.0))

    def _uniform(self, num_tokens: int) -> tuple[float, float, float, float, float]:
        """A layer under uniform routing: each rank gets ``1 / ep`` of the experts hit and of the pairs."""
        hit = self.shape.expected_experts_hit(num_tokens) / self.ep
        pairs = num_tokens * self.shape.top_k / self.ep
        return (*self._run(hit, pairs), hit, pairs)

    def _busiest(self, loads: Sequence[int]) -> tuple[float, float, float, float, float]:
        """A layer with known loads: each expert its own GEMM; the rank whose experts take longest sets it."""
        per_rank = self.shape.num_experts // self.ep
        best = (0.0, 0.0, 0.0, 0.0, 0.0)
        for r in range(self.ep):
            runs = [self._run(1, n) for n in loads[r * per_rank:(r + 1) * per_rank] if n]
            t = (sum(x[0] for x in runs), sum(x[1] for x in runs), sum(x[2] for x in runs), float(len(runs)),
                 float(sum(loads[r * per_rank:(r + 1) * per_rank])))
            if t[2] > best[2] or (t[2] == best[2] and t[4] > best[4]):
                best = t
        return best

    def _check(self, num_tokens: int, expert_loads: Sequence[Sequence[int]]) -> None:
        s = self.shape
        if len(expert_loads) != self._layers:
            raise ValueError(f"expert_loads has {len(expert_loads)} layers; {s.name} has {self._layers} sparse layers")
        for i, layer in enumerate(expert_loads):
            if len(layer) != s.num_experts:
                raise ValueError(f"expert_loads[{i}] has {len(layer)} counts; {s.name} has {s.num_experts} experts")
            if any(n < 0 for n in layer):
                raise ValueError(f"expert_loads[{i}] has a negative token count")
            if sum(layer) != num_tokens * s.top_k:
                raise ValueError(f"expert_loads[{i}] sums to {sum(layer)}, not num_tokens x top_k = "
                                 f"{num_tokens * s.top_k}")


def alltoall_bytes(shape: ModelShape, num_tokens: int, ep: int, remote_pairs: Sequence[int] | None = None) -> float:
    """Bytes one rank sends per step in expert parallelism's all-to-alls, over all sparse layers.

    Each (token, expert) pair whose expert lives on another rank sends the token's hidden state there (dispatch,
    ``hidden x activation_bytes``) and gets the expert's output back (combine, the same size). The step's tokens are
    taken as spread evenly over the ``ep`` ranks, each dispatching its own; under uniform routing a pair is remote
    with probability ``(ep - 1) / ep``, so one rank sends ``2 x layers x (T / ep) x k x (ep - 1) / ep x hidden x
    bytes`` (``timing/expert_parallel.expected_all_to_all_bytes``, which the engine's measured bytes are checked
    against, per layer and direction). ``remote_pairs`` (one count per sparse layer, all ranks together: the pairs
    whose expert is not on the rank that holds the token) replaces the expectation when the routing is known.

    Raises:
        ValueError: ``ep`` < 1, negative tokens, a dense shape, or ``remote_pairs`` of the wrong length.
    """
    if not shape.is_moe:
        raise ValueError(f"{shape.name} is not a mixture of experts (num_experts = 0)")
    if not isinstance(ep, int) or ep < 1 or num_tokens < 0:
        raise ValueError(f"ep must be a positive integer and num_tokens >= 0, got ep={ep!r}, num_tokens={num_tokens!r}")
    message = shape.hidden_size * shape.activation_bytes
    if remote_pairs is None:  # the engine's own count for even routing, all ranks together, one direction
        per_layer = expected_all_to_all_bytes(num_tokens, shape.top_k, shape.hidden_size, shape.activation_bytes, ep)
        return 2.0 * shape.sparse_layers * per_layer / ep
    if len(remote_pairs) != shape.sparse_layers:
        raise ValueError(f"remote_pairs has {len(remote_pairs)} layers; {shape.name} has {shape.sparse_layers}")
    return 2.0 * sum(remote_pairs) / ep * message


def alltoall_time(bytes_per_rank: float, num_alltoalls: int, bandwidth: float, latency_s: float) -> float:
    """Seconds of ``num_alltoalls`` all-to-alls moving ``bytes_per_rank`` in all out of one rank: ``count x
    latency + bytes / bandwidth`` (per-direction link bandwidth in bytes/s; the all-to-alls do not overlap the
    GEMMs, as the all-reduces do not).

    Raises:
        ValueError: a bandwidth that is not > 0, a negative latency, bytes or count.
    """
    if not bandwidth > 0 or latency_s < 0 or bytes_per_rank < 0 or num_alltoalls < 0:
        raise ValueError("bandwidth must be > 0 and latency_s, bytes_per_rank, num_alltoalls >= 0")
    return num_alltoalls * latency_s + bytes_per_rank / bandwidth
