"""StepCostModel: how long one engine step takes on a named hardware for a named model shape (a roofline).

A step computes, for every scheduled request, ``num_new_tokens`` tokens against ``context_len`` tokens already in
the KV cache, and runs the LM head and the sampler for ``num_sampled`` rows. From that alone (no tensors):

    FLOPs = 2 x layer params x tokens                                   (every linear layer, all new tokens)
          + sum over requests of 4 x layers x num_heads x head_dim x causal pairs    (QK^T and PV)
          + 2 x vocab x hidden x sampled rows                           (LM head, sampling rows only)
    bytes = layer weights (read once per step, shared by the whole batch; ``weight_dtype_bytes`` each)
          + LM head weights (when any row samples)
          + sum over requests of (context_len + num_new_tokens) x KV bytes per token   (attention reads K/V)
          + new tokens x KV bytes per token                             (K/V written)
          + embedding rows of the new tokens

    t = max(FLOPs / (peak x MFU), bytes / (bandwidth x MBU)) + all-reduces + swaps + overhead

Causal pairs of a chunk: new token i (0-based) attends to ``context_len + i + 1`` keys, so a chunk of ``n`` new
tokens after ``c`` cached ones has ``n x c + n (n + 1) / 2`` query-key pairs. Decode (n = 1) is memory-bound at
small batches because the weights are read for a handful of tokens; a long prefill is compute-bound. This is the
roofline analysis of LLM inference in e.g. Pope et al., "Efficiently Scaling Transformer Inference" (MLSys 2023),
and the prefill/decode split that Sarathi-Serve (Agrawal et al., OSDI 2024) schedules around.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) over ``tp`` GPUs splits FLOPs, weight bytes and KV heads
by ``tp`` and adds two all-reduces per layer (after attention and after the MLP) of ``tokens x hidden``
activations, each ``latency + 2 (tp - 1) / tp x bytes / (link bandwidth x efficiency)`` (ring all-reduce), not
overlapped with compute (as in vLLM). Swapping KV blocks (``blocks_to_swap_out/in``) moves
``blocks x block_size x KV bytes per token / tp`` bytes over the host link (PCIe) per GPU.

Activations other than the KV cache are not counted: at the sizes that matter they stay in on-chip memory
(fused kernels) or are small next to the weights. Attention kernels reach lower MFU than GEMMs; one ``mfu``
for the whole step is the simplification the validation table measures.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from minengine.timing.hardware import Hardware, get_hardware
from minengine.timing.model_shape import ModelShape, get_model_shape


@dataclass(frozen=True)
class RequestWork:
    """One scheduled request's share of a step.

    Attributes:
        num_new_tokens: tokens computed this step (a prefill chunk, 1 for a decode, 1 + k with k speculative
            tokens), >= 1.
        context_len: tokens already in the KV cache before the step (``ScheduledRequest.start_pos``), >= 0.
        num_sampled: rows whose logits go through the LM head and the sampler: 0 for an intermediate prefill
            chunk, 1 for a normal step, 1 + k when speculative decoding verifies k tokens.
    """

    num_new_tokens: int
    context_len: int = 0
    num_sampled: int = 1

    def __post_init__(self) -> None:
        for name, low in (("num_new_tokens", 1), ("context_len", 0), ("num_sampled", 0)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"RequestWork.{name} must be an integer >= {low}, got {v!r}")
        if self.num_sampled > self.num_new_tokens:
            raise ValueError(f"RequestWork.num_sampled ({self.num_sampled}) cannot exceed num_new_tokens "
                             f"({self.num_new_tokens})")

    @property
    def attention_pairs(self) -> int:
        """Causal query-key pairs: ``n x c + n (n + 1) / 2`` for ``n`` new tokens after ``c`` cached ones."""
        n, c = self.num_new_tokens, self.context_len
        return n * c + n * (n + 1) // 2


@dataclass(frozen=True)
class StepWork:
    """Everything one step computes: the scheduled requests, and KV blocks swapped out / in before it.

    Build one from a ``SchedulerOutput`` with ``StepWork.from_scheduler_output``, or by hand:
    ``StepWork.of([(512, 0, 1)] + [(1, 2000, 1)] * 10)`` (tuples are ``RequestWork`` fields in order).
    """

    requests: tuple[RequestWork, ...] = ()
    num_swap_out_blocks: int = 0
    num_swap_in_blocks: int = 0

    @classmethod
    def of(cls, requests: Iterable[RequestWork | tuple[int, ...]], num_swap_out_blocks: int = 0,
           num_swap_in_blocks: int = 0) -> StepWork:
        """From ``RequestWork``s or ``(num_new_tokens, context_len[, num_sampled])`` tuples.

        Raises:
            ValueError: as ``RequestWork``; negative block counts.
        """
        reqs = tuple(r if isinstance(r, RequestWork) else RequestWork(*r) for r in requests)
        if min(num_swap_out_blocks, num_swap_in_blocks) < 0:
            raise ValueError("swap block counts must be >= 0")
        return cls(reqs, num_swap_out_blocks, num_swap_in_blocks)

    @classmethod
    def from_scheduler_output(cls, scheduler_output) -> StepWork:
        """The work of a ``SchedulerOutput``: per ``ScheduledRequest`` its ``num_new_tokens``, its ``start_pos``
        (the context before the step) and its sampled rows (``num_sampled`` if the scheduler sets one, e.g.
        for speculative decoding, else 1 when ``sample`` else 0), plus the swap block lists."""
        reqs = tuple(RequestWork(s.num_new_tokens, s.start_pos, int(getattr(s, "num_sampled", int(s.sample))))
                     for s in scheduler_output.scheduled)
        return cls(reqs, len(scheduler_output.blocks_to_swap_out), len(scheduler_output.blocks_to_swap_in))

    @classmethod
    def from_step_trace(cls, step_trace) -> StepWork:
        """The work of a recorded ``StepTrace`` (its ``chunks``: ``num_tokens``, ``start_pos``, ``sampled``; its
        swapped block counts), e.g. to re-time a recorded run under another hardware or model shape. A trace
        records whether a row sampled, not how many rows: one per sampling chunk."""
        reqs = tuple(RequestWork(c.num_tokens, c.start_pos, int(c.sampled)) for c in step_trace.chunks)
        return cls(reqs, step_trace.num_swapped_out_blocks, step_trace.num_swapped_in_blocks)

    @property
    def num_tokens(self) -> int:
        """New tokens of the step (what the token budget counts)."""
        return sum(r.num_new_tokens for r in self.requests)

    @property
    def num_sampled(self) -> int:
        """Rows that go through the LM head and the sampler."""
        return sum(r.num_sampled for r in self.requests)

    @property
    def is_empty(self) -> bool:
        return not self.requests and not self.num_swap_out_blocks and not self.num_swap_in_blocks


@dataclass(frozen=True)
class StepCost:
    """The modelled duration of one step and why. Seconds, FLOPs and bytes are per GPU (after the TP split).

    Attributes:
        time_s: the step's duration: ``combine(compute, memory) + communication + swap + overhead``.
        compute_time_s: ``flops / (peak x mfu)``.
        memory_time_s: ``bytes / (bandwidth x mbu)``.
        communication_time_s: tensor-parallel all-reduces (0 with ``tp == 1``).
        swap_time_s: KV blocks over the host link.
        overhead_s: fixed per-step plus per-request overhead.
        flops: FLOPs per GPU; ``linear_flops + attention_flops + lm_head_flops``.
        bytes: device-memory bytes per GPU; ``weight_bytes + kv_bytes + other_bytes``.
        communication_bytes: bytes each GPU sends in all-reduces.
        bound: "compute", "memory" or "communication": the largest of the three times (what a figure
            names as the reason), "idle" for an empty step.
        num_tokens, num_requests, num_sampled: the step's size.
    """

    time_s: float
    compute_time_s: float
    memory_time_s: float
    communication_time_s: float
    swap_time_s: float
    overhead_s: float
    flops: float
    bytes: float
    communication_bytes: float
    bound: str
    num_tokens: int
    num_requests: int
    num_sampled: int
    linear_flops: float = 0.0
    attention_flops: float = 0.0
    lm_head_flops: float = 0.0
    weight_bytes: float = 0.0
    kv_bytes: float = 0.0
    other_bytes: float = 0.0

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte of the step (compare with the hardware's ``peak / bandwidth`` ridge point)."""
        return self.flops / self.bytes if self.bytes else 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class StepCostModel:
    """The roofline cost of engine steps on ``hardware`` for ``shape`` with ``tp``-way tensor parallelism.

    Args:
        hardware: a ``Hardware`` or a preset name ("h100", "h200", "a100", "l4", "rtx4090", "cpu").
        shape: a ``ModelShape``, a preset name ("llama-3-8b", "qwen2.5-7b", "llama-3-70b", "bundled") or a
            checkpoint path.
        tp: tensor-parallel degree (1, 2, 4, 8...): FLOPs, weights and KV heads split over ``tp`` GPUs.
        block_size: tokens per KV block, to cost swapped blocks.

    Raises:
        ValueError: unknown presets, ``tp`` or ``block_size`` not a positive integer.

    Example: ``StepCostModel("h100", "llama-3-8b").cost(StepWork.of([(8000, 0, 1)] + [(1, 1000, 1)] * 10))``.
    """

    def __init__(self, hardware: Hardware | str, shape: ModelShape | str, tp: int = 1, block_size: int = 16):
        for name, v in (("tp", tp), ("block_size", block_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.hardware = get_hardware(hardware)
        self.shape = get_model_shape(shape)
        self.tp = tp
        self.block_size = block_size
        # Per-step constants (a fleet simulation costs millions of steps): the same expressions as in ``_cost``'s
        # docstring formulas, evaluated once, in the same order, so the floats are bit-identical.
        hw, m = self.hardware, self.shape
        kv_heads_per_gpu = -(-m.num_kv_heads // tp)  # KV heads are replicated when fewer than tp
        self._kv_share = kv_heads_per_gpu / m.num_kv_heads
        self._num_layer_params = m.num_layer_params
        self._lm_head_params = m.lm_head_params
        self._layer_weight_bytes = m.layer_weight_dtype_bytes  # weight-only int8: 1; the LM head keeps dtype_bytes
        self._linear_flops_per_token = 2.0 * m.num_layer_params
        self._attention_flops_per_pair = 4.0 * m.num_layers * m.q_size
        self._lm_head_flops_per_row = 2.0 * m.lm_head_params
        self._kv_bytes_per_token = m.kv_bytes_per_token
        self._embedding_bytes_per_token = m.hidden_size * m.dtype_bytes
        self._compute_rate = hw.peak_flops_for(m.dtype_bytes) * hw.mfu
        self._memory_rate = hw.memory_bandwidth * hw.mbu
        self._swap_block_bytes = self.block_size * m.kv_bytes_per_token

    @property
    def label(self) -> str:
        """For figure titles: "modelled: H100 SXM, Llama-3-8B shapes" (+ ", TP 4")."""
        tp = f", TP {self.tp}" if self.tp > 1 else ""
        return f"modelled: {self.hardware.name}, {self.shape.name} shapes{tp}"

    def __repr__(self) -> str:
        return f"StepCostModel({self.hardware.name!r}, {self.shape.name!r}, tp={self.tp})"

    def cost(self, work: StepWork | Sequence[RequestWork | tuple[int, ...]]) -> StepCost:
        """The modelled ``StepCost`` of one step (a ``StepWork``, or its requests as ``RequestWork``s / tuples).

        Raises:
            ValueError: as ``RequestWork``.
        """
        if not isinstance(work, StepWork):
            work = StepWork.of(work)
        reqs = work.requests
        return self._cost(sum(r.num_new_tokens for r in reqs), sum(r.num_sampled for r in reqs), len(reqs),
                          sum(r.attention_pairs for r in reqs), sum(r.context_len + r.num_new_tokens for r in reqs),
                          work.num_swap_out_blocks + work.num_swap_in_blocks)

    def cost_of(self, scheduler_output) -> StepCost:
        """The cost of the step a ``SchedulerOutput`` describes: the same numbers as
        ``cost(StepWork.from_scheduler_output(scheduler_output))``, without building the ``StepWork`` (what a
        ``ModelledClock`` calls every step)."""
        tokens = sampled = pairs = context = 0
        for s in scheduler_output.scheduled:
            n, c = len(s.token_ids), s.start_pos
            tokens += n
            sampled += int(getattr(s, "num_sampled", s.sample))
            pairs += n * c + n * (n + 1) // 2
            context += c + n
        return self._cost(tokens, sampled, len(scheduler_output.scheduled), pairs, context,
                          len(scheduler_output.blocks_to_swap_out) + len(scheduler_output.blocks_to_swap_in))

    def _cost(self, tokens: int, sampled: int, nreq: int, pairs: int, context: int, swap_blocks: int) -> StepCost:
        """The ``StepCost`` of a step of ``tokens`` new tokens over ``nreq`` requests, ``sampled`` LM-head rows,
        ``pairs`` causal query-key pairs, ``context`` = sum of (context before + new tokens) and ``swap_blocks``
        swapped KV blocks (the formulas in the module docstring)."""
        hw, tp = self.hardware, self.tp
        linear_flops = self._linear_flops_per_token * tokens / tp
        attention_flops = self._attention_flops_per_pair * pairs / tp
        lm_head_flops = self._lm_head_flops_per_row * sampled / tp
        flops = linear_flops + attention_flops + lm_head_flops

        weight_bytes = (self._num_layer_params * self._layer_weight_bytes
                        + (self._lm_head_params * self.shape.dtype_bytes if sampled else 0)) / tp
        kv_bytes = (context + tokens) * self._kv_bytes_per_token * self._kv_share
        other_bytes = tokens * self._embedding_bytes_per_token  # embedding rows (replicated)
        nbytes = weight_bytes + kv_bytes + other_bytes if tokens else 0.0

        compute = flops / self._compute_rate
        memory = nbytes / self._memory_rate
        comm, comm_bytes = self._allreduce_time(tokens, sampled)
        swap = swap_blocks * self._swap_block_bytes * self._kv_share / hw.host_link_bandwidth
        empty = nreq == 0 and swap_blocks == 0
        overhead = hw.step_overhead_s + hw.per_request_overhead_s * nreq if not empty else 0.0
        device = max(compute, memory) if hw.combine == "max" else compute + memory
        if tokens:
            bound = "memory" if memory > compute else "compute"  # ties: compute, as max() over the dict below
            if comm > (memory if memory > compute else compute):
                bound = "communication"
        else:
            bound = "idle"
        return StepCost(time_s=device + comm + swap + overhead, compute_time_s=compute, memory_time_s=memory,
                        communication_time_s=comm, swap_time_s=swap, overhead_s=overhead, flops=flops,
                        bytes=nbytes, communication_bytes=comm_bytes, bound=bound, num_tokens=tokens,
                        num_requests=nreq, num_sampled=sampled, linear_flops=linear_flops,
                        attention_flops=attention_flops, lm_head_flops=lm_head_flops, weight_bytes=weight_bytes,
                        kv_bytes=kv_bytes, other_bytes=other_bytes if tokens else 0.0)

    def _allreduce_time(self, tokens: int, sampled: int) -> tuple[float, float]:
        """Seconds and bytes sent per GPU for the step's all-reduces: two per layer over ``tokens x hidden``
        activations, plus one over the sampled rows' logits (vocabulary-parallel LM head)."""
        if self.tp == 1 or not tokens:
            return 0.0, 0.0
        hw, m, tp = self.hardware, self.shape, self.tp
        link = hw.interconnect_bandwidth or hw.host_link_bandwidth
        act_bytes = 2  # activations are reduced in 16-bit, also for FP8 weights
        messages = [tokens * m.hidden_size * act_bytes] * (2 * m.num_layers)
        if sampled:
            messages.append(sampled * m.vocab_size * act_bytes)
        ring = 2 * (tp - 1) / tp
        sent = sum(ring * b for b in messages)
        return len(messages) * hw.allreduce_latency_s + sent / (link * hw.comm_efficiency), sent
