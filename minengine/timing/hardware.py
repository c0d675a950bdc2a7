"""Hardware presets for the step cost model: datasheet peaks, and kernel efficiencies fitted on measured profiles.

A roofline (Williams et al., "Roofline", CACM 2009) needs two peaks, FLOP/s and bytes/s. A serving step never
reaches either, and near the ridge point a kernel is slower than the slower of the two: so each GPU preset
carries what its kernels were *measured* to reach, fitted by ``minengine.timing.profile_fit`` on Vidur's operator
profiles (Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM Inference", MLSys 2024; CUDA times
of every operator of Llama-2-7B / 70B and Llama-3-8B / 70B layers on A100 and H100 at 1 to 32,768 tokens and TP
1 to 8, and NCCL all-reduce times on DGX nodes; ``../shared/data/profiles/vidur``, MIT license):

- GEMMs: ``(c^k + m^k)^(1/k) + 4 x kernel_floor_s`` per layer (a soft roofline, ``k = roofline_k``), with
  ``c = FLOPs / (peak x e(T))``, ``e(T) = mfu x T / (T + gemm_half_tokens)`` for ``T`` tokens per GPU and
  ``m = bytes / (bandwidth x mbu)``. The fit drives ``gemm_half_tokens`` to 0 on both GPUs: the soft roofline
  and the per-kernel floor already give the efficiency by token count (measured, A100: 0.07 of peak at 16
  tokens, 0.44 at 128, 0.67 at 512, 0.74 at 4,096; fitted 0.07, 0.39, 0.63, 0.72. H100 measured 0.04, 0.28,
  0.62, 0.74; fitted 0.04, 0.25, 0.51, 0.71: the fit is pessimistic near the H100's ridge point, where the
  profiled power-of-two token counts run faster than their neighbours). GEMM rows within 3 % / 8 % (A100, median /
  90th percentile) and 5 % / 14 % (H100).
- The other kernels of a layer (norms, rotary, activation, residual): ``elementwise_floor_s + bytes /
  (bandwidth x elementwise_efficiency)``.
- All-reduce (NCCL, one node): ``allreduce_latency_s + 2 (n - 1) / n x bytes / allreduce_bus_bandwidth``.

Not in the profiles, so set from cited measurements instead:

- Attention (its own term, not priced at the GEMMs' efficiency): prefill at ``attention_efficiency = 0.35`` of
  the 16-bit peak (FlashAttention-2 reaches ~35 % of an H100, Shah et al., "FlashAttention-3", NeurIPS 2024;
  Vidur's A100 attention profile, microsoft/vidur ``data/profiling/a100/attention.csv`` @ e2d00e9, flash-attention
  backend, Llama-2-70B TP 2: a 1,024-token chunk on 3,072 cached tokens in 0.533 ms is 0.36 of the A100's peak),
  decode reading K/V at ``attention_mbu = 0.7`` of the bandwidth (same file: batches of 73 and 128 requests at
  ~1,450 cached tokens read 220 / 369 MB of K/V in 0.163 / 0.25 ms, 0.66 / 0.72 of 2,039 GB/s) plus
  ``attention_floor_s = 12 us`` per layer (same file: 12-15 us for a batch of one to 50 at 32 cached tokens).
- FP8 (1-byte shapes): the FP8 tensor peak at ``fp8_gemm_factor = 0.7`` of the 16-bit fitted ``mfu`` (no FP8
  profile; vLLM PR #17126's H100 GEMM benchmark, Llama-3.1-8B QKV shape N=6144 K=4096: at 256 tokens FP8 with
  activation quantization reaches 760.6 TFLOP/s = 0.38 of its peak where BF16 reaches 544.3 = 0.55, a ratio of
  0.70; at <= 128 tokens, where weight bytes dominate, the fractions are equal, as the roofline gives). Weight
  bytes halve; attention stays at the 16-bit peak (engines compute attention in 16-bit).
- H200: the H100's fitted fractions (same GH100 compute die; HBM3e instead of HBM3). L4 and RTX 4090 (Ada): the
  A100's fitted fractions, and over PCIe (no NVLink) an assumed 24 GB/s all-reduce bus bandwidth (0.75 of PCIe
  Gen4 x16 per direction) with the A100's NCCL latency. These are assumptions, not fits.

Datasheet figures are dense (no 2:4 sparsity) tensor-core peaks, in SI units (1 TB/s = 1e12 bytes/s):

- H100 SXM5 80 GB: 989.5 TFLOP/s BF16/FP16, 1,979 TFLOP/s FP8, 3.35 TB/s HBM3, NVLink 900 GB/s (450 GB/s per
  direction), PCIe Gen5 x16 128 GB/s (64 GB/s per direction). NVIDIA H100 Tensor Core GPU datasheet.
- H200 SXM 141 GB: compute as H100 SXM, 4.8 TB/s HBM3e, NVLink 900 GB/s, PCIe Gen5. NVIDIA H200 datasheet.
- A100 SXM4 80 GB: 312 TFLOP/s BF16/FP16 (no FP8), 2,039 GB/s HBM2e, NVLink 600 GB/s (300 per direction),
  PCIe Gen4 x16 64 GB/s (32 per direction). NVIDIA A100 Tensor Core GPU datasheet.
- L4 24 GB: 121 TFLOP/s BF16/FP16, 242.5 TFLOP/s FP8 (the datasheet's 242 / 485 are with sparsity), 300 GB/s
  GDDR6, PCIe Gen4 x16, no NVLink. NVIDIA L4 Tensor Core GPU datasheet.
- GeForce RTX 4090 24 GB: 165.2 TFLOP/s FP16 with FP32 accumulate, 330.3 TFLOP/s with FP16 accumulate,
  1,008 GB/s GDDR6X, PCIe Gen4 x16, no NVLink. NVIDIA Ada GPU Architecture whitepaper, table 2. FP8 is left out
  (the whitepaper's FP8 rates depend on the accumulator), so FP8 shapes use the 16-bit peak.

Accumulate precision changes the peak only on GeForce cards (data-center A100 / H100 / H200 / L4 run FP16 with
FP32 accumulate at the full rate): the RTX 4090 preset accumulates in FP16 (``accumulate="fp16"``), as the
engines most run on it do (llama.cpp's cuBLAS path, ExLlama); ``get_hardware("rtx4090").with_(accumulate="fp32")``
is PyTorch's default (what vLLM runs).

The per-step host cost of the *engine* (scheduling, input preparation, sampling, output processing) is not the
hardware's: it is an ``EngineProfile`` (``minengine.timing.engine_profile``; GPU presets default to "vllm").

The ``cpu`` preset is not a datasheet: its numbers were fitted by ``minengine.timing.calibrate`` on this
project's 2-core machine (1 torch thread, float32, bundled model; see ``CPU_CALIBRATION_NOTE``). Fit your own
with ``calibrate(engine).hardware``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

TERA = 1e12
GIGA = 1e9

COMBINE_MODES = ("max", "sum", "soft")
ACCUMULATE_MODES = ("fp32", "fp16")


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or CPU) as the step cost model sees it. Units: FLOP/s, bytes/s, bytes, seconds.

    Attributes:
        name: shown in figure titles ("H100 SXM").
        peak_flops: dense 16-bit (BF16/FP16) tensor peak with FP32 accumulate, FLOP/s.
        memory_bandwidth: device memory bandwidth, bytes/s.
        memory_bytes: device memory, bytes (for reference; the cost model does not check capacity).
        peak_flops_8bit: dense FP8 peak (FLOP/s) for 1-byte model shapes; ``None`` = use the 16-bit peak.
        fp8_gemm_factor: FP8 GEMMs reach this fraction of the 16-bit GEMMs' efficiency (``mfu``) of their own
            (FP8) peak, in (0, 1].
        peak_flops_fp16_accumulate: the 16-bit peak with FP16 accumulate where it differs (GeForce cards);
            ``None`` = ``peak_flops``.
        accumulate: "fp32" or "fp16": which 16-bit peak the GEMMs reach.
        interconnect_bandwidth: GPU-to-GPU bandwidth per direction (NVLink), bytes/s; 0 = over ``host_link``.
        host_link_bandwidth: host link per direction (PCIe), bytes/s: KV swap traffic.
        mfu: GEMM efficiency at large token counts (fraction of the peak), in (0, 1].
        gemm_half_tokens: tokens per GPU at which the GEMMs' compute efficiency is half of ``mfu``
            (``e(T) = mfu x T / (T + gemm_half_tokens)``), >= 0.
        mbu: fraction of the memory bandwidth a GEMM reaches streaming its weights, in (0, 1].
        roofline_k: the soft roofline's exponent, >= 1 (``combine="soft"`` only).
        combine: how a kernel's compute and memory times add up: "soft" (``(c^k + m^k)^(1/k)`` per kernel
            group, the fitted GPU presets), "max" (the classic whole-step roofline ``max(compute, memory)``) or
            "sum" (no overlap; what a fitted CPU model uses).
        kernel_floor_s: seconds each GEMM kernel takes beyond its roofline (launch ramp, tail), >= 0.
        elementwise_efficiency: bandwidth fraction of the norm / rotary / activation / residual kernels;
            ``None`` = ``mbu``.
        elementwise_floor_s: fixed seconds of those kernels per layer.
        attention_efficiency: fraction of the 16-bit peak attention reaches on causal pairs; ``None`` = ``mfu``.
        attention_mbu: bandwidth fraction of attention reading K/V; ``None`` = ``mbu``.
        attention_floor_s: fixed seconds of the attention kernel per layer.
        allreduce_latency_s: fixed seconds of one NCCL all-reduce (tensor parallelism only).
        allreduce_bus_bandwidth: ring bus bandwidth of an all-reduce (bytes/s: ``2 (n - 1) / n x bytes /
            time``); 0 = ``interconnect_bandwidth`` (or the host link without one).
        step_overhead_s, per_request_overhead_s: fixed seconds per step / per scheduled request measured *with*
            this hardware (the CPU fit, which times the engine itself); 0 for GPUs, whose host costs are the
            engine profile's.
        default_engine: the ``EngineProfile`` name a ``StepCostModel`` uses unless given one ("vllm" for the
            GPU presets, "none" for a fitted CPU and for a ``Hardware`` you build).
        source: where the figures come from.

    Raises:
        ValueError: a rate or efficiency that is not > 0 (efficiencies also <= 1), a negative overhead or
            floor, ``roofline_k`` < 1, an unknown ``combine`` or ``accumulate``.
    """

    name: str
    peak_flops: float
    memory_bandwidth: float
    memory_bytes: float = 0.0
    peak_flops_8bit: float | None = None
    fp8_gemm_factor: float = 1.0
    peak_flops_fp16_accumulate: float | None = None
    accumulate: str = "fp32"
    interconnect_bandwidth: float = 0.0
    host_link_bandwidth: float = 32 * GIGA
    mfu: float = 0.5
    gemm_half_tokens: float = 0.0
    mbu: float = 0.7
    roofline_k: float = 2.0
    combine: str = "max"
    kernel_floor_s: float = 0.0
    elementwise_efficiency: float | None = None
    elementwise_floor_s: float = 0.0
    attention_efficiency: float | None = None
    attention_mbu: float | None = None
    attention_floor_s: float = 0.0
    allreduce_latency_s: float = 25e-6
    allreduce_bus_bandwidth: float = 0.0
    step_overhead_s: float = 0.0
    per_request_overhead_s: float = 0.0
    default_engine: str = "none"
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("peak_flops", "memory_bandwidth", "host_link_bandwidth"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
                raise ValueError(f"Hardware.{name} must be a number > 0, got {v!r}")
        for name in ("peak_flops_8bit", "peak_flops_fp16_accumulate"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"Hardware.{name} must be > 0 or None, got {v!r}")
        for name in ("mfu", "mbu", "elementwise_efficiency", "attention_efficiency", "attention_mbu",
                     "fp8_gemm_factor"):
            v = getattr(self, name)
            if v is None and name not in ("mfu", "mbu"):
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v <= 1:
                raise ValueError(f"Hardware.{name} must be in (0, 1], got {v!r}")
        for name in ("memory_bytes", "interconnect_bandwidth", "step_overhead_s", "per_request_overhead_s",
                     "allreduce_latency_s", "allreduce_bus_bandwidth", "gemm_half_tokens", "kernel_floor_s",
                     "elementwise_floor_s", "attention_floor_s"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not v >= 0:
                raise ValueError(f"Hardware.{name} must be a number >= 0, got {v!r}")
        if not (isinstance(self.roofline_k, (int, float)) and self.roofline_k >= 1):
            raise ValueError(f"Hardware.roofline_k must be >= 1, got {self.roofline_k!r}")
        if self.combine not in COMBINE_MODES:
            raise ValueError(f"Hardware.combine must be one of {COMBINE_MODES}, got {self.combine!r}")
        if self.accumulate not in ACCUMULATE_MODES:
            raise ValueError(f"Hardware.accumulate must be one of {ACCUMULATE_MODES}, got {self.accumulate!r}")

    def peak_flops_for(self, dtype_bytes: int) -> float:
        """The GEMM peak for a model stored in ``dtype_bytes`` bytes per weight: FP8 (1 byte) uses
        ``peak_flops_8bit`` where the hardware has it; 16-bit uses the peak of its ``accumulate`` precision."""
        if dtype_bytes == 1 and self.peak_flops_8bit is not None:
            return self.peak_flops_8bit
        return self.peak_flops_16bit

    @property
    def peak_flops_16bit(self) -> float:
        """The 16-bit tensor peak at this preset's ``accumulate`` precision (what attention runs at)."""
        if self.accumulate == "fp16" and self.peak_flops_fp16_accumulate is not None:
            return self.peak_flops_fp16_accumulate
        return self.peak_flops

    @property
    def allreduce_bandwidth(self) -> float:
        """The all-reduce bus bandwidth in use (bytes/s)."""
        return self.allreduce_bus_bandwidth or self.interconnect_bandwidth or self.host_link_bandwidth

    def with_(self, **changes) -> Hardware:
        """A copy with some fields changed (e.g. ``H100.with_(mfu=0.6)``); validated like the constructor."""
        return dataclasses.replace(self, **changes)


# ---- fitted by minengine.timing.profile_fit on ../shared/data/profiles/vidur (regenerate: python -m
# minengine.timing.profile_fit; tests/timing/test_profile_fit.py checks these equal its output) --------------------
A100_KERNELS = dict(mfu=0.744, gemm_half_tokens=0.0, mbu=0.804, roofline_k=1.41, kernel_floor_s=5.3e-06,
                    elementwise_efficiency=0.502, elementwise_floor_s=1.04e-05, allreduce_latency_s=3.36e-05,
                    allreduce_bus_bandwidth=154e9)
H100_KERNELS = dict(mfu=0.783, gemm_half_tokens=0.0, mbu=0.894, roofline_k=1.2, kernel_floor_s=3.96e-06,
                    elementwise_efficiency=0.576, elementwise_floor_s=1.03e-05, allreduce_latency_s=2.26e-05,
                    allreduce_bus_bandwidth=324e9)
FITTED_FROM = {"a100": "a100", "h100": "h100"}  # preset -> profiled GPU whose fit it holds verbatim
# attention (not in the shared profiles; cited in the module docstring) and the fixed engine default
ATTENTION = dict(attention_efficiency=0.35, attention_mbu=0.7, attention_floor_s=12e-6)
GPU = dict(combine="soft", default_engine="vllm", **ATTENTION)
FP8_GEMM_FACTOR = 0.7  # vLLM PR #17126, H100 (module docstring)
PCIE_ALLREDUCE = dict(allreduce_latency_s=A100_KERNELS["allreduce_latency_s"], allreduce_bus_bandwidth=24e9)
_VIDUR = "kernel efficiencies fitted on Vidur's profiles (MLSys 2024)"

H100_SXM = Hardware(
    name="H100 SXM", peak_flops=989.5 * TERA, peak_flops_8bit=1979 * TERA, memory_bandwidth=3.35 * TERA,
    memory_bytes=80e9, interconnect_bandwidth=450 * GIGA, host_link_bandwidth=64 * GIGA, **GPU, **H100_KERNELS,
    fp8_gemm_factor=FP8_GEMM_FACTOR,
    source="NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989.5 TFLOP/s BF16 dense, 3.35 TB/s HBM3, NVLink 900 GB/s; "
           + _VIDUR + " (H100)")
H200 = Hardware(
    name="H200", peak_flops=989.5 * TERA, peak_flops_8bit=1979 * TERA, memory_bandwidth=4.8 * TERA,
    memory_bytes=141e9, interconnect_bandwidth=450 * GIGA, host_link_bandwidth=64 * GIGA, **GPU, **H100_KERNELS,
    fp8_gemm_factor=FP8_GEMM_FACTOR,
    source="NVIDIA H200 Tensor Core GPU datasheet (SXM): 989.5 TFLOP/s BF16 dense, 4.8 TB/s HBM3e, NVLink 900 GB/s; "
           + _VIDUR + " (the H100's: assumed)")
A100_80GB = Hardware(
    name="A100 80GB", peak_flops=312 * TERA, memory_bandwidth=2.039 * TERA, memory_bytes=80e9,
    interconnect_bandwidth=300 * GIGA, host_link_bandwidth=32 * GIGA, **GPU, **A100_KERNELS,
    source="NVIDIA A100 Tensor Core GPU datasheet (SXM4 80 GB): 312 TFLOP/s BF16 dense, 2,039 GB/s, NVLink 600 GB/s; "
           + _VIDUR + " (A100)")
L4 = Hardware(
    name="L4", peak_flops=121 * TERA, peak_flops_8bit=242.5 * TERA, memory_bandwidth=300 * GIGA, memory_bytes=24e9,
    interconnect_bandwidth=0.0, host_link_bandwidth=32 * GIGA, **GPU,
    **{**A100_KERNELS, **PCIE_ALLREDUCE}, fp8_gemm_factor=FP8_GEMM_FACTOR,
    source="NVIDIA L4 Tensor Core GPU datasheet: 121 TFLOP/s BF16 dense (242 with sparsity), 300 GB/s GDDR6; "
           + _VIDUR + " (the A100's: assumed)")
RTX_4090 = Hardware(
    name="RTX 4090", peak_flops=165.2 * TERA, peak_flops_fp16_accumulate=330.3 * TERA, accumulate="fp16",
    memory_bandwidth=1.008 * TERA, memory_bytes=24e9, interconnect_bandwidth=0.0, host_link_bandwidth=32 * GIGA,
    **GPU, **{**A100_KERNELS, **PCIE_ALLREDUCE},
    source="NVIDIA Ada GPU Architecture whitepaper: RTX 4090 330.3 TFLOP/s FP16 with FP16 accumulate (165.2 with "
           "FP32), 1,008 GB/s GDDR6X; " + _VIDUR + " (the A100's: assumed)")

CPU_CALIBRATION_NOTE = ("fitted by minengine.timing.calibrate on the project's 2-core x86_64 machine, 1 torch "
                        "thread, float32, bundled model (2026-12-01)")
# Effective rates of the bundled model's steps on that machine (see CPU_CALIBRATION_NOTE): a linear fit of
# measured step times to FLOPs, bytes, requests and a constant, with compute and memory time added ("sum").
# calibrate(LLMEngine.from_config(max_num_batched_tokens=512, max_num_seqs=32, num_kv_blocks=512,
# max_model_len=1024), repeats=7): prefills of 16-512 tokens, decode batches of 1-32 at 128-token contexts;
# R^2 0.96, worst relative error 18 % (the 512-token prefill), the other points within 7 %.
CPU = Hardware(
    name="CPU (2 cores, fitted)", peak_flops=83.5 * GIGA, memory_bandwidth=51.5 * GIGA, memory_bytes=24e9,
    host_link_bandwidth=51.5 * GIGA, mfu=1.0, mbu=1.0, step_overhead_s=1.18e-3, per_request_overhead_s=52e-6,
    allreduce_latency_s=0.0, combine="sum", source=CPU_CALIBRATION_NOTE)

HARDWARE: dict[str, Hardware] = {
    "h100": H100_SXM, "h200": H200, "a100": A100_80GB, "l4": L4, "rtx4090": RTX_4090, "cpu": CPU,
}
_ALIASES = {"h100-sxm": "h100", "h100_sxm": "h100", "a100-80gb": "a100", "a100_80gb": "a100", "4090": "rtx4090",
            "rtx-4090": "rtx4090"}


def get_hardware(name: str | Hardware) -> Hardware:
    """A preset by name (case-insensitive: "h100", "h200", "a100", "l4", "rtx4090", "cpu"), or a ``Hardware``
    as is.

    Raises:
        ValueError: an unknown name (the message lists the presets).
    """
    if isinstance(name, Hardware):
        return name
    if not isinstance(name, str):
        raise ValueError(f"hardware must be a preset name or a Hardware, got {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; presets: {', '.join(HARDWARE)}")
    return HARDWARE[key]
