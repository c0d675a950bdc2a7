"""StepCostModel: how long one engine step takes on a named hardware for a named model shape.

A step computes, for every scheduled request, ``num_new_tokens`` tokens against ``context_len`` tokens already in
the KV cache, and runs the LM head and the sampler for ``num_sampled`` rows. From that alone (no tensors), per
GPU with ``tp``-way tensor parallelism, ``T`` new tokens, ``S`` sampled rows, ``L`` layers:

    GEMMs (per layer)   FLOPs 2 x T x W,  bytes W x ``layer_weight_dtype_bytes`` + T x (K + N summed) x 2
                        (W = the layer's GEMM weights on one GPU: ``ModelShape.linear_shapes(tp)``)
    attention (layer)   FLOPs 4 x heads / tp x head_dim x causal pairs,  bytes (context + 2 x new) x K/V bytes
    other kernels       bytes T x ``ModelShape.elementwise_bytes_per_token(tp)`` (norms, rotary, activation, add)
    LM head             FLOPs 2 x S x vocab x hidden / tp, bytes its weights + activations (when a row samples)
    embedding, norm     bytes 4 x T x hidden x 2

Each kernel group runs at a soft roofline: ``(c^k + m^k)^(1/k) + floor`` with ``c`` = FLOPs over the peak times
the group's efficiency (GEMMs: ``e(T) = mfu x T / (T + gemm_half_tokens)``; attention: ``attention_efficiency``
of the 16-bit peak) and ``m`` = bytes over the bandwidth times its efficiency; the groups run one after another,
so their times add (``combine="soft"``, the fitted GPU presets: ``minengine.timing.profile_fit`` fits ``k``, the
efficiencies and the floors on Vidur's kernel profiles). ``combine="max"`` is the classic whole-step roofline
``max(total compute, total memory)``, ``"sum"`` adds them (a fitted CPU). Then

    t = device time + all-reduces + swaps + engine overhead (``EngineProfile``: per step + per request)

Causal pairs of a chunk: new token i (0-based) attends to ``context_len + i + 1`` keys, so a chunk of ``n`` new
tokens after ``c`` cached ones has ``n x c + n (n + 1) / 2`` query-key pairs. Decode (n = 1) is memory-bound at
small batches because the weights are read for a handful of tokens; a long prefill is compute-bound. This is the
roofline analysis of LLM inference in e.g. Pope et al., "Efficiently Scaling Transformer Inference" (MLSys 2023),
and the prefill/decode split that Sarathi-Serve (Agrawal et al., OSDI 2024) schedules around; pricing each
operator from profiles is Vidur's method (Agrawal et al., MLSys 2024).

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) over ``tp`` GPUs splits FLOPs, weights and KV heads by
``tp`` (KV heads are replicated when fewer than ``tp``) and adds two all-reduces per layer (after the attention
output and the MLP down projections) of ``T x hidden`` activations, each ``latency + 2 (tp - 1) / tp x bytes /
bus bandwidth`` (ring), not overlapped with compute (as in vLLM), plus one all-gather of the sampled rows'
logits (vocabulary-parallel LM head). ``StepCostModel.allreduce_count_and_bytes`` says what a step charges.
Swapping KV blocks (``blocks_to_swap_out/in``) moves ``blocks x block_size x KV bytes per token / tp`` bytes
over the host link (PCIe) per GPU.

A mixture-of-experts shape (``ModelShape.num_experts > 0``) prices its sparse layers' MLP apart
(``minengine.timing.moe_cost``): the router is one more GEMM of the layer, and the experts are one GEMM per expert
the step's tokens hit (expected under uniform routing, or exactly from ``StepWork.expert_loads``), each at the soft
roofline, plus two grouped-GEMM kernel floors per sparse layer. With ``expert_parallel`` (``tp > 1``) whole experts
sit on ranks, the busiest rank sets each sparse layer's time, and the MLP all-reduce of a sparse layer becomes a
dispatch and a combine all-to-all (``StepCostModel.alltoall_count_and_bytes``) over the interconnect.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from minengine.timing.engine_profile import EngineProfile, get_engine
from minengine.timing.hardware import Hardware, get_hardware
from minengine.timing.model_shape import ModelShape, get_model_shape
from minengine.timing.moe_cost import ExpertPricer, alltoall_bytes


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

    ``expert_loads``: a MoE step's routing when it is known, tokens per expert, one tuple per sparse layer (checked
    against the shape by the cost model); ``None`` = uniform routing in expectation.
    """

    requests: tuple[RequestWork, ...] = ()
    num_swap_out_blocks: int = 0
    num_swap_in_blocks: int = 0
    expert_loads: tuple[tuple[int, ...], ...] | None = None

    @classmethod
    def of(cls, requests: Iterable[RequestWork | tuple[int, ...]], num_swap_out_blocks: int = 0,
           num_swap_in_blocks: int = 0, expert_loads: Iterable[Iterable[int]] | None = None) -> StepWork:
        """From ``RequestWork``s or ``(num_new_tokens, context_len[, num_sampled])`` tuples.

        Raises:
            ValueError: as ``RequestWork``; negative block counts.
        """
        reqs = tuple(r if isinstance(r, RequestWork) else RequestWork(*r) for r in requests)
        if min(num_swap_out_blocks, num_swap_in_blocks) < 0:
            raise ValueError("swap block counts must be >= 0")
        loads = None if expert_loads is None else tuple(tuple(int(n) for n in layer) for layer in expert_loads)
        return cls(reqs, num_swap_out_blocks, num_swap_in_blocks, loads)

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
        time_s: the step's duration: device time + communication + swap + overhead.
        compute_time_s: FLOPs over the effective peaks, summed over kernel groups (the compute roof alone).
        memory_time_s: bytes over the effective bandwidths, summed over kernel groups (the memory roof alone).
        communication_time_s: tensor-parallel all-reduces and the logits all-gather (0 with ``tp == 1``).
        swap_time_s: KV blocks over the host link.
        overhead_s: the engine's (and a fitted CPU's) per-step plus per-request host time.
        flops: FLOPs per GPU; ``linear_flops + attention_flops + lm_head_flops``.
        bytes: device-memory bytes per GPU; ``weight_bytes + kv_bytes + other_bytes`` (other: activations in
            and out of the GEMMs, the norm / rotary / activation / residual kernels, embedding rows).
        communication_bytes: bytes each GPU sends in all-reduces and the logits all-gather.
        bound: "compute", "memory" or "communication": the largest of the three times (what a figure
            names as the reason), "idle" for an empty step.
        num_tokens, num_requests, num_sampled: the step's size.
        linear_time_s, attention_time_s, elementwise_time_s, lm_head_time_s: the device time by kernel group
            (elementwise includes the embedding and final norm); they add up to the device time.
        num_allreduces, allreduce_bytes: all-reduces charged and the sum of their message sizes (bytes).
        experts_hit: a MoE step's distinct experts run per sparse layer on one GPU (the busiest under EP); 0 dense.
        num_alltoalls, alltoall_bytes: expert parallelism's dispatch and combine all-to-alls and the bytes one
            rank sends in them (``StepCostModel.alltoall_count_and_bytes``).
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
    linear_time_s: float = 0.0
    attention_time_s: float = 0.0
    elementwise_time_s: float = 0.0
    lm_head_time_s: float = 0.0
    num_allreduces: int = 0
    allreduce_bytes: int = 0
    experts_hit: float = 0.0
    num_alltoalls: int = 0
    alltoall_bytes: float = 0.0

    @property
    def device_time_s(self) -> float:
        """Kernel time on the GPU: ``time_s`` minus communication, swap and host overhead."""
        return self.linear_time_s + self.attention_time_s + self.elementwise_time_s + self.lm_head_time_s

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte of the step (compare with the hardware's ``peak / bandwidth`` ridge point)."""
        return self.flops / self.bytes if self.bytes else 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class StepCostModel:
    """The cost of engine steps on ``hardware`` for ``shape`` with ``tp``-way tensor parallelism, run by ``engine``.

    Args:
        hardware: a ``Hardware`` or a preset name ("h100", "h200", "a100", "l4", "rtx4090", "cpu").
        shape: a ``ModelShape``, a preset name ("llama-3-8b", "qwen2.5-7b", "llama-3-70b", "llama-2-7b",
            "llama-2-70b", "bundled") or a checkpoint path.
        tp: tensor-parallel degree (1, 2, 4, 8...): FLOPs, weights and KV heads split over ``tp`` GPUs.
        block_size: tokens per KV block, to cost swapped blocks.
        engine: an ``EngineProfile`` or its name ("vllm", "cuda-graph", "none"); ``None`` = the hardware's
            ``default_engine`` ("vllm" for the GPU presets, "none" for the fitted CPU).
        expert_parallel: a MoE shape's experts placed whole on the ``tp`` ranks (``E / tp`` each) and reached by
            all-to-alls, instead of each expert's width split over them (vLLM's ``enable_expert_parallel``).

    Raises:
        ValueError: unknown presets, ``tp`` or ``block_size`` not a positive integer, ``expert_parallel`` for a
            dense shape or with ``num_experts`` not a multiple of ``tp``.

    Example: ``StepCostModel("h100", "llama-3-8b").cost(StepWork.of([(8000, 0, 1)] + [(1, 1000, 1)] * 10))``.
    """

    def __init__(self, hardware: Hardware | str, shape: ModelShape | str, tp: int = 1, block_size: int = 16,
                 engine: EngineProfile | str | None = None, expert_parallel: bool = False):
        for name, v in (("tp", tp), ("block_size", block_size)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.hardware = get_hardware(hardware)
        self.shape = get_model_shape(shape)
        self.engine = get_engine(self.hardware.default_engine if engine is None else engine)
        self.tp = tp
        self.block_size = block_size
        # Per-step constants (a fleet simulation costs millions of steps), evaluated once.
        hw, m, eng = self.hardware, self.shape, self.engine
        kv_heads_per_gpu = -(-m.num_kv_heads // tp)  # KV heads are replicated when fewer than tp
        self._kv_share = kv_heads_per_gpu / m.num_kv_heads
        mats = m.linear_shapes(tp)
        wb, ab = m.layer_weight_dtype_bytes, m.activation_bytes  # weight-only int8: 1; the LM head keeps dtype_bytes
        self._layers = m.num_layers
        self._gemm_params = float(sum(k * n for k, n in mats))  # one layer's GEMM weights on one GPU
        self._gemm_act_bytes = float(sum(k + n for k, n in mats) * ab)  # activations in and out per token
        self._gemm_weight_bytes = self._gemm_params * wb
        self._lm_head_params = m.vocab_size * m.hidden_size / tp
        self._lm_head_weight_bytes = self._lm_head_params * m.dtype_bytes
        self._lm_head_act_bytes = (m.hidden_size + m.vocab_size / tp) * ab
        self._attention_flops_per_pair = 4.0 * (m.num_heads // tp or 1) * m.head_dim  # per layer
        self._kv_bytes_per_token = m.kv_bytes_per_token * self._kv_share  # all layers, this GPU's heads
        self._elementwise_bytes_per_token = float(m.elementwise_bytes_per_token(tp))  # per layer
        self._embedding_bytes_per_token = 4.0 * m.hidden_size * ab  # embedding rows + final norm, read and write
        self._peak = hw.peak_flops_for(m.dtype_bytes)
        self._peak16 = hw.peak_flops_16bit
        fp8 = m.dtype_bytes == 1 and hw.peak_flops_8bit is not None
        self._mfu, self._half = hw.mfu * (hw.fp8_gemm_factor if fp8 else 1.0), hw.gemm_half_tokens
        self._memory_rate = hw.memory_bandwidth * hw.mbu
        self._elementwise_rate = hw.memory_bandwidth * (hw.elementwise_efficiency or hw.mbu)
        self._attention_rate = self._peak16 * (hw.attention_efficiency or hw.mfu)
        self._kv_rate = hw.memory_bandwidth * (hw.attention_mbu or hw.mbu)
        self._k = float(hw.roofline_k)
        self._swap_block_bytes = self.block_size * m.kv_bytes_per_token
        self._step_overhead = hw.step_overhead_s + eng.step_overhead_s
        self._request_overhead = hw.per_request_overhead_s + eng.per_request_overhead_s
        self._ring = 2 * (tp - 1) / tp
        self._allreduce_rate = hw.allreduce_bandwidth
        self._allreduce_message_per_token = m.hidden_size * ab
        if expert_parallel and not m.is_moe:
            raise ValueError(f"expert_parallel needs a mixture-of-experts shape; {m.name} is dense")
        self.expert_parallel = expert_parallel and tp > 1
        self._experts = self._moe_layers(m, tp, wb, ab) if m.is_moe else None

    def _moe_layers(self, m: ModelShape, tp: int, wb: int, ab: int) -> ExpertPricer:
        """Make a layer's GEMMs (and their elementwise kernels) the average over dense and sparse layers, less
        the experts: attention on every layer, the dense MLP on the dense ones, the router (replicated on every
        rank) on the sparse ones. The experts are priced per step by the returned ``ExpertPricer``."""
        sparse, dense = m.sparse_layers, m.num_layers - m.sparse_layers
        attention, mlp = m.attention_linear_shapes(tp), m.linear_shapes(tp)[2:]
        router = ((m.hidden_size, m.num_experts),)

        def params(mats):
            return float(sum(k * n for k, n in mats))

        def acts(mats):
            return float(sum(k + n for k, n in mats) * ab)

        self._gemm_params = params(attention) + (dense * params(mlp) + sparse * params(router)) / m.num_layers
        self._gemm_act_bytes = acts(attention) + (dense * acts(mlp) + sparse * acts(router)) / m.num_layers
        self._gemm_weight_bytes = self._gemm_params * wb
        width = m.expert_width if self.expert_parallel else m.expert_width // tp
        silu = 3 * (dense * (m.intermediate_size // tp) + sparse * m.top_k * width) / m.num_layers * ab
        self._elementwise_bytes_per_token += silu - 3 * (m.intermediate_size // tp) * ab  # SiLU-and-mul's rows
        return ExpertPricer(m, tp, self.expert_parallel, self._peak, self._mfu, self._half, self._memory_rate, wb, ab,
                            self._soft)

    @property
    def label(self) -> str:
        """For figure titles: "modelled: H100 SXM, Llama-3-8B shapes" (+ ", TP 4", or ", EP 4" with
        ``expert_parallel``; + the engine when it is not the hardware's default, e.g. ", cuda-graph engine")."""
        tp = f", {'EP' if self.expert_parallel else 'TP'} {self.tp}" if self.tp > 1 else ""
        eng = "" if self.engine == get_engine(self.hardware.default_engine) else f", {self.engine.name} engine"
        return f"modelled: {self.hardware.name}, {self.shape.name} shapes{tp}{eng}"

    def __repr__(self) -> str:
        return f"StepCostModel({self.hardware.name!r}, {self.shape.name!r}, tp={self.tp}, engine={self.engine.name!r})"

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
                          work.num_swap_out_blocks + work.num_swap_in_blocks, work.expert_loads)

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

    def cost_batch(self, batch: int, num_new_tokens: int, context_len: int = 0, num_sampled: int = 1) -> StepCost:
        """The cost of a step of ``batch`` identical requests (each ``RequestWork(num_new_tokens, context_len,
        num_sampled)``): the same numbers as ``cost([(num_new_tokens, context_len, num_sampled)] * batch)``,
        without building ``batch`` request objects (static-batch benchmarks, capacity sweeps).

        Raises:
            ValueError: ``batch`` < 1; the request fields as ``RequestWork``.
        """
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        r = RequestWork(num_new_tokens, context_len, num_sampled)
        return self._cost(batch * r.num_new_tokens, batch * r.num_sampled, batch, batch * r.attention_pairs,
                          batch * (r.context_len + r.num_new_tokens), 0)

    def allreduce_count_and_bytes(self, work: StepWork | Sequence[RequestWork | tuple[int, ...]]) -> tuple[int, int]:
        """The tensor-parallel all-reduces this model charges for one step: ``(count, total message bytes)``.

        ``count`` is ``2 x num_layers`` (one after each row-parallel projection: attention output, MLP down) when
        ``tp > 1`` and the step has tokens, else 0; every message is ``num_tokens x hidden_size x
        activation_bytes`` (``ModelShape.activation_bytes``: the model's dtype, at least 2), so the total is
        ``count x`` that. The logits all-gather of a vocabulary-parallel LM head is not an all-reduce and is not
        counted here (it is in ``communication_time_s``). What an engine's real collectives per step must equal.
        """
        if not isinstance(work, StepWork):
            work = StepWork.of(work)
        tokens = work.num_tokens
        if self.tp == 1 or not tokens:
            return 0, 0
        count = self._allreduce_count()
        return count, count * tokens * self._allreduce_message_per_token

    def alltoall_count_and_bytes(self, work: StepWork | Sequence[RequestWork | tuple[int, ...]],
                                 remote_pairs: Sequence[int] | None = None) -> tuple[int, float]:
        """Expert parallelism's all-to-alls this model charges for one step: ``(count, bytes one rank sends)``.

        ``count`` is ``2 x sparse layers`` (a dispatch and a combine) with ``expert_parallel`` and tokens in the
        step, else 0; the bytes are ``minengine.timing.moe_cost.alltoall_bytes`` (uniform routing, or the step's
        ``remote_pairs`` per sparse layer when given). What an engine's real dispatch and combine must move.
        """
        if not isinstance(work, StepWork):
            work = StepWork.of(work)
        if not self.expert_parallel or not work.num_tokens:
            return 0, 0.0
        return 2 * self.shape.sparse_layers, alltoall_bytes(self.shape, work.num_tokens, self.tp, remote_pairs)

    def _allreduce_count(self) -> int:
        """All-reduces per step with tokens: two per layer, less the sparse layers' MLP one under EP."""
        return 2 * self._layers - (self.shape.sparse_layers if self.expert_parallel else 0)

    def _soft(self, compute: float, memory: float) -> float:
        k = self._k
        if compute == 0.0 or memory == 0.0:
            return compute + memory
        return (compute ** k + memory ** k) ** (1.0 / k)

    def _cost(self, tokens: int, sampled: int, nreq: int, pairs: int, context: int, swap_blocks: int,
              expert_loads=None) -> StepCost:
        """The ``StepCost`` of a step of ``tokens`` new tokens over ``nreq`` requests, ``sampled`` LM-head rows,
        ``pairs`` causal query-key pairs, ``context`` = sum of (context before + new tokens), ``swap_blocks``
        swapped KV blocks and a MoE step's ``expert_loads`` (the formulas in the module docstring)."""
        hw, L = self.hardware, self._layers
        if tokens:
            eff = self._mfu * tokens / (tokens + self._half) if self._half else self._mfu
            g_c = 2.0 * tokens * self._gemm_params / (self._peak * eff)  # one layer
            g_m = (self._gemm_weight_bytes + tokens * self._gemm_act_bytes) / self._memory_rate
            e_m = tokens * self._elementwise_bytes_per_token / self._elementwise_rate
            a_c = self._attention_flops_per_pair * pairs / self._attention_rate
            kv_bytes = (context + tokens) * self._kv_bytes_per_token  # read context + new, write new
            a_m = kv_bytes / L / self._kv_rate
            x_m = tokens * self._embedding_bytes_per_token / self._elementwise_rate
        else:
            g_c = g_m = e_m = a_c = a_m = x_m = kv_bytes = 0.0
        if sampled:
            h_eff = self._mfu * sampled / (sampled + self._half) if self._half else self._mfu
            h_c = 2.0 * sampled * self._lm_head_params / (self._peak * h_eff)
            h_m = (self._lm_head_weight_bytes + sampled * self._lm_head_act_bytes) / self._memory_rate
        else:
            h_c = h_m = 0.0
        moe = self._experts.cost(tokens, expert_loads) if self._experts is not None and tokens else None
        compute = L * (g_c + a_c) + h_c + (moe.compute_time_s if moe else 0.0)
        memory = L * (g_m + e_m + a_m) + h_m + x_m + (moe.memory_time_s if moe else 0.0)
        if tokens:
            floors = (4 * hw.kernel_floor_s, hw.elementwise_floor_s, hw.attention_floor_s)
            head_floor = hw.kernel_floor_s if sampled else 0.0
            if moe:  # a sparse layer: QKV, output, router and two grouped expert GEMMs
                floors = (floors[0] + hw.kernel_floor_s * self.shape.sparse_layers / L, *floors[1:])
            if hw.combine == "soft":
                linear_t = L * (self._soft(g_c, g_m) + floors[0]) + (moe.time_s if moe else 0.0)
                attention_t = L * (self._soft(a_c, a_m) + floors[2])
                elementwise_t = L * (e_m + floors[1]) + x_m
                head_t = self._soft(h_c, h_m) + head_floor
            else:  # one roofline over the whole step ("max") or no overlap ("sum"), spread over the groups
                total = max(compute, memory) if hw.combine == "max" else compute + memory
                scale = total / (compute + memory) if compute + memory else 0.0
                linear_t = L * ((g_c + g_m) * scale + floors[0])
                linear_t += (moe.compute_time_s + moe.memory_time_s) * scale if moe else 0.0
                attention_t = L * ((a_c + a_m) * scale + floors[2])
                elementwise_t = L * (e_m * scale + floors[1]) + x_m * scale
                head_t = (h_c + h_m) * scale + head_floor
        else:
            linear_t = attention_t = elementwise_t = head_t = 0.0
        comm, comm_bytes, n_ar, ar_bytes, n_a2a, a2a_bytes = self._communication(tokens, sampled)
        swap = swap_blocks * self._swap_block_bytes * self._kv_share / hw.host_link_bandwidth
        empty = nreq == 0 and swap_blocks == 0
        overhead = self._step_overhead + self._request_overhead * nreq if not empty else 0.0
        if tokens:
            bound = "memory" if memory > compute else "compute"  # ties: compute
            if comm > (memory if memory > compute else compute):
                bound = "communication"
        else:
            bound = "idle"
        linear_flops = 2.0 * tokens * self._gemm_params * L + (moe.flops if moe else 0.0)
        attention_flops = self._attention_flops_per_pair * pairs * L
        lm_head_flops = 2.0 * sampled * self._lm_head_params
        weight_bytes = L * self._gemm_weight_bytes + (self._lm_head_weight_bytes if sampled else 0.0) if tokens else 0.0
        other_bytes = (tokens * (L * (self._gemm_act_bytes + self._elementwise_bytes_per_token)
                                 + self._embedding_bytes_per_token) + (sampled * self._lm_head_act_bytes))
        if moe:
            weight_bytes += moe.weight_bytes
            other_bytes += moe.act_bytes
        device = linear_t + attention_t + elementwise_t + head_t
        return StepCost(time_s=device + comm + swap + overhead, compute_time_s=compute, memory_time_s=memory,
                        communication_time_s=comm, swap_time_s=swap, overhead_s=overhead,
                        flops=linear_flops + attention_flops + lm_head_flops,
                        bytes=weight_bytes + kv_bytes + other_bytes if tokens else 0.0,
                        communication_bytes=comm_bytes, bound=bound, num_tokens=tokens, num_requests=nreq,
                        num_sampled=sampled, linear_flops=linear_flops, attention_flops=attention_flops,
                        lm_head_flops=lm_head_flops, weight_bytes=weight_bytes, kv_bytes=kv_bytes,
                        other_bytes=other_bytes if tokens else 0.0, linear_time_s=linear_t,
                        attention_time_s=attention_t, elementwise_time_s=elementwise_t, lm_head_time_s=head_t,
                        num_allreduces=n_ar, allreduce_bytes=ar_bytes, experts_hit=moe.experts_hit if moe else 0.0,
                        num_alltoalls=n_a2a, alltoall_bytes=a2a_bytes)

    def _communication(self, tokens: int, sampled: int) -> tuple[float, float, int, int, int, float]:
        """(seconds, bytes sent per GPU, all-reduce count, all-reduce message bytes, all-to-all count, all-to-all
        bytes) of the step's collectives: ``2 x layers`` all-reduces of ``tokens x hidden`` activations (the
        engine's own kernel below its size limit, else NCCL; under EP a sparse layer's MLP all-reduce is
        replaced by its dispatch and combine all-to-alls, each ``allreduce_latency_s`` plus its bytes over the
        interconnect per direction) and one all-gather of the sampled rows' logits (NCCL)."""
        if self.tp == 1 or not tokens:
            return 0.0, 0.0, 0, 0, 0, 0.0
        hw, eng, rate = self.hardware, self.engine, self._allreduce_rate
        count = self._allreduce_count()
        message = tokens * self._allreduce_message_per_token
        custom = eng.allreduce_latency_s is not None and message <= eng.custom_allreduce_max_bytes
        latency = eng.allreduce_latency_s if custom else hw.allreduce_latency_s
        sent = count * self._ring * message
        seconds = count * latency + sent / rate
        if sampled:
            logits = sampled * self.shape.vocab_size * self.shape.activation_bytes
            gathered = self._ring / 2 * logits  # all-gather: (tp - 1) / tp of the logits per GPU
            sent += gathered
            seconds += hw.allreduce_latency_s + gathered / rate
        n_a2a, a2a = self.alltoall_count_and_bytes(StepWork.of([(tokens, 0, 0)]))
        if n_a2a:
            sent += a2a
            seconds += n_a2a * hw.allreduce_latency_s + a2a / (hw.interconnect_bandwidth or hw.host_link_bandwidth)
        return seconds, sent, count, count * message, n_a2a, a2a
